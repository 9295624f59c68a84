"""The fs tier striped over several roots on ONE disk, next to the same tier with one root, same run.

What it shows: the cost of striping itself (splitting jobs by root, merging the results, the health
monitor), since the roots share one device here. On a server each root is its own NVMe drive and
the stripes add up; this benchmark checks that the layer in front of the roots costs (next to)
nothing. Both sides get the same number of I/O threads in all (``--threads`` for the one root,
``--threads / roots`` per root for the striped tier), the same block size, keys and bytes.

Phases per round, each timed until every job is reported: ``store`` (``--blocks`` blocks as
one-block jobs submitted at once, as vLLM submits) and ``load`` (the same blocks back, one job of
all of them, into poisoned slots; every byte checked after timing). Rounds alternate which side
goes first; ``ratios`` = median over rounds of (striped MB/s) / (one root MB/s) in the same round
(higher is better; 1.0 = no cost). ``--json`` prints one object.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from kvtier.config import parse_size
from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey
from kvtier.testing.primary import wait_for_jobs
from kvtier.tiers.base import SecondaryTier, TierContext
from kvtier.tiers.fs import FsTier


def _tier(view: memoryview, block: int, roots: list[str], threads: int) -> SecondaryTier:
    ctx = TierContext(name="fs", block_bytes=block, namespace=f"bench-striped-{block}")
    common: dict[str, Any] = {"precreate_dirs": True, "small_block_bytes": 0}
    if len(roots) == 1:
        return FsTier(primary_kv_view=view, context=ctx, root_dir=roots[0], threads=threads, **common)
    per = max(1, threads // len(roots))
    return FsTier(primary_kv_view=view, context=ctx, root_dirs=roots, threads=per, **common)


def _round(
    tier: SecondaryTier, rows: np.ndarray, data: np.ndarray, keys: list[BlockKey], ids: Any
) -> dict[str, float]:
    n, block = data.shape
    rows[:n, :block] = data
    jobs = [TransferJob(next(ids), [k], np.array([i], dtype=np.int32)) for i, k in enumerate(keys)]
    t0 = time.perf_counter()
    for j in jobs:
        tier.submit_store(j)
    got = wait_for_jobs(tier, [j.job_id for j in jobs], timeout=300)
    store = time.perf_counter() - t0
    assert all(r.success for r in got.values()), [r.error for r in got.values() if not r.success][:3]
    rows[:n] = 0xEE
    job = TransferJob(next(ids), keys, np.arange(n, dtype=np.int32), is_promotion=True)
    t0 = time.perf_counter()
    tier.submit_load(job)
    res = wait_for_jobs(tier, [job.job_id], timeout=300)[job.job_id]
    load = time.perf_counter() - t0
    assert res.success and (rows[:n, :block] == data).all(), "a load returned wrong bytes"
    mb = n * block / 1e6
    return {"store": mb / store, "load": mb / load}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256KiB,1MiB", help="comma-separated block sizes")
    # 384 blocks a round: a 256 KiB store phase then lasts ~0.1 s; at 48 (~10 ms) the same code
    # gave 0.86-0.99 from run to run.
    ap.add_argument("--blocks", type=int, default=384, help="blocks per round")
    ap.add_argument("--roots", type=int, default=2, help="roots of the striped side (on one disk)")
    ap.add_argument("--threads", type=int, default=4, help="I/O threads in all, each side")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--dir", default=None, help="parent directory of the scratch roots (default: system temp)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    base = tempfile.mkdtemp(prefix="kvtier-bench-striped-", dir=args.dir)
    out: dict[str, Any] = {"roots": args.roots, "threads": args.threads, "blocks": args.blocks, "sizes": {}}
    ratios: dict[str, float] = {}
    t_start = time.perf_counter()
    try:
        for size in (parse_size(s.strip(), "--sizes") for s in args.sizes.split(",") if s.strip()):
            row = -(-size // 4096) * 4096
            rows = np.frombuffer(mmap.mmap(-1, args.blocks * row), np.uint8).reshape(args.blocks, row)
            data = np.random.default_rng(size).integers(0, 256, (args.blocks, size), dtype=np.uint8)
            one_root = [os.path.join(base, f"one-{size}")]
            many = [os.path.join(base, f"stripe-{size}-{i}") for i in range(args.roots)]
            sides = {
                "one": _tier(memoryview(rows), size, one_root, args.threads),
                "striped": _tier(memoryview(rows), size, many, args.threads),
            }
            for t in sides.values():
                getattr(t, "wait_scan", lambda _t: True)(60)
            ids = iter(range(1, 1 << 62))
            per: dict[str, dict[str, list[float]]] = {s: {"store": [], "load": []} for s in sides}
            ratio: dict[str, list[float]] = {"store": [], "load": []}
            for r in range(args.rounds):
                order = ["one", "striped"] if r % 2 == 0 else ["striped", "one"]
                got: dict[str, dict[str, float]] = {}
                for side in order:
                    keys = [BlockKey(f"{side}/{size}/{r}/{i}".encode()) for i in range(args.blocks)]
                    got[side] = _round(sides[side], rows, data, keys, ids)
                for phase in ("store", "load"):
                    for side in sides:
                        per[side][phase].append(got[side][phase])
                    ratio[phase].append(got["striped"][phase] / got["one"][phase])
            for t in sides.values():
                t.shutdown()
            tag = f"{size >> 10}KiB" if size < 1 << 20 else f"{size >> 20}MiB"
            out["sizes"][tag] = {
                side: {phase: round(statistics.median(v), 1) for phase, v in ph.items()}
                for side, ph in per.items()
            }
            for phase, v in ratio.items():
                ratios[f"striped{args.roots}_{phase}_{tag}"] = round(statistics.median(v), 3)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out["ratios"] = ratios
    out["seconds"] = round(time.perf_counter() - t_start, 1)
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"fs tier, {args.roots} roots on one disk vs one root ({args.threads} threads in all), MB/s medians:"
    )
    for tag, sides_ in out["sizes"].items():
        for phase in ("store", "load"):
            one, striped = sides_["one"][phase], sides_["striped"][phase]
            ratio = ratios[f"striped{args.roots}_{phase}_{tag}"]
            print(f"  {tag:>7} {phase:<5}  one root {one:8.1f}  striped {striped:8.1f}  ratio {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
