"""The engine package's shape: components never import the facade, no cycles, no mixins, one
definition of slot states and lookup codes, one write-policy object per tier."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier import primary
from kvtier.config import load_config
from kvtier.engine import Engine, LookupReport
from kvtier.engine.facade import Engine as FacadeEngine
from kvtier.engine.writes import AfterHits, WriteBack, WriteThrough, write_policies
from kvtier.errors import ConfigError
from kvtier.keys import BlockKey, LookupCode, LookupResult
from kvtier.primary import SlotState

ENGINE_DIR = pathlib.Path(__file__).parents[2] / "src" / "kvtier" / "engine"


def _module_name(path: pathlib.Path) -> str:
    return "kvtier.engine" if path.name == "__init__.py" else f"kvtier.engine.{path.stem}"


def _imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports: top-level, inside functions and under TYPE_CHECKING alike."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            assert node.module is not None
            out.add(node.module)
            # ``from kvtier.engine import facade`` names a module too.
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    paths = sorted(ENGINE_DIR.glob("*.py"))
    names = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p) & names for p in paths}


def test_components_never_import_the_facade() -> None:
    graph = _graph()
    offenders = {
        mod: sorted(deps & {"kvtier.engine", "kvtier.engine.facade"})
        for mod, deps in graph.items()
        if mod not in ("kvtier.engine", "kvtier.engine.facade")
    }
    assert {m: d for m, d in offenders.items() if d} == {}


def test_the_engine_modules_import_no_cycle() -> None:
    graph = _graph()
    done: set[str] = set()

    def visit(mod: str, path: list[str]) -> None:
        if mod in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(mod) :], mod]))
        if mod in done:
            return
        for dep in sorted(graph[mod]):
            visit(dep, [*path, mod])
        done.add(mod)

    for mod in sorted(graph):
        visit(mod, [])
    assert "kvtier.engine.facade" in done  # the walk saw the package


def test_no_mixins_and_no_module_over_600_lines() -> None:
    assert Engine is FacadeEngine and Engine.__bases__ == (object,)
    for path in sorted(ENGINE_DIR.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= 600, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert len(node.bases) <= 1, f"{path.name}: {node.name} has several bases"
                assert "Mixin" not in node.name, f"{path.name}: {node.name}"


def test_one_definition_of_lookup_codes_and_slot_states() -> None:
    assert [c.result for c in LookupCode] == list(LookupResult)
    assert [LookupCode.of(r) for r in LookupResult] == list(LookupCode)
    report_codes = (LookupReport.MISS, LookupReport.HIT, LookupReport.HIT_PENDING, LookupReport.RETRY)
    assert report_codes == tuple(LookupCode)
    consts = (primary._FREE, primary._WRITING, primary._READY, primary._FLUSHING)
    assert consts == (SlotState.FREE, SlotState.WRITING, SlotState.READY, SlotState.FLUSHING)
    # The derived constants are exact ints (the hot loops rely on CPython's int specialisation).
    assert {type(c) for c in consts} == {int}


@given(st.lists(st.sampled_from(list(LookupResult)), max_size=40))
def test_report_codes_and_results_agree(results: list[LookupResult]) -> None:
    from_results = LookupReport(0, list(results))
    assert list(from_results.codes) == [LookupCode.of(r) for r in results]
    from_codes = LookupReport(0, None, 0, from_results.codes)
    assert from_codes.results == results
    assert from_codes.hits == results.count(LookupResult.HIT)


@pytest.mark.parametrize(
    ("name", "cls"), [("write_through", WriteThrough), ("write_back", WriteBack), ("after_hits", AfterHits)]
)
def test_one_write_policy_object_per_tier(name: str, cls: type) -> None:
    policies = write_policies(name, 3, after_hits=2)
    assert [type(p) for p in policies] == [cls] * 3
    assert [p.tier for p in policies] == [0, 1, 2]
    assert len({id(p) for p in policies}) == 3
    assert [p.hits_to_copy for p in policies] == ([2] * 3 if cls is AfterHits else [0] * 3)


def test_an_unknown_write_policy_names_the_key_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"write_policy: expected one of write_through.*'sometimes'"):
        write_policies("sometimes", 1)
    # A config built by hand skips load_config's checks: the engine refuses it before building.
    bad = dataclasses.replace(load_config({"primary_backing": "none"}), write_policy="sometimes")
    with pytest.raises(ConfigError, match="write_policy"):
        Engine(bad)


def test_the_engine_builds_its_write_policies_from_the_config() -> None:
    cfg = {"cpu_bytes_to_use": 4 * 4096, "block_bytes": 4096, "secondary_tiers": [{"type": "example"}]}
    with Engine({**cfg, "write_policy": "after_hits", "write_after_hits": 3}) as e:
        assert [type(p) for p in e.writes.policies] == [AfterHits]
        assert e.writes.hits_to_copy == 3 and not e.writes.copies_on_commit and not e.writes.flush_dirty
    with Engine({**cfg, "primary_backing": "none"}) as e:  # simulation: no tiers, no policies
        assert e.writes.policies == [] and not e.writes.copies_on_commit
        e.access([BlockKey(b"k")])
        assert e.flush() == 0
