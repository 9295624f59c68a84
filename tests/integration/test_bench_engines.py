"""benchmarks/bench_engines.py runs through both engines' adapters at its smallest settings.

Speed is never asserted (it is the benchmark's to measure); this checks that both engines ran
(each trial's loads are byte-checked by the benchmark itself, and a reference job that moves fewer
blocks than asked fails it), the shape of ``--json``, and that a bad ``--root`` is one line.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_venvs import HERE, engine_python

pytestmark = pytest.mark.slow

BENCH = HERE.parents[1] / "benchmarks" / "bench_engines.py"


def test_both_engines_report_finite_paired_ratios(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        KVTIER_TEST_SGLANG_PYTHON=engine_python("SGLANG"),
        KVTIER_TEST_LMCACHE_PYTHON=engine_python("LMCACHE"),
    )
    argv = ["--json", "--pages", "2", "--repeat", "1", "--trials", "2", "--root", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, str(BENCH), *argv], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["missing"] == [], out["missing"]
    assert out["root"] == str(tmp_path) and out["trials"] == 2
    assert set(out["ratios"]) == {"sglang_store", "sglang_load", "lmcache_store", "lmcache_load"}
    for engine in ("sglang", "lmcache"):
        r = out[engine]
        assert r["samples"] == 1  # two trials, one in each order, make one sample
        for op in ("store", "load"):
            assert math.isfinite(r[f"ratio_{op}"]) and r[f"ratio_{op}"] > 0
            assert r[f"ratio_{op}"] == out["ratios"][f"{engine}_{op}"]
            assert set(r[f"ratio_{op}_spread"]) == {"min", "q1", "q3", "max"}
            assert r[f"adapter_{op}_mib_s"] > 0 and r[f"direct_{op}_mib_s"] > 0
    assert list(tmp_path.iterdir()) == []  # every round's directories are gone


def test_a_root_that_is_not_a_directory_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--root", str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert f"--root {tmp_path / 'nope'}: not a directory" in proc.stderr.strip().splitlines()[-1]
