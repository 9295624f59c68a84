"""Packaging: extras split so a user installs only what they use, each extra backed by code, and the
core wheel alone (numpy + xxhash) running the CLI in a fresh virtual environment.

The venv test builds the wheel from a copy of the tree, creates a real ``python -m venv`` and installs
the wheel with pip (numpy and xxhash from pip's configured index and cache); it is ``slow``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]

#: The module each extra's requirement is imported as.
IMPORT_NAME = {
    "rich": "rich", "pyyaml": "yaml", "matplotlib": "matplotlib", "prometheus_client": "prometheus_client",
    "redis": "redis", "boto3": "boto3", "torch": "torch", "transformers": "transformers",
    "msgspec": "msgspec", "packaging": "packaging", "mooncake_transfer_engine_non_cuda": "mooncake",
    "blake3": "blake3",
}  # fmt: skip
#: Extras whose code other engineers are adding now (remove an entry once its code is merged).
PENDING: set[str] = set()  # extras whose code is still on its way (none now)
META = {"dev", "all"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("-", "_")


def _imported_in_src(module: str) -> list[str]:
    pattern = re.compile(rf"^\s*(import {module}\b|from {module}[ .])", re.M)
    return [str(p.relative_to(ROOT)) for p in (ROOT / "src").rglob("*.py") if pattern.search(p.read_text())]


def test_cli_extra_is_light_and_plot_and_metrics_are_their_own() -> None:
    cli = {_name(r) for r in EXTRAS["cli"]}
    assert cli == {"rich", "pyyaml"}, "cli must not pull matplotlib (~65 MB with fonttools) or prometheus"
    assert {_name(r) for r in EXTRAS["plot"]} == {"matplotlib"}
    assert {_name(r) for r in EXTRAS["metrics"]} == {"prometheus_client"}
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert core == {"numpy", "xxhash"}


@pytest.mark.parametrize("extra", sorted(set(EXTRAS) - META))
def test_every_extra_has_code_that_uses_it(extra: str) -> None:
    for requirement in EXTRAS[extra]:
        module = IMPORT_NAME[_name(requirement)]
        if extra in PENDING and not _imported_in_src(module):
            pytest.xfail(f"extra {extra!r}: the code importing {module} is being added in another branch")
        assert _imported_in_src(module), (
            f"extra {extra!r} installs {requirement} but no module imports {module}"
        )


def test_install_hints_name_the_extra_that_installs_the_module() -> None:
    """``kvtier.errors.install_hint`` tells a user which extra to install: each module it knows is
    brought by a requirement of that very extra."""
    from kvtier.errors import EXTRA_OF_MODULE

    for module, extra in EXTRA_OF_MODULE.items():
        assert extra in EXTRAS, (module, extra)
        brought = {IMPORT_NAME.get(_name(r)) for r in EXTRAS[extra]}
        # botocore comes with boto3 (the s3 extra's requirement), not as a requirement of its own.
        assert module in brought or (module, extra) == ("botocore", "s3"), (module, extra, brought)


def test_all_holds_every_extra_the_test_suite_needs() -> None:
    (spec,) = EXTRAS["all"]
    included = set(re.fullmatch(r"kvtier\[(.*)\]", spec)[1].split(","))  # type: ignore[index]
    assert included == set(EXTRAS) - META - {"torch"} | {"dev"}, included
    # The test suite's optional imports (need_module(name, extra)) name extras that exist.
    named = set()
    for p in (ROOT / "tests").rglob("*.py"):
        named |= set(re.findall(r"need_module\(\"[a-z_]+\", \"([a-z]+)\"\)", p.read_text()))
    assert named <= set(EXTRAS), named - set(EXTRAS)


@pytest.mark.slow
def test_core_wheel_alone_runs_the_cli(tmp_path: Path) -> None:
    src = tmp_path / "src-copy"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp_path / "dist"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip_wheel, "-w", str(dist), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("kvtier-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
    py = venv / "bin" / "python"
    # No PYTHONPATH: the venv must import the installed wheel, not this checkout.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("KVTIER_")}
    install = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)]
    proc = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    probe = "import importlib.util as u; print([m for m in EXTRA_MODULES if u.find_spec(m)])"
    probe = probe.replace("EXTRA_MODULES", repr(("rich", "matplotlib", "prometheus_client", "yaml")))
    found = subprocess.run([str(py), "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]", "the core install pulled an extra"
    kvtier = str(venv / "bin" / "kvtier")
    runs = {
        "replay": [kvtier, "replay", "--simulate", "--limit", "200"],
        "check": [kvtier, "check"],
        "python -m": [str(py), "-m", "kvtier", "check", '{"secondary_tiers": [{"type": "example"}]}'],
    }
    out = {}
    for what, argv in runs.items():
        proc = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and proc.stderr == "", (what, proc.stdout, proc.stderr)
        out[what] = proc.stdout
    assert "block hit ratio" in out["replay"] and "(simulate, lru)" in out["replay"]
    assert out["check"].rstrip().endswith("OK") and "example0" in out["python -m"]
