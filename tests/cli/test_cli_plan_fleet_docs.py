"""docs/plan.md, "Planning a fleet": every ``$ kvtier ...`` command of the section runs, in order, in
one directory holding the file the section defines, and prints the figures the page quotes.

``kvtier plan --instances 8`` on the shipped trace must also recommend a design; the page's table is
compared cell by cell (prefix hits and net saving per design) with what the command prints, and the
replays' prefix hits with the sentence that quotes them.
"""

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


def _section() -> str:
    return DOC.read_text().split("## Planning a fleet", 1)[1]


def _commands() -> list[str]:
    blocks = re.findall(r"```console\n(.*?)```", _section(), flags=re.S)
    return [line[2:].strip() for b in blocks for line in b.splitlines() if line.startswith("$ kvtier ")]


def _table() -> list[list[str]]:
    rows = [line.strip("|").split("|") for line in _section().splitlines() if line.startswith("| ")]
    return [[c.strip() for c in r] for r in rows[1:]]  # without the header


def test_section_defines_commands_file_and_table() -> None:
    assert len(_commands()) == 4
    files = dict(re.findall(r"<!-- fleet-file: (\S+) -->\n```json\n(.*?)```", _section(), flags=re.S))
    assert set(files) == {"fleet-store.json"}
    assert len(_table()) == 7


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_section_commands_print_the_quoted_figures(tmp_path: Path) -> None:
    section = _section()
    for name, text in re.findall(r"<!-- fleet-file: (\S+) -->\n```json\n(.*?)```", section, flags=re.S):
        json.loads(text)
        (tmp_path / name).write_text(text)
    outs = []
    for command in _commands():
        argv = [sys.executable, "-m", "kvtier.cli.main", *shlex.split(command)[1:]]
        proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=400, check=False,
                              env={**__import__("os").environ, "COLUMNS": "200"})  # fmt: skip
        assert proc.returncode == 0, f"{command}\n{proc.stderr}"
        outs.append(proc.stdout)
    plan = outs[0]
    assert (tmp_path / "fleet-fleet.png").read_bytes()[:4] == b"\x89PNG"
    rec = [r for r in _table() if "recommended" in r[0]]
    assert len(rec) == 1
    assert f"recommended: {rec[0][0].split('**')[1]} " in plan
    # Per design (in the page's order), the printed row holds its prefix hits and net saving as the
    # page quotes them (rich may wrap a design's name onto a second line: the figures stay on one).
    printed = [ln for ln in plan.splitlines() if re.search(r"\d%", ln) and "$" in ln]
    assert len(printed) == len(_table())
    for row, line in zip(_table(), printed, strict=True):
        assert row[1].replace(" %", "%") in line, (row, line)
        assert "$" + row[6].replace("\u2212", "-") in line, (row, line)  # the page writes a minus sign
        assert ("*" in line.split("$")[0][:4]) == ("recommended" in row[0]), (row, line)
    rr, px, shared = outs[1], outs[2], outs[3]
    quoted = re.search(r"give ([\d.]+) % and ([\d.]+) % prefix hits", section)
    assert quoted is not None
    assert f"/ {quoted[1]}%" in rr and f"/ {quoted[2]}%" in px
    assert float(quoted[2]) > float(quoted[1])  # prefix-aware beats round-robin
    store = re.search(r"([\d.]+) % block hits — ([\d.]+) % of references answered by the store", section)
    assert store is not None
    assert f"{store[1]}% /" in shared and f"({store[2]}%)" in shared
