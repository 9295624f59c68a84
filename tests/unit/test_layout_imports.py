"""The package layout: no import cycles between modules or between packages, dependencies point
down, small modules, no mixins.

The dependency direction (docs/architecture.md)::

    cli -> sim, integrations -> engine -> primary, transfer, tiers, policies -> keys, errors, plugins

Every ``import`` statement counts, wherever it is: module level, inside a function, or under
``TYPE_CHECKING`` (a cycle hidden in a function is still a cycle a refactor trips over). A dynamic
import by string (the plug-in registry's lazy built-ins) is data, not an edge.

A package is a directory: ``kvtier.tiers.redis.tier`` belongs to ``kvtier.tiers.redis``,
``kvtier.tiers.base`` to ``kvtier.tiers``. Each top-level module (``kvtier.keys``) is a unit of its
own, so the root package's lazy facade does not tie everything together.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "kvtier"

# package (first component under kvtier) -> packages it must never import.
FORBIDDEN = {
    low: {"engine", "sim", "cli", "integrations"}
    for low in (
        "tiers",
        "policies",
        "transfer",
        "keys",
        "config",
        "errors",
        "plugins",
        "primary",
        "codec",
    )
}
FORBIDDEN["engine"] = {"sim", "cli", "integrations"}
FORBIDDEN["sim"] = {"cli"}
FORBIDDEN["integrations"] = {"cli"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The most specific kvtier module ``name`` denotes (``kvtier.plugins.TIERS`` -> ``kvtier.plugins``)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(mod: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, node.module] if node.module else base_parts)
            else:
                base = node.module or ""
            names = [f"{base}.{a.name}" for a in node.names] or [base]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None and target != mod:
                found.add(target)
    return found


GRAPH = {mod: _imports(mod, path) for mod, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _area(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_walker_sees_every_kind_of_import(tmp_path: Path) -> None:
    # Guards the test itself: a function-level, a TYPE_CHECKING and a relative import are all found.
    src = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from kvtier.engine import Engine\n"
        "def f():\n    import kvtier.sim.trace\n"
        "from . import base\n"
    )
    tmp = tmp_path / "_walker_probe.py"  # outside src/: the module name alone places it
    tmp.write_text(src, encoding="utf-8")
    found = _imports("kvtier.tiers._walker_probe", tmp)
    assert {"kvtier.sim.trace", "kvtier.tiers.base"} <= found
    assert any(m == "kvtier.engine" or m.startswith("kvtier.engine.") for m in found)
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # Modules without a cycle can still tie their packages into one.
    modules = {"kvtier.p.a": {"kvtier.q.b"}, "kvtier.q.b": set(), "kvtier.q.c": {"kvtier.p.d"}}
    assert _cycles(_package_graph(modules, lambda m: m.rpartition(".")[0])) == [["kvtier.p", "kvtier.q"]]


def _package(mod: str) -> str:
    """The package ``mod`` belongs to (see the module doc); a top-level module is its own."""
    if MODULES[mod].name == "__init__.py":
        return mod
    parent = mod.rpartition(".")[0]
    return mod if parent == "kvtier" else parent


def _package_graph(graph: dict[str, set[str]], package: Callable[[str], str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        for dep in deps:
            if package(mod) != package(dep):
                out.setdefault(package(mod), set()).add(package(dep))
    return out


def test_no_import_cycles() -> None:
    assert _cycles(GRAPH) == []


def test_no_package_cycles() -> None:
    cycles = _cycles(_package_graph(GRAPH, _package))
    edges = sorted(
        f"{mod} -> {dep}"
        for cycle in cycles
        for mod, deps in GRAPH.items()
        for dep in deps
        if _package(mod) in cycle and _package(dep) in cycle and _package(mod) != _package(dep)
    )
    assert cycles == [], edges


def test_dependencies_point_down() -> None:
    wrong = sorted(
        f"{mod} -> {dep}"
        for mod, deps in GRAPH.items()
        for dep in deps
        if _area(dep) in FORBIDDEN.get(_area(mod), set())
    )
    assert wrong == []


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_modules_stay_small(mod: str) -> None:
    lines = MODULES[mod].read_text(encoding="utf-8").count("\n")
    assert lines <= 600, f"{mod} has {lines} lines; split it by concept"


def test_no_mixins_or_multiple_inheritance_in_engine_and_tiers() -> None:
    offenders: list[str] = []
    for mod, path in MODULES.items():
        if _area(mod) not in ("engine", "tiers"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [b for b in node.bases if not (isinstance(b, ast.Name) and b.id == "Generic")]
                if len(bases) > 1 or node.name.endswith("Mixin"):
                    offenders.append(f"{mod}.{node.name}")
    assert offenders == []
