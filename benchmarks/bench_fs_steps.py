"""Where the fs tier's time goes: per-block cost of each step of a store and a load, one thread.

For each block size (default 4 KiB, 256 KiB, 1 MiB, 4 MiB) and ``--blocks`` blocks, the steps the
fs tier runs for one block are timed one by one with the tier's own functions, on a tier's own tree:

* store: ``checksum`` (xxh3-64 of key + namespace + payload), ``header`` (encode), ``write``
  (``open(O_EXCL)`` + ``pwritev`` header + payload + ``close``: :func:`~kvtier.tiers.fs.io.write_block`
  less the two steps before; ``python_cpu``: the thread's CPU for all three), ``batched`` (the same
  three steps for all blocks in one call of the tier's batched C writer,
  :mod:`kvtier.tiers.fs.batchwrite`; ``batched_cpu``: its CPU), ``fsync`` (extra cost of
  ``fsync: true``: file + directory),
  ``rename`` (temp file into its shard, through the confined tree), ``section`` (one trip through
  the cross-process accounting lock: flock, read, write back; a store job takes two, group commit
  merges them across jobs);
* load: ``open`` (confined open of the shard levels and the file + ``fstat`` check), ``read``
  (one ``preadv`` of header + payload, ``O_DIRECT`` when the tier writes with it), ``verify``
  (checksum of the payload), ``chunk_of_1`` (the tier's load path on a one-block chunk: all of the
  above, batched in C where it builds; ``_cpu``: the thread's CPU for it);
* through the tier (``threads: 1``): per-block wall time of ``--blocks`` one-block store jobs, of
  one ``--blocks``-block job, and of the loads; ``other`` = tier time less the sum of the steps
  (queueing on the worker pool, bookkeeping, reporting).

Figures are microseconds per block (medians of ``--rounds`` rounds). ``--json`` prints ONE object;
its ``ratios`` map ``store_write_<size>_batched_vs_python`` to the Python path's checksum + header +
write time ÷ the batched writer's (higher is better).
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

from kvtier import codec
from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey
from kvtier.tiers.base import TierContext
from kvtier.tiers.fs import FsTier
from kvtier.tiers.fs.batchwrite import WriteItem
from kvtier.tiers.fs.io import read_block, write_block
from kvtier.tiers.fs.layout import HEADER_ALIGN


def _us(t: float, n: int) -> float:
    return round(t / n * 1e6, 1)


def _drive(
    tier: FsTier, keys: list[BlockKey], slots: list[int], per_job: int, load: bool, first: int
) -> float:
    t0 = time.perf_counter()
    ids = set()
    for j, lo in enumerate(range(0, len(keys), per_job)):
        job = TransferJob(
            first + j, keys[lo : lo + per_job], np.asarray(slots[lo : lo + per_job], np.int32), load
        )
        (tier.submit_load if load else tier.submit_store)(job)
        ids.add(job.job_id)
    while ids:
        tier.drain()
        for r in tier.get_finished_jobs():
            assert r.success, r.error
            ids.discard(r.job_id)
    return time.perf_counter() - t0


def steps_for(root: str, bs: int, n: int, tag: str) -> dict[str, float]:
    mem = mmap.mmap(-1, 2 * n * bs)
    rows = np.frombuffer(mem, np.uint8).reshape(2 * n, bs)
    rows[:n] = np.random.default_rng(bs).integers(0, 256, (n, bs), dtype=np.uint8)
    ctx = TierContext(name="fs", block_bytes=bs, namespace=f"steps-{bs}")
    tier = FsTier(primary_kv_view=memoryview(rows), context=ctx, root_dir=root, threads=1, max_bytes=None)
    out: dict[str, float] = {}
    try:
        lay, acct, tree = tier.layout, tier.accounting, tier.accounting.tree
        direct = tier.direct_io
        keys = [BlockKey(f"{tag}/{i}".encode()) for i in range(n)]
        pay = [rows[i].data for i in range(n)]
        t = time.perf_counter()
        sums = [codec.payload_checksum(k, lay.ns_tag, p) for k, p in zip(keys, pay, strict=True)]
        out["store_checksum"] = _us(time.perf_counter() - t, n)
        t = time.perf_counter()
        for k, c in zip(keys, sums, strict=True):
            codec.encode_header(k, bs, c, lay.ns_tag, HEADER_ALIGN)
        out["store_header"] = _us(time.perf_counter() - t, n)
        names = [f"{acct.token}.steps{i}" for i in range(n)]
        t, c = time.perf_counter(), time.thread_time()
        for nm, k, p in zip(names, keys, pay, strict=True):
            write_block(nm, k, p, lay.ns_tag, direct=direct, fsync=False, dir_fd=acct.temps.fd)
        whole = _us(time.perf_counter() - t, n)
        out["store_python_cpu"] = _us(time.thread_time() - c, n)
        out["store_write"] = round(whole - out["store_checksum"] - out["store_header"], 1)
        writer = tier._store._batch  # the batched C writer (None: no compiler here)
        if writer is not None:
            bnames = [f"{acct.token}.stepsb{i}" for i in range(n)]
            t, c = time.perf_counter(), time.thread_time()
            fd = acct.temps.fd
            items = [
                WriteItem(fd, nm, i, bytes(k), direct)
                for i, (nm, k) in enumerate(zip(bnames, keys, strict=True))
            ]
            errs = writer.write(items)
            out["store_batched"] = _us(time.perf_counter() - t, n)
            out["store_batched_cpu"] = _us(time.thread_time() - c, n)
            assert not any(errs), errs
            for nm in bnames:
                os.unlink(nm, dir_fd=acct.temps.fd)
        fnames = [f"{acct.token}.stepsf{i}" for i in range(n)]
        t = time.perf_counter()
        for nm, k, p in zip(fnames, keys, pay, strict=True):
            write_block(nm, k, p, lay.ns_tag, direct=direct, fsync=True, dir_fd=acct.temps.fd)
            os.fsync(acct.temps.fd)  # the directory sync the tier adds with fsync: true
        out["store_fsync"] = round(_us(time.perf_counter() - t, n) - whole, 1)
        for nm in fnames:
            os.unlink(nm, dir_fd=acct.temps.fd)
        finals = [lay.path_of(k) for k in keys]
        for f in finals:
            tier.shard_dirs.ensure_for(f)
        t = time.perf_counter()
        for nm, f in zip(names, finals, strict=True):
            tree.rename_in(acct.temps.fd, nm, f)
        out["store_rename"] = _us(time.perf_counter() - t, n)
        t = time.perf_counter()
        for _ in range(n):
            with acct.section():
                pass
        out["acct_section"] = _us(time.perf_counter() - t, n)
        os.sync()
        t = time.perf_counter()
        opened = [tree.open_block(f, direct=direct) for f in finals]
        out["load_open"] = _us(time.perf_counter() - t, n)
        t = time.perf_counter()
        for (fd, size), k, i in zip(opened, keys, range(n), strict=True):
            read_block(fd, k, rows[n + i].data, lay.ns_tag, verify=False, size=size, direct=direct)
            os.close(fd)
        out["load_read_close"] = _us(time.perf_counter() - t, n)
        hdr = codec.parse_header(codec.encode_header(keys[0], bs, sums[0], lay.ns_tag, HEADER_ALIGN),
                                 expected_key=keys[0], ns_tag=lay.ns_tag, payload_len=bs)  # fmt: skip
        t = time.perf_counter()
        for i in range(n):
            codec.verify_payload(hdr, rows[n].data) if i == 0 else codec.payload_checksum(
                keys[i], lay.ns_tag, rows[n + i].data
            )
        out["load_verify"] = _us(time.perf_counter() - t, n)
        # The tier's load path on one-block chunks (the batched reader where it builds), CPU only:
        # the per-chunk cost a stream of one-block load jobs pays besides the job hand-off.
        t, c = time.perf_counter(), time.thread_time()
        for k, i in zip(keys, range(n), strict=True):
            assert tier._load.read_chunk([(k, n + i)]).done
        out["load_chunk_of_1"] = _us(time.perf_counter() - t, n)
        out["load_chunk_of_1_cpu"] = _us(time.thread_time() - c, n)
        # Through the tier: fresh keys, one-block jobs, then one job of all blocks, then loads.
        for per_job, label in ((1, "jobs_of_1"), (n, f"jobs_of_{n}")):
            ks = [BlockKey(f"{tag}/{label}/{i}".encode()) for i in range(n)]
            out[f"tier_store_{label}"] = _us(
                _drive(tier, ks, list(range(n)), per_job, False, 10_000 * per_job), n
            )
            os.sync()
            out[f"tier_load_{label}"] = _us(
                _drive(tier, ks, list(range(n, 2 * n)), per_job, True, 50_000 * per_job), n
            )
        steps = out["store_checksum"] + out["store_header"] + out["store_write"] + out["store_rename"]
        out["tier_store_other_jobs_of_1"] = round(
            out["tier_store_jobs_of_1"] - steps - 2 * out["acct_section"], 1
        )
        out[f"tier_store_other_jobs_of_{n}"] = round(out[f"tier_store_jobs_of_{n}"] - steps, 1)
        lsteps = out["load_open"] + out["load_read_close"] + out["load_verify"]
        out["tier_load_other_jobs_of_1"] = round(out["tier_load_jobs_of_1"] - lsteps, 1)
    finally:
        tier.shutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4KiB,256KiB,1MiB,4MiB")
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from kvtier.config import parse_size

    sizes = [parse_size(s.strip(), "--sizes") for s in args.sizes.split(",") if s.strip()]
    base = tempfile.mkdtemp(prefix="kvtier-bench-steps-", dir=args.dir)
    results: dict[str, dict[str, float]] = {}
    try:
        for bs in sizes:
            runs = [
                steps_for(os.path.join(base, f"{bs}-{r}"), bs, args.blocks, f"r{r}")
                for r in range(args.rounds)
            ]
            tag = f"{bs >> 20}MiB" if bs % (1 << 20) == 0 else f"{bs >> 10}KiB"
            results[tag] = {k: round(statistics.median(r[k] for r in runs), 1) for k in runs[0]}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    # The batched C writer (checksum + header + temp file in one call) against the Python path's
    # same three steps, wall time per block on one thread (higher is better).
    ratios = {
        f"store_write_{t}_batched_vs_python": round(
            (r["store_checksum"] + r["store_header"] + r["store_write"]) / r["store_batched"], 3
        )
        for t, r in results.items()
        if r.get("store_batched")
    }
    doc: dict[str, Any] = {"benchmark": "bench_fs_steps", "unit": "us per block", "blocks": args.blocks,
                           "results": results, "ratios": ratios}  # fmt: skip
    if args.json:
        print(json.dumps(doc))
        return 0
    keys = list(next(iter(results.values())))
    print(f"{'us per block':<32}" + "".join(f"{t:>10}" for t in results))
    for k in keys:
        print(f"{k:<32}" + "".join(f"{results[t][k]:>10.1f}" for t in results))
    for k, v in ratios.items():
        print(f"{k:<40} {v:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
