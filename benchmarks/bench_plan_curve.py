"""The one-pass LRU curve (every capacity) against simulating 20 capacities one by one.

On the shipped conversation trace (288,500 block references), in the same run:

* **kvtier curve**: :func:`kvtier.plan.curve.lru_curve` — stack distances, then the hit count of
  every capacity from 1 block to the unique-block count (best of ``--repeats``);
* **kvtier simulate x 20**: ``replay(..., simulate=True)`` of a primary-only LRU stack at 20
  capacities (2.5 %, 5 %, ..., 50 % of the unique blocks), one by one — what a sweep without the
  curve runs (the engine's request-level semantics);
* **libCacheSim LRU x 20**: libCacheSim 0.3.5's C LRU over the flat sequence at the same 20
  capacities, each with a hash table sized to its capacity (the fastest fair setting, see
  bench_replay.py) — the strongest reference.

The curve's hit counts at the 20 capacities are checked against libCacheSim's (flat semantics: they
must be equal). ``ratios`` = reference seconds / curve seconds (how many times faster the curve is;
higher is better): ``curve_vs_simulate_20`` and ``curve_vs_libcachesim_20``.

Usage: python benchmarks/bench_plan_curve.py [--json] [--repeats 3] [--capacities 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_replay import libcachesim_run, oracle_file
from kvtier.config import load_config
from kvtier.keys import KeyNamespace
from kvtier.plan.curve import lru_curve
from kvtier.sim.defaults import shipped_trace
from kvtier.sim.replay import prepare_trace, replay
from kvtier.sim.sweep import capacity_config
from kvtier.sim.trace import read_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--capacities", type=int, default=20)
    args = ap.parse_args()

    with shipped_trace() as path:
        requests = read_trace(path)
    config = load_config({"block_bytes": 4096, "primary_backing": "none"})
    trace = prepare_trace(requests, KeyNamespace.from_config(config, block_size=512), name=path.name)
    u = trace.unique_blocks
    caps = [max(1, u * (i + 1) // (2 * args.capacities)) for i in range(args.capacities)]

    curve_s = float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        curve = lru_curve(trace.flat)
        curve_s = min(curve_s, time.perf_counter() - t0)

    t0 = time.perf_counter()
    sim_hits = [replay(trace, capacity_config(config, c, "lru"), simulate=True).block_hits for c in caps]
    sim_s = time.perf_counter() - t0

    lcs_s = 0.0
    lcs_hits = []
    with oracle_file(trace.flat) as oracle:
        for c in caps:
            hp = max(1, (c - 1).bit_length() + 1)
            best, ratio = min(libcachesim_run(oracle, c, hp) for _ in range(args.repeats))
            lcs_s += best
            lcs_hits.append(round(ratio * trace.block_refs))
    curve_hits = [curve.hits(c) for c in caps]
    out = {
        "benchmark": "plan_lru_curve",
        "trace": trace.name,
        "block_refs": trace.block_refs,
        "unique_blocks": u,
        "capacities": caps,
        "kvtier_curve": {"seconds": curve_s, "capacities_covered": u},
        "kvtier_simulate_each": {"seconds": sim_s, "semantics": "engine", "block_hits": sim_hits},
        "libcachesim_lru_each": {"seconds": lcs_s, "semantics": "flat", "block_hits": lcs_hits},
        "curve_equals_libcachesim": curve_hits == lcs_hits,
        "ratios": {"curve_vs_simulate_20": sim_s / curve_s, "curve_vs_libcachesim_20": lcs_s / curve_s},
    }
    if args.json:
        print(json.dumps(out))
        return
    n = len(caps)
    print(f"trace {trace.name}: {trace.block_refs:,} block refs, {u:,} unique blocks")
    print(f"kvtier one-pass curve (all {u:,} capacities): {curve_s:8.3f} s")
    for label, secs in (
        (f"kvtier simulate, {n} capacities one by one", sim_s),
        (f"libCacheSim LRU, {n} capacities one by one", lcs_s),
    ):
        print(f"{label}  : {secs:8.3f} s  -> curve {secs / curve_s:.1f}x faster")  # fmt: skip
    print(f"curve hit counts equal libCacheSim's at all {n} capacities: {out['curve_equals_libcachesim']}")


if __name__ == "__main__":
    main()
