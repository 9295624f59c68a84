"""The README's first command: ``kvtier replay`` with no arguments, no server.

Its speed is measured, not asserted (about 8 s on a quiet 2-core machine, per the README): the
test bounds it by a timeout so a hang fails, and reports the time it took."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from needs import need_module

need_module("rich", "cli")  # `kvtier replay` prints with rich


@pytest.mark.slow
def test_default_replay_runs_and_cleans_up(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the default fs tier's directory goes here
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier.cli.main", "replay", "--progress"],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, f"default replay failed after {elapsed:.1f} s: {proc.stderr}"
    out = proc.stdout
    assert "12,031" in out and "288,500 (182,790 unique)" in out
    # Both tiers of the default stack serve hits, and every loaded block verified.
    rows = {
        m.group(1): int(m.group(2).replace(",", ""))
        for m in re.finditer(r"│ (primary|fs0)\s+│ \S+\s+│\s+([\d,]+)", out)
    }
    assert rows.get("primary", 0) > 0 and rows.get("fs0", 0) > 0, out
    assert re.search(r"verified blocks / mismatches\s+│\s+[\d,]+ / 0", out), out
    assert "replay" in proc.stderr  # the progress bar (forced: stderr is not a terminal here)
    assert list(tmp_path.iterdir()) == [], "temporary fs tier directory left behind"
