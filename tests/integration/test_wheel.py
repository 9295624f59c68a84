"""The built wheel ships what plug-in authors import: kvtier.testing, py.typed, the entry points."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contains_the_conformance_suites_and_entry_points(tmp_path: Path) -> None:
    # Build from a copy: an in-tree build would write build/ and egg-info files into the checkout.
    src = tmp_path / "src-copy"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path / "dist"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip_wheel, "-w", str(out), str(src)], check=True, capture_output=True, text=True, timeout=300
    )
    (wheel,) = out.glob("kvtier-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    for module in ("__init__", "tier_contract", "policy_contract", "primary"):
        assert f"kvtier/testing/{module}.py" in names
    assert "kvtier/py.typed" in names and "kvtier/cli/check.py" in names
    assert "kvtier/plugins/__init__.py" in names
    assert "[kvtier.tiers]" in entry_points and "example = kvtier.tiers.example:ExampleTier" in entry_points
    assert "[console_scripts]" in entry_points and "kvtier = kvtier.cli.main:main" in entry_points
