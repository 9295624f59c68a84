"""fs tier throughput through the engine, next to a raw loop doing the same file I/O, same run.

For each block size (default 1 MiB and 4 MiB, 64 blocks each):

* **tier store**: ``Engine.prepare_store`` + copy into the primary slots + ``complete_store``; the
  timed part is from ``complete_store`` (the write-through store job goes to the fs tier) until
  ``drain()`` returns: the fs tier's job: checksum, header, temp file, rename, accounting.
* **tier load**: ``Engine.reset()`` empties the primary tier; ``lookup`` finds every key in the fs
  tier and promotes them (one batched load job); timed until ``lookup`` answers HIT for all.
* **raw store / load**: the same bytes written as one file per block (open, write, close) and read
  back (open, readinto, close) in a sibling directory on the same file system, with a pool of the
  same number of threads, and the same ``O_DIRECT`` choice the tier made for its writes.
  Blocks on the small-block path (``block_bytes <= small_block_bytes``, default 64 KiB: they are
  packed into append-only segments) are compared with **raw appends** instead: the same blocks
  appended to one file (one ``O_APPEND`` write each, buffered) and read back one ``preadv`` each.

* **warm-restart scan**: ``--scan-files`` valid block files are laid in the tier's tree; a new tier
  rebuilds its index from them in the background (``scan_files / scan_seconds``), next to a raw
  ``os.scandir`` walk of the same tree with one ``stat`` per file (what any index rebuild must do).

The end-to-end figures (including the engine's copies between the caller's array and the primary
tier) are printed too, with their own ratios. Each measurement is the best of ``--repeat`` rounds
(fresh keys and files each round; tier and raw interleaved, alternating which goes first).
``--json`` prints ONE JSON object.

vLLM's own ``fs`` tier is compared only when ``import vllm`` works (it is not installed here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from kvtier.engine import Engine
from kvtier.keys import BlockKey
from kvtier.tiers.fs import FsTier

_O_DIRECT = getattr(os, "O_DIRECT", 0)


def _raw_store(pool: ThreadPoolExecutor, d: str, data: np.ndarray, direct: bool) -> float:
    # New files each round, as the tier creates new files (overwriting would add truncation work).
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (_O_DIRECT if direct else 0)

    def one(i: int) -> None:
        fd = os.open(os.path.join(d, f"{i}.blk"), flags, 0o600)
        try:
            os.write(fd, data[i].data)
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    list(pool.map(one, range(len(data))))
    return time.perf_counter() - t0


def _raw_load(pool: ThreadPoolExecutor, d: str, out: np.ndarray) -> float:
    def one(i: int) -> None:
        fd = os.open(os.path.join(d, f"{i}.blk"), os.O_RDONLY)
        try:
            os.readv(fd, [out[i].data])
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    list(pool.map(one, range(len(out))))
    return time.perf_counter() - t0


def _raw_append_store(pool: ThreadPoolExecutor, path: str, data: np.ndarray) -> float:
    """The small-block reference: the same blocks appended to one file (one write per block,
    ``O_APPEND``, buffered as the tier's segments are), from the same number of threads."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    try:
        t0 = time.perf_counter()
        list(pool.map(lambda i: os.write(fd, data[i].data), range(len(data))))
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def _raw_append_load(pool: ThreadPoolExecutor, path: str, out: np.ndarray) -> float:
    """Read the appended blocks back, one ``preadv`` per block (their order is the writes' order)."""
    n = out.shape[1]
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        list(pool.map(lambda i: os.preadv(fd, [out[i].data], i * n), range(len(out))))
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def _tier_round(
    eng: Engine, keys: list[BlockKey], data: np.ndarray, out: np.ndarray, job_blocks: int
) -> dict[str, float]:
    n = len(keys)
    t0 = time.perf_counter()
    rows = eng.primary.rows
    handles = []
    for lo in range(0, n, job_blocks):  # one write-through store job per handle
        h = eng.prepare_store(keys[lo : lo + job_blocks])
        for i, s in enumerate(h.slot_ids):
            rows[s, : eng.block_bytes] = data[lo + i]
        handles.append(h)
    t1 = time.perf_counter()
    for h in handles:
        eng.complete_store(h)
    eng.drain()
    t2 = time.perf_counter()
    eng.reset()  # empty the primary tier: every key must come back from the fs tier
    t3 = time.perf_counter()
    rep = eng.lookup(keys)  # every key HIT_PENDING: one batched promotion job to the fs tier
    while rep.num_hits < n:
        if rep.num_hits + rep.pending < n and not rep.codes.count(3):
            raise RuntimeError(f"fs tier lost blocks: {rep.codes.count(0)} of {n} missed")
        eng.drain()  # blocks until the promotion finished (no busy polling competing for the GIL)
        rep = eng.lookup(keys)
    t4 = time.perf_counter()
    got = eng.load_blocks(keys, out)
    t5 = time.perf_counter()
    if got != n or not np.array_equal(out[0], data[0]) or not np.array_equal(out[-1], data[-1]):
        raise RuntimeError("fs tier returned wrong bytes")
    eng.reset()
    return {"store": t2 - t1, "store_e2e": t2 - t0, "load": t4 - t3, "load_e2e": t5 - t3}


def bench_size(
    root: str,
    block_bytes: int,
    blocks: int,
    threads: int,
    repeat: int,
    direct_io: str = "auto",
    job_blocks: int | None = None,
    shared_root: bool = False,
    small_block_bytes: int | None = None,
) -> dict[str, Any]:
    """One block size: tier store/load (``job_blocks`` blocks per store job; default all in one)
    next to the raw loop over the same bytes, best of ``repeat`` interleaved rounds."""
    job_blocks = job_blocks or blocks
    row = -(-block_bytes // 4096) * 4096
    cfg = {
        "block_bytes": block_bytes,
        "cpu_bytes_to_use": row * blocks,
        "model": f"bench-fs-{block_bytes}-{job_blocks}{'-mac' if shared_root else ''}",
        "secondary_tiers": [
            {
                "type": "fs",
                "root_dir": root,
                "threads": threads,
                "direct_io": direct_io,
                "shared_root": shared_root,
                **({} if small_block_bytes is None else {"small_block_bytes": small_block_bytes}),
            }
        ],
    }
    rng = np.random.default_rng(block_bytes)
    # Page-aligned like the primary buffer, so the raw loop may use O_DIRECT exactly as the tier does.
    data = np.frombuffer(mmap.mmap(-1, blocks * block_bytes), np.uint8).reshape(blocks, block_bytes)
    data[:] = rng.integers(0, 256, (blocks, block_bytes), dtype=np.uint8)
    out = np.zeros_like(data)
    raw_dir = os.path.join(root, f"raw-{block_bytes}-{job_blocks}{'-mac' if shared_root else ''}")
    os.makedirs(raw_dir, exist_ok=True)
    best: dict[str, float] = {}
    with Engine(cfg) as eng, ThreadPoolExecutor(threads) as pool:
        fs = eng.tiers[0]
        assert isinstance(fs, FsTier)
        # Steady state: the timed rounds start once the start-up scan is done (and, with
        # precreate_dirs: true, the background pre-creation of the shard directories).
        fs.tree_ready.wait(60)
        direct = fs.direct_io
        # The small-block path packs blocks into append-only segments: its reference is appends of
        # the same bytes to one file (the device's rate for small writes), not one file per block.
        small = fs.segments is not None
        for r in range(repeat):
            keys = [BlockKey(f"bench/{block_bytes}/{job_blocks}/{r}/{i}".encode()) for i in range(blocks)]
            rd = os.path.join(raw_dir, str(r))
            os.mkdir(rd)
            raw: dict[str, float] = {}
            # Alternate which side goes first, so neither always follows the other's writes.
            for side in ("tier", "raw") if r % 2 == 0 else ("raw", "tier"):
                if side == "tier":
                    tier = _tier_round(eng, keys, data, out, job_blocks)
                    continue
                out[:] = 0
                if small:
                    raw["raw_store"] = _raw_append_store(pool, os.path.join(rd, "appends"), data)
                    raw["raw_load"] = _raw_append_load(pool, os.path.join(rd, "appends"), out)
                    # Threads append in any order: the file holds the same rows, permuted.
                    same = sorted(r.tobytes() for r in out) == sorted(r.tobytes() for r in data)
                else:
                    raw["raw_store"] = _raw_store(pool, rd, data, direct)
                    raw["raw_load"] = _raw_load(pool, rd, out)
                    same = np.array_equal(out, data)
                if not same:
                    raise RuntimeError("raw loop read back wrong bytes")
            for k, v in {**tier, **raw}.items():
                best[k] = min(best.get(k, float("inf")), v)
        stats = fs.get_stats()
    mb = blocks * block_bytes / 1e6
    tput = {k: mb / v for k, v in best.items()}  # MB/s
    return {
        "block_bytes": block_bytes,
        "blocks": blocks,
        "job_blocks": job_blocks,
        "shared_root": shared_root,
        "threads": threads,
        "blocks_per_s": {k: round(blocks / v) for k, v in best.items() if k in ("store", "raw_store")},
        "direct_io": direct,
        "reference": "appends to one file" if small else "one file per block",
        "MBps": {k: round(v, 1) for k, v in tput.items()},
        "ratio_store": tput["store"] / tput["raw_store"],
        "ratio_load": tput["load"] / tput["raw_load"],
        "ratio_store_e2e": tput["store_e2e"] / tput["raw_store"],
        "ratio_load_e2e": tput["load_e2e"] / tput["raw_load"],
        "corrupt": stats["corrupt"],
        "failed_jobs": stats["failed_jobs"],
    }


def bench_scan(root: str, files: int) -> dict[str, float]:
    """Warm-restart index rebuild rate of the tier next to a raw scandir+stat walk of the same tree."""
    from kvtier import codec
    from kvtier.tiers.base import TierContext
    from kvtier.tiers.fs.layout import HEADER_ALIGN

    block = 4096
    rows = np.zeros((4, block), dtype=np.uint8)
    ctx = TierContext(name="fs", block_bytes=block, namespace="bench-scan")
    scan_root = os.path.join(root, "scan")

    def new_tier() -> FsTier:
        return FsTier(primary_kv_view=rows.data, context=ctx, root_dir=scan_root, precreate_dirs=False)

    tier = new_tier()
    layout = tier.layout
    tier.shutdown()
    payload = bytes(block)
    made: set[str] = set()
    for i in range(files):
        k = BlockKey(i.to_bytes(16, "big"))
        d = layout.dir_of(k)
        if d not in made:
            os.makedirs(d, exist_ok=True)
            made.add(d)
        with open(os.path.join(d, layout.name_of(k)), "wb") as f:
            f.write(codec.encode(k, payload, ns_tag=layout.ns_tag, align=HEADER_ALIGN))

    def raw_walk() -> float:
        t0 = time.perf_counter()
        n = 0
        stack = [layout.ns_dir]
        while stack:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    else:
                        e.stat(follow_symlinks=False)
                        n += 1
        return n / (time.perf_counter() - t0)

    raw_rate = tier_rate = 0.0
    for _ in range(3):  # best of three, interleaved
        raw_rate = max(raw_rate, raw_walk())
        t = new_tier()
        try:
            t.wait_scan(120)
            tier_rate = max(tier_rate, t.scan_files / max(t.scan_seconds, 1e-9))
        finally:
            t.shutdown()
    return {"files": files, "tier_files_per_s": tier_rate, "raw_files_per_s": raw_rate,
            "ratio": tier_rate / raw_rate}  # fmt: skip


def _size_tag(n: int) -> str:
    if n % (1 << 20) == 0:
        return f"{n >> 20}MiB"
    return f"{n >> 10}KiB" if n % 1024 == 0 else str(n)


def main(argv: list[str] | None = None) -> int:  # noqa: C901 (flags in, a table out: no logic)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--sizes", default="4KiB,64KiB,256KiB,1MiB,4MiB", help="comma-separated block sizes")
    ap.add_argument(
        "--job-blocks", default="64,1",
        help="comma-separated blocks per store job (each size runs once per value; capped at --blocks)",
    )  # fmt: skip
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument(
        "--direct-io", default="auto", choices=("auto", "never"),
        help="the tier's direct_io option; the raw loop uses O_DIRECT exactly when the tier does",
    )  # fmt: skip
    ap.add_argument("--dir", default=None, help="parent directory of the scratch root (default: system temp)")
    ap.add_argument("--scan-files", type=int, default=20_000, help="warm-restart scan files (0: skip)")
    ap.add_argument(
        "--mac-size", default="1MiB",
        help="block size also run with shared_root: true (MAC-authenticated blocks); '' skips",
    )  # fmt: skip
    ap.add_argument(
        "--small-block-bytes", default=None,
        help="the tier's small_block_bytes (default: the tier's; 0 sends every size to one file per block)",
    )  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    from kvtier.config import parse_size

    sizes = [parse_size(s.strip(), "--sizes") for s in args.sizes.split(",") if s.strip()]
    small = None
    if args.small_block_bytes is not None:
        small = parse_size(args.small_block_bytes, "--small-block-bytes")
    root = tempfile.mkdtemp(prefix="kvtier-bench-fs-", dir=args.dir)
    t0 = time.perf_counter()
    try:
        shapes = sorted(
            {min(int(j), args.blocks) for j in args.job_blocks.split(",") if j.strip()}, reverse=True
        )
        results = [
            bench_size(
                root, s, args.blocks, args.threads, args.repeat, args.direct_io, j, small_block_bytes=small
            )
            for s in sizes
            for j in shapes
        ]
        mac = None
        if args.mac_size:
            # The MAC's cost: the same size with and without shared_root, back to back in this run.
            os.environ.setdefault("KVTIER_FS_SECRET", os.urandom(16).hex())
            ms = parse_size(args.mac_size, "--mac-size")
            same = [r for r in results if r["block_bytes"] == ms and r["job_blocks"] == args.blocks]
            plain = same[0] if same else bench_size(
                root, ms, args.blocks, args.threads, args.repeat, args.direct_io, args.blocks
            )  # fmt: skip
            keyed = bench_size(
                root,
                ms,
                args.blocks,
                args.threads,
                args.repeat,
                args.direct_io,
                args.blocks,
                shared_root=True,
            )
            mac = {"block_bytes": ms, "MBps_plain": plain["MBps"], "MBps_mac": keyed["MBps"]}
        scan = bench_scan(root, args.scan_files) if args.scan_files > 0 else None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    vllm_note = "vllm not importable: vLLM fs-tier comparison skipped"
    with contextlib.suppress(ImportError):
        import vllm  # noqa: F401

        vllm_note = "vllm importable but the comparison is not implemented in this version"
    ratios: dict[str, float] = {}
    for r in results:
        tag = _size_tag(r["block_bytes"])
        if r["job_blocks"] != r["blocks"]:  # smaller store jobs: only the store side differs
            for k in ("store", "store_e2e"):
                ratios[f"{k}_{tag}_jobs_of_{r['job_blocks']}"] = round(r[f"ratio_{k}"], 3)
            continue
        for k in ("store", "load", "store_e2e", "load_e2e"):
            ratios[f"{k}_{tag}"] = round(r[f"ratio_{k}"], 3)
    if scan is not None:
        ratios["restart_scan"] = round(scan["ratio"], 3)
    if mac is not None:  # kvtier with the MAC / kvtier without it (1.0 = free)
        tag = _size_tag(mac["block_bytes"])
        for k in ("store", "load"):
            ratios[f"mac_{k}_{tag}"] = round(mac["MBps_mac"][k] / mac["MBps_plain"][k], 3)
    doc = {
        "benchmark": "bench_fs",
        "reference": "raw loop, same bytes, same file system, same thread count: one file per block, "
        "or appends to one file for blocks on the small-block path (<= small_block_bytes)",
        "ratios": ratios,
        "results": results,
        "scan": scan,
        "mac": mac,
        "vllm": vllm_note,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if args.json:
        print(json.dumps(doc))
    else:
        for r in results:
            m = r["MBps"]
            bps = r["blocks_per_s"]
            print(f"{_size_tag(r['block_bytes']):>6} x {r['blocks']} in jobs of {r['job_blocks']}  "
                  f"threads={r['threads']} direct_io={r['direct_io']}  "
                  f"store {bps['store']:,} vs raw {bps['raw_store']:,} blocks/s")  # fmt: skip
            for op in ("store", "load") if r["job_blocks"] == r["blocks"] else ("store",):
                print(
                    f"  {op:<6} tier {m[op]:8.0f} MB/s  raw {m['raw_' + op]:8.0f} MB/s  "
                    f"ratio {r['ratio_' + op]:.2f}   (e2e {m[op + '_e2e']:.0f} MB/s, "
                    f"ratio {r['ratio_' + op + '_e2e']:.2f})"
                )
        if scan is not None:
            print(
                f"restart scan of {scan['files']} files: tier {scan['tier_files_per_s']:,.0f} files/s  "
                f"raw scandir+stat {scan['raw_files_per_s']:,.0f} files/s  ratio {scan['ratio']:.2f}"
            )
        if mac is not None:
            tag = _size_tag(mac["block_bytes"])
            for k in ("store", "load"):
                print(
                    f"MAC (shared_root) {tag} {k}: {mac['MBps_mac'][k]:.0f} MB/s vs "
                    f"{mac['MBps_plain'][k]:.0f} MB/s without, ratio {ratios[f'mac_{k}_{tag}']:.2f}"
                )
        print(vllm_note)
        print(f"done in {doc['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
