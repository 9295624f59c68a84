"""Parallel sweeps (``jobs > 1``, forked workers) give exactly the reports of one-by-one sweeps."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import load_config
from kvtier.keys import KeyNamespace
from kvtier.sim.parallel import fork_map
from kvtier.sim.replay import prepare_trace
from kvtier.sim.sweep import Capacity, sweep
from kvtier.sim.trace import TraceRequest

SIM = load_config({"block_bytes": 4096, "primary_backing": "none"})


def _square_plus(shared: int, x: int) -> int:
    return x * x + shared


@settings(max_examples=5, deadline=None)
@given(st.lists(st.integers(-100, 100), max_size=12), st.integers(1, 3))
def test_fork_map_keeps_order_and_reports_progress(items: list[int], jobs: int) -> None:
    seen: list[tuple[int, int]] = []
    out = fork_map(_square_plus, 7, items, jobs=jobs, progress=lambda d, t: seen.append((d, t)))
    assert out == [x * x + 7 for x in items]
    assert [d for d, _ in seen] == list(range(1, len(items) + 1))


def test_parallel_sweep_equals_serial_sweep() -> None:
    reqs = [TraceRequest(float(i), tuple((i % 41) * 100 + j for j in range(1 + i % 9))) for i in range(600)]
    trace = prepare_trace(reqs, KeyNamespace.from_config(SIM, block_size=512))
    caps = [Capacity("20", 20), Capacity("90", 90)]
    serial = sweep(trace, SIM, caps, ["lru", "s3fifo"])
    par = sweep(trace, SIM, caps, ["lru", "s3fifo"], jobs=2)
    assert par.opt == serial.opt
    for key, rep in serial.reports.items():
        other = par.reports[key]
        assert (other.hit_ratio, other.opt, other.cost["saved_seconds"]) == (
            rep.hit_ratio,
            rep.opt,
            rep.cost["saved_seconds"],
        )


def test_replay_sweep_jobs_option() -> None:
    argv = [sys.executable, "-m", "kvtier.cli.main", "replay", "--sweep", "--capacity", "1%,5%", "--policy",
            "lru,sieve", "--limit", "1500", "--jobs", "2", "--json", "--no-opt"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count('"capacity":') == 4
