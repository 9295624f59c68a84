"""Every example in docs/plugins.md runs: files are written, configs are checked, code is executed.

``# file: <path>`` blocks are written into a temporary project; ``json`` blocks are validated and put
through ``kvtier check`` (every tier round-trips a block); ``python`` blocks without a file name run in
a subprocess; the ``pyproject.toml`` block's entry points become a real installed distribution's
metadata (the ``entry_points.txt`` pip would write), read by ``importlib.metadata``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from kvtier.cli.check import check_config
from kvtier.config import load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(DOC.read_text())]


def file_name(body: str) -> str | None:
    first = body.splitlines()[0] if body else ""
    return first.removeprefix("# file: ").strip() if first.startswith("# file: ") else None


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The doc's files written out, importable, with the pyproject's entry points installed."""
    root = tmp_path / "project"
    root.mkdir()
    for _lang, body in blocks():
        name = file_name(body)
        if name is None:
            continue
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        if name == "pyproject.toml":
            project_table = tomllib.loads(body)["project"]
            info = root / f"{project_table['name'].replace('-', '_')}-{project_table['version']}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: {project_table['name']}\nVersion: {project_table['version']}\n"
            )
            lines = []
            for group, entries in project_table["entry-points"].items():
                lines.append(f"[{group}]")
                lines.extend(f"{k} = {v}" for k, v in entries.items())
                lines.append("")
            (info / "entry_points.txt").write_text("\n".join(lines))
    monkeypatch.syspath_prepend(str(root))
    return root


def test_doc_has_the_promised_examples() -> None:
    found = blocks()
    names = {file_name(b) for _, b in found}
    assert {"acme_kv/tiers.py", "acme_kv/policies.py", "acme_kv/specs.py", "pyproject.toml"} <= names
    configs = [json.loads(b) for lang, b in found if lang == "json"]
    assert any("module_path" in str(c.get("secondary_tiers")) for c in configs)
    assert any("cache_policy_module_path" in c for c in configs)
    assert any("spec_module_path" in c for c in configs)
    assert any(c.get("spec_name") == "acme-fast-first" for c in configs)  # entry-point spec


def test_every_json_example_passes_kvtier_check(project: Path) -> None:
    configs = [b for lang, b in blocks() if lang == "json"]
    assert len(configs) >= 7
    for text in configs:
        report = check_config(load_config(text))
        assert report["ok"], (text, report)
        # Nothing was silently replaced by a built-in: out-of-tree names resolved to acme_kv.
        raw = json.loads(text)
        if raw.get("eviction_policy", "lru") != "lru":
            assert report["policy"]["target"].startswith("acme_kv.policies:")
        if raw.get("spec_name", "tiering") not in ("tiering", "TieringOffloadingSpec"):
            assert report["spec"]["target"] == "acme_kv.specs:FastFirstSpec"
        for tier, entry in zip(report["tiers"], raw.get("secondary_tiers", []), strict=True):
            if entry["type"] != "example":
                assert tier["target"] == "acme_kv.tiers:MemoTier"


def test_spec_example_reorders_tiers(project: Path) -> None:
    spec_cfg = next(
        json.loads(b) for lang, b in blocks() if lang == "json" and json.loads(b).get("spec_module_path")
    )
    report = check_config(spec_cfg)
    assert [t["name"] for t in report["tiers"]] == ["example0", "MemoTier1"]


def test_python_examples_run(project: Path) -> None:
    snippets = [b for lang, b in blocks() if lang == "python" and file_name(b) is None]
    assert snippets
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(project), os.environ.get("PYTHONPATH")]))
    )
    for code in snippets:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stderr
    assert "MemoTier [('memo', 'registered')]" in proc.stdout


def test_conformance_example_passes(project: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "--rootdir", str(project), *sorted(str(p) for p in project.glob("test_*.py"))],
        capture_output=True, text=True, timeout=300, cwd=project,
        env=dict(os.environ, PYTHONPATH=str(project)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed is not None and int(passed[1]) >= 15  # both suites really ran


def test_first_example_with_the_real_cli(project: Path) -> None:
    text = next(b for lang, b in blocks() if lang == "json")
    cfg = project / "kvtier.json"
    cfg.write_text(text)
    env = dict(os.environ, PYTHONPATH=str(project))
    script = Path(sys.executable).with_name("kvtier")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "kvtier.cli.main"]
    proc = subprocess.run([*cmd, "check", str(cfg)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "acme_kv.tiers:MemoTier" in proc.stdout


def test_typo_in_doc_tier_is_reported_as_documented(project: Path) -> None:
    with pytest.raises(
        Exception, match=r"secondary_tiers\[0\]\.max_blokcs: unexpected option .*'max_blocks'"
    ):
        check_config(
            {"secondary_tiers": [{"type": "MemoTier", "module_path": "acme_kv.tiers", "max_blokcs": 1}]}
        )
