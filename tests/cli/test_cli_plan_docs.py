"""Every ``$ kvtier ...`` command in docs/plan.md runs, in order, in one directory holding the files
the page defines (``<!-- file: NAME -->`` blocks); the replay of the written stack reproduces the
plan's hit ratios exactly (the recommendation test on the whole trace is test_cli_plan.py)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from needs import need_module

need_module("rich", "cli")
need_module("matplotlib", "cli")

DOC = Path(__file__).parents[2] / "docs" / "plan.md"


def _text() -> str:
    """The page up to its fleet section (test_cli_plan_fleet_docs.py runs that one)."""
    return DOC.read_text().split("## Planning a fleet")[0]


def _commands() -> list[str]:
    blocks = re.findall(r"```console\n(.*?)```", _text(), flags=re.S)
    return [line[2:].strip() for b in blocks for line in b.splitlines() if line.startswith("$ kvtier ")]


def _files() -> dict[str, str]:
    return dict(re.findall(r"<!-- file: (\S+) -->\n```json\n(.*?)```", _text(), flags=re.S))


def test_doc_defines_files_and_commands() -> None:
    assert set(_files()) == {"llama-3-8b.json", "menu.json"}
    assert len(_commands()) == 6


@pytest.mark.slow
# A whole-trace plan and replay plus three short plans: minutes when the 2 cores are shared.
@pytest.mark.timeout(900)
def test_doc_commands_run_in_order(tmp_path: Path) -> None:
    for name, text in _files().items():
        json.loads(text)  # every file the page shows is valid JSON
        (tmp_path / name).write_text(text)
    outputs = []
    for command in _commands():
        argv = [sys.executable, "-m", "kvtier.cli.main", *shlex.split(command)[1:]]
        proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, f"{command}\n{proc.stderr}"
        outputs.append(proc.stdout)
    for png in ("plan-capacity.png", "plan-pareto.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    # The first command's table and the replay of the stack it wrote agree (the rounded figure the
    # page quotes; test_cli_plan.py checks every digit).
    replayed = json.loads(outputs[1])
    assert f"block hits {100 * replayed['hit_ratio']['block']:.2f}%" in outputs[0]
    target = json.loads(outputs[2])
    assert target["objective"] == {"kind": "target", "value": 0.3}
    assert target["recommendation"]["hit_ratio"]["block"] >= 0.3
    assert "Recommended stack (simulated)" in outputs[3]
    menu = json.loads(outputs[4])
    assert menu["menu"]["gpu"]["prefill_tokens_per_second"] == 25000
    assert menu["menu"]["tiers"]["nvme"]["source"] == "menu"
    drives = outputs[5]
    assert "with one nvme drive failed (1 of 4 fenced): block hits" in drives
    assert "4 drives of 500.0 GiB" in drives
