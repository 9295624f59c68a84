"""Every ``$ kvtier ...`` example in docs/replay.md runs and succeeds (except the no-argument replay,
which tests/cli/test_cli_replay_default.py times on its own)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from needs import need_module

need_module("rich", "cli")  # `kvtier replay` prints with rich

DOC = Path(__file__).parents[2] / "docs" / "replay.md"


def _examples() -> list[str]:
    blocks = re.findall(r"```console\n(.*?)```", DOC.read_text(), flags=re.S)
    cmds = [line[2:].strip() for b in blocks for line in b.splitlines() if line.startswith("$ kvtier ")]
    return [c for c in cmds if c != "kvtier replay"]


def test_doc_has_examples() -> None:
    assert len(_examples()) >= 4


@pytest.mark.parametrize("command", _examples())
def test_doc_example_runs(command: str, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "kvtier.cli.main", *shlex.split(command)[1:]]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{command}\n{proc.stderr}"
    if "--plot" in command:
        png = shlex.split(command)[shlex.split(command).index("--plot") + 1]
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
