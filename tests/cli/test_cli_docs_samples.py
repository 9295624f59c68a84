"""Docs that are true: every JSON sample and quoted figure in docs/ matches what the command prints
today; the metrics table lists exactly what is exported; no doc cites a README figure; benchmark
examples never present a single run; the fs.md example leaves no temporary directory.

Real ``kvtier`` subprocesses on the shipped trace; the doc text is parsed, never copied here.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
REPLAY_MD = DOCS / "replay.md"
#: Values that measure the machine: checked to exist, not compared.
MACHINE = {"elapsed_seconds", "engine_seconds", "refs_per_second"}


def kvtier(*args: str) -> Any:
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier", *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _decimals(x: float) -> int:
    text = repr(x)
    return len(text.split(".")[1]) if "." in text and "e" not in text else 0


def matches(shown: Any, actual: Any, path: str = "") -> list[str]:
    """Where ``shown`` (a doc sample) disagrees with ``actual``; floats compare to the digits shown."""
    if isinstance(shown, dict):
        if not isinstance(actual, dict):
            return [f"{path}: not an object"]
        out = []
        for k, v in shown.items():
            if k == "...":
                continue
            if k not in actual:
                out.append(f"{path}.{k}: not printed")
            elif k not in MACHINE:
                out += matches(v, actual[k], f"{path}.{k}")
        if "..." not in shown and set(actual) - set(shown):
            out.append(f"{path}: printed keys missing from the sample: {sorted(set(actual) - set(shown))}")
        return out
    if isinstance(shown, list):
        if not isinstance(actual, list) or len(shown) != len(actual):
            return [f"{path}: list differs in length"]
        return [
            m
            for i, (s, a) in enumerate(zip(shown, actual, strict=True))
            for m in matches(s, a, f"{path}[{i}]")
        ]
    if isinstance(shown, float) and isinstance(actual, int | float):
        ok = round(float(actual), _decimals(shown)) == shown
        return [] if ok else [f"{path}: doc {shown}, printed {actual}"]
    return [] if shown == actual else [f"{path}: doc {shown!r}, printed {actual!r}"]


def _json_samples(text: str) -> list[dict[str, Any]]:
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", text, flags=re.S)]


def test_matches_catches_a_stale_sample() -> None:
    # The check itself can fail: the sample that was in docs/replay.md before this test.
    old = {"tokens": 6617935, "cost": {"prefill_seconds": 661.8, "...": "..."}}
    actual = {"tokens": 144793823, "cost": {"prefill_seconds": 14479.3823, "saved_seconds": 1.0}}
    assert len(matches(old, actual)) == 2
    assert matches({"r": 0.0525}, {"r": 0.05245753}) == []
    assert matches({"r": 0.0524}, {"r": 0.05245753}) != []


def test_replay_json_sample_is_what_the_command_prints() -> None:
    (sample,) = _json_samples(REPLAY_MD.read_text())
    assert "kvtier replay --simulate --policy lru --capacity 1% --json" in REPLAY_MD.read_text()
    printed = kvtier("replay", "--simulate", "--policy", "lru", "--capacity", "1%", "--json")
    assert matches(sample, printed) == []
    assert set(printed) >= MACHINE
    # The figures quoted in "Replay semantics" are this run's.
    text = REPLAY_MD.read_text()
    assert f"**{100 * printed['hit_ratio']['block']:.4f} %** block hits" in text
    assert f"**{100 * printed['opt']['block']:.2f} %** at 1,827 blocks" in text
    assert f"ceiling is {100 * printed['infinite']['block']:.2f} % of block references" in text
    assert f"({100 * printed['infinite']['token']:.2f} % of input tokens)" in text


def test_default_stack_figures_are_what_simulate_prints(tmp_path: Path) -> None:
    from kvtier.sim.defaults import default_config

    m = re.search(r"both modes report ([\d.]+) %\s+block hits \(([\d.]+) % RAM, ([\d.]+) % disk\)",
                  REPLAY_MD.read_text())  # fmt: skip
    assert m, "the default-stack figures moved; update this test"
    cfg = tmp_path / "default.json"
    cfg.write_text(json.dumps(default_config(tmp_path / "fs0")))
    printed = kvtier("replay", "--simulate", "--config", str(cfg), "--json")
    tiers = {t["name"]: t["hit_ratio"] for t in printed["tiers"]}
    assert f"{100 * printed['hit_ratio']['block']:.2f}" == m[1]
    assert (f"{100 * tiers['primary']:.2f}", f"{100 * tiers['fs0']:.2f}") == (m[2], m[3])


def test_metrics_table_lists_exactly_the_exported_families() -> None:
    from kvtier.metrics import METRICS

    text = REPLAY_MD.read_text()
    section = text[text.index("## Metrics\n") : text.index("## `kvtier bench`")]
    rows = [r for r in section.splitlines() if r.startswith("| `kvtier_")]
    documented = {name for r in rows for name in re.findall(r"`(kvtier_[a-z0-9_]+)`", r.split("|")[1])}
    assert documented == {name for name, _, _ in METRICS}
    kinds = {name: kind for name, kind, _ in METRICS}
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        for name in re.findall(r"`(kvtier_[a-z0-9_]+)`", cells[0]):
            assert cells[1] == kinds[name], (name, cells[1])


def test_no_doc_cites_readme_figures_or_single_run_benchmarks() -> None:
    for doc in DOCS.glob("*.md"):
        text = doc.read_text()
        assert not re.search(r"README'?s? (\d|table|figure)", text), f"{doc.name} cites the README"
        for cmd in re.findall(r"^\$ (kvtier bench .*)$", text, flags=re.M):
            argv = shlex.split(cmd)
            repeats = int(argv[argv.index("--repeats") + 1]) if "--repeats" in argv else 3
            assert repeats >= 5, f"{doc.name}: `{cmd}` is too short a run to show"


def test_fs_doc_example_leaves_no_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / "fs.md").read_text(), flags=re.S)
    assert blocks
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for code in blocks:
        exec(compile(code, str(DOCS / "fs.md"), "exec"), {})
    assert list(tmp_path.iterdir()) == []
