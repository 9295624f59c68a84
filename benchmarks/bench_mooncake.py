"""mooncake tier throughput through the engine, next to Mooncake's own batched zero-copy calls moving
the same bytes, same run, same store.

A ``mooncake_master`` and a separate ``mooncake_client`` holder are started on free loopback ports
(``MC_TCP_BIND_ADDRESS=127.0.0.1``; or ``--master``/``--metadata`` name a running store). For each
block size (default 256 KiB, 1 MiB and 2 MiB, 32 blocks each):

* **tier store**: ``Engine.prepare_store`` + copy into the primary slots (not timed) +
  ``complete_store``; timed from ``complete_store`` until ``drain()`` returns: the tier's job
  (checksum, header, ONE batched put for the whole job, staged or zero-copy as the tier's
  thresholds choose: the tier runs with ``batch_blocks`` = the job's blocks and does not split a
  job over its workers).
* **tier load**: after ``Engine.reset()`` emptied the primary tier, ``lookup`` finds every key in
  the tier and promotes them (one batched get, header and checksum verified); timed
  until every key is a hit.
* **raw store / load**: a plain ``MooncakeDistributedStore`` with a registered buffer holding the
  same bytes: ``batch_put_from`` / ``batch_get_into`` of exactly the payloads (no header, no
  checksum), both ways a caller could batch them: **one call** for the job (the tier's batching)
  and **chunked**, the job split over ``--threads`` threads in concurrent calls.

``ratios`` ``store_<size>`` / ``load_<size>`` are against the **faster raw variant of each round**
(the strongest reference: whichever batching the raw client does best on this machine);
``..._vs_one_call`` and ``..._vs_chunked`` against each variant alone.

* **format** (not a reference: a ceiling): the same raw client moving the blocks *in the block
  format* with nothing else -- each payload's header (one xxh3 pass) written in front of it, one
  call for the job, and on load the header recomputed and compared -- from padded rows like the
  tier's. ``ceiling`` maps ``store_<size>`` / ``load_<size>`` to format / raw: what the checksum
  and the header (40 + key bytes more per object) cost by themselves, before any engine work;
  ``..._vs_format`` is the tier against it (the engine's own share).

Each round runs the three stores back to back, then the three loads, in an order rotated from
round to round; ``--warmup`` rounds run first and are not counted, then at least ``--repeat``
rounds are, and more (up to ``--max-rounds``) while the size has run less than ``--seconds``.
Fresh keys every round, removed after it, so the store never fills. Ratios (tier / raw
throughput) are the median over rounds of the per-round ratio (pairing within a round cancels the
drift of a shared machine), ``spread`` their min, quartiles and max; ``MBps`` are medians.
``--json`` prints ONE JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchstats import paired_ratio, rounds  # benchmarks/benchstats.py, next to this script
from kvtier import codec
from kvtier.config import row_stride
from kvtier.engine import Engine
from kvtier.keys import BlockKey
from kvtier.tiers.mooncake import MooncakeTier

_TESTS = Path(__file__).resolve().parents[1] / "tests" / "integration"


def _chunked(
    pool: ThreadPoolExecutor, fn: Any, names: list[str], ptrs: list[int], bb: int, per: int
) -> list[int]:
    """``fn`` over chunks of ``per`` keys on the pool's threads (as the tier spreads a job)."""
    jobs = [
        pool.submit(fn, names[lo : lo + per], ptrs[lo : lo + per], [bb] * len(names[lo : lo + per]))
        for lo in range(0, len(names), per)
    ]
    return [code for j in jobs for code in j.result()]


class _Raw:
    """Mooncake's own batched zero-copy calls on a registered buffer: rows ``[0, n)`` are the
    payloads, rows ``[n, 2n)`` the destination of loads."""

    def __init__(self, client: Any, pool: ThreadPoolExecutor, buf: np.ndarray, per: int) -> None:
        self.client, self.pool, self.buf, self.per = client, pool, buf, per
        self.n, self.bb = buf.shape[0] // 2, buf.shape[1]
        base = int(buf.ctypes.data)
        self.src = [base + i * self.bb for i in range(self.n)]
        self.dst = [base + (self.n + i) * self.bb for i in range(self.n)]

    def store(self, names: list[str], one_call: bool) -> float:
        c = self.client
        t0 = time.perf_counter()
        if one_call:
            codes = c.batch_put_from(names, self.src, [self.bb] * self.n)
        else:
            codes = _chunked(self.pool, c.batch_put_from, names, self.src, self.bb, self.per)
        dt = time.perf_counter() - t0
        if any(codes):
            raise RuntimeError(f"raw batch_put_from answered {codes[:4]}")
        return dt

    def load(self, names: list[str], one_call: bool) -> float:
        c, n, bb = self.client, self.n, self.bb
        t0 = time.perf_counter()
        if one_call:
            codes = c.batch_get_into(names, self.dst, [bb] * n)
        else:
            codes = _chunked(self.pool, c.batch_get_into, names, self.dst, bb, self.per)
        dt = time.perf_counter() - t0
        if any(code != bb for code in codes) or not np.array_equal(self.buf[:n], self.buf[n:]):
            raise RuntimeError(f"raw batch_get_into failed or returned wrong bytes ({codes[:4]})")
        # Zeroed for the next load's check here, not right before the timed call: a memset just
        # before it would leave the destination dirty in the cache while the get writes it.
        self.buf[n:] = 0
        return dt


class _Format:
    """The raw client and the block format, nothing else: rows of ``block_bytes`` after a page of
    room (the tier's in-place layout); the header ends where the payload starts."""

    PAD = 4096

    def __init__(self, client: Any, data: np.ndarray, ns: str) -> None:
        n, bb = data.shape
        self.client, self.data, self.n, self.bb = client, data, n, bb
        self.buf = np.zeros((2 * n, self.PAD + bb), dtype=np.uint8)
        self.buf[:n, self.PAD :] = data
        self.make = codec.HeaderMaker(codec.namespace_tag(ns), bb)
        self.mv = self.buf.reshape(-1).data
        self.base, self.stride = int(self.buf.ctypes.data), self.PAD + bb

    def _objects(self, keys: list[BlockKey], first: int) -> tuple[list[int], list[int]]:
        ptrs, sizes = [], []
        for i, key in enumerate(keys):
            at = (first + i) * self.stride + self.PAD
            ptrs.append(self.base + at - codec.FIXED_HEADER_SIZE - len(key))
            sizes.append(codec.FIXED_HEADER_SIZE + len(key) + self.bb)
        return ptrs, sizes

    def store(self, keys: list[BlockKey], names: list[str]) -> float:
        mv, make, bb = self.mv, self.make, self.bb
        t0 = time.perf_counter()
        for i, key in enumerate(keys):
            at = i * self.stride + self.PAD
            mv[at - codec.FIXED_HEADER_SIZE - len(key) : at] = make(key, mv[at : at + bb])
        codes = self.client.batch_put_from(names, *self._objects(keys, 0))
        dt = time.perf_counter() - t0
        if any(codes):
            raise RuntimeError(f"format batch_put_from answered {codes[:4]}")
        return dt

    def load(self, keys: list[BlockKey], names: list[str]) -> float:
        mv, make, bb, n = self.mv, self.make, self.bb, self.n
        t0 = time.perf_counter()
        ptrs, sizes = self._objects(keys, n)
        codes = self.client.batch_get_into(names, ptrs, sizes)
        good = 0
        for i, (key, code) in enumerate(zip(keys, codes, strict=True)):
            at = (n + i) * self.stride + self.PAD
            hlen = codec.FIXED_HEADER_SIZE + len(key)
            good += code == hlen + bb and mv[at - hlen : at].tobytes() == make(key, mv[at : at + bb])
        dt = time.perf_counter() - t0
        if good != n or not np.array_equal(self.buf[n:, self.PAD :], self.data):
            raise RuntimeError(f"format batch_get_into failed or returned wrong bytes ({codes[:4]})")
        self.buf[n:] = 0  # zeroed here, not right before the timed call (see _Raw.load)
        return dt


class _Tier:
    """The same blocks through the engine and its mooncake tier."""

    def __init__(self, eng: Engine, data: np.ndarray) -> None:
        self.eng, self.data, self.out = eng, data, np.zeros_like(data)

    def store(self, keys: list[BlockKey]) -> float:
        eng = self.eng
        h = eng.prepare_store(keys)
        rows = eng.primary.rows
        for i, s in enumerate(h.slot_ids):
            rows[s, : eng.block_bytes] = self.data[i]
        t0 = time.perf_counter()
        eng.complete_store(h)
        eng.drain()
        dt = time.perf_counter() - t0
        # Zeroed (and the primary tier emptied): every key's bytes must come back from the store.
        rows[np.asarray(h.slot_ids), : eng.block_bytes] = 0
        eng.reset()
        return dt

    def load(self, keys: list[BlockKey]) -> float:
        eng, n = self.eng, len(keys)
        t0 = time.perf_counter()
        rep = eng.lookup(keys)
        while rep.num_hits < n:
            if rep.num_hits + rep.pending < n and not rep.codes.count(3):
                raise RuntimeError(f"mooncake tier lost blocks: {rep.codes.count(0)} of {n} missed")
            eng.drain()
            rep = eng.lookup(keys)
        dt = time.perf_counter() - t0
        if eng.load_blocks(keys, self.out) != n or not np.array_equal(self.out, self.data):
            raise RuntimeError("mooncake tier returned wrong bytes")
        eng.reset()
        return dt


#: The variants of one round, by the name their time is reported under.
_STORES = ("store", "raw_store_chunked", "raw_store_one", "format_store")
_LOADS = ("load", "raw_load_chunked", "raw_load_one", "format_load")
#: Name suffixes of the raw and format variants' objects.
_SUFFIXES = ("c", "o", "f")


def _round(
    tier: _Tier, raw: _Raw, fmt: _Format, keys: list[BlockKey], names: list[str], r: int
) -> dict[str, float]:
    """One round: the four stores back to back, then the four loads, the order rotated by round
    (so no variant always runs first, or right after another)."""
    chunked, one, framed = ([f"{x}-{m}" for x in names] for m in _SUFFIXES)
    run: dict[str, Any] = {
        "store": lambda: tier.store(keys), "load": lambda: tier.load(keys),
        "raw_store_chunked": lambda: raw.store(chunked, False),
        "raw_load_chunked": lambda: raw.load(chunked, False),
        "raw_store_one": lambda: raw.store(one, True), "raw_load_one": lambda: raw.load(one, True),
        "format_store": lambda: fmt.store(keys, framed), "format_load": lambda: fmt.load(keys, framed),
    }  # fmt: skip
    v = len(_STORES)
    k = r % v
    order = [*_STORES[k:], *_STORES[:k], *_LOADS[k:], *_LOADS[:k]]
    if (r // v) % 2:
        order = [*reversed(order[:v]), *reversed(order[v:])]
    return {what: run[what]() for what in order}


def bench_size(
    master: str, metadata: str, client: Any, block_bytes: int, blocks: int, threads: int, repeat: int,
    warmup: int = 1, seconds: float = 0.0, max_rounds: int = 60, tier_options: dict[str, Any] | None = None,
    row_pad: int = 4096,
) -> dict[str, Any]:  # fmt: skip
    per = max(1, -(-blocks // threads))
    tier_cfg = {
        "type": "mooncake",
        "master_server_addr": master,
        "metadata_server": metadata,
        "threads": threads,
        "batch_blocks": blocks,  # a job is one batched call, like the raw one-call variant
        "key_prefix": f"bench-{os.getpid()}",
        **(tier_options or {}),
    }
    cfg = {
        "block_bytes": block_bytes,
        "cpu_bytes_to_use": row_stride(block_bytes, row_pad) * blocks,
        "primary_row_pad": row_pad,
        "model": f"bench-mooncake-{block_bytes}",
        "secondary_tiers": [tier_cfg],
    }
    rng = np.random.default_rng(block_bytes)
    data = rng.integers(0, 256, (blocks, block_bytes), dtype=np.uint8)
    buf = np.zeros((2 * blocks, block_bytes), dtype=np.uint8)
    buf[:blocks] = data
    if client.register_buffer(int(buf.ctypes.data), int(buf.nbytes)) != 0:
        raise RuntimeError("register_buffer failed")
    done: list[dict[str, float]] = []
    try:
        with Engine(cfg) as eng, ThreadPoolExecutor(threads) as pool:
            mtier = eng.tiers[0]
            assert isinstance(mtier, MooncakeTier)
            tier, raw = _Tier(eng, data), _Raw(client, pool, buf, per)
            fmt = _Format(client, data, mtier.context.namespace)
            if client.register_buffer(int(fmt.buf.ctypes.data), int(fmt.buf.nbytes)) != 0:
                raise RuntimeError("register_buffer failed")
            for r in rounds(warmup + repeat, warmup + max_rounds, seconds):
                keys = [BlockKey(f"b{block_bytes}/{r}/{i}".encode()) for i in range(blocks)]
                names = [f"raw-{os.getpid()}/{block_bytes}/{r}/{i}" for i in range(blocks)]
                times = _round(tier, raw, fmt, keys, names, r)
                # Fresh keys every round; removed after it, so the store never fills.
                client.batch_remove([mtier._name(k) for k in keys], True)
                client.batch_remove([f"{x}-{m}" for x in names for m in _SUFFIXES], True)
                if r >= warmup:
                    done.append(times)
            stats, data_path = mtier.get_stats(), mtier.config_info()["data_path"]
            client.unregister_buffer(int(fmt.buf.ctypes.data))
    finally:
        client.unregister_buffer(int(buf.ctypes.data))
    # The headline reference is the faster raw variant of each round (the strongest one).
    for t in done:
        t["raw_store_best"] = min(t["raw_store_chunked"], t["raw_store_one"])
        t["raw_load_best"] = min(t["raw_load_chunked"], t["raw_load_one"])
    mb = blocks * block_bytes / 1e6
    out: dict[str, Any] = {
        "block_bytes": block_bytes, "blocks": blocks, "threads": threads, "rounds": len(done),
        "data_path": data_path,
        "MBps": {k: round(mb / statistics.median(t[k] for t in done), 1) for k in done[0]},
    }  # fmt: skip
    # Per round, tier throughput / raw throughput of the same bytes (= raw time / tier time); the
    # median over rounds, with its spread. Pairing within a round cancels the drift of a shared
    # machine that a best-of or a ratio of medians would keep.
    for name, tier_key, raw_key in (
        ("store", "store", "raw_store_best"), ("load", "load", "raw_load_best"),
        ("store_vs_one_call", "store", "raw_store_one"), ("load_vs_one_call", "load", "raw_load_one"),
        ("store_vs_chunked", "store", "raw_store_chunked"), ("load_vs_chunked", "load", "raw_load_chunked"),
        ("store_vs_format", "store", "format_store"), ("load_vs_format", "load", "format_load"),
        ("ceiling_store", "format_store", "raw_store_best"), ("ceiling_load", "format_load", "raw_load_best"),
    ):  # fmt: skip
        ratio, spread = paired_ratio([t[raw_key] for t in done], [t[tier_key] for t in done])
        out[f"ratio_{name}"] = ratio
        out.setdefault("spread", {})[name] = spread
    out["corrupt"], out["failed_jobs"] = stats["corrupt"], stats["failed_jobs"]
    return out


def _size_tag(n: int) -> str:
    return f"{n >> 20}MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10}KiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sizes", default="262144,1048576,2097152", help="block sizes in bytes, comma separated")
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=8, help="measured rounds per size, at least (default 8)")
    ap.add_argument(
        "--seconds", type=float, default=13.0,
        help="more rounds (up to --max-rounds) while a size has run less than this (default 13)",
    )  # fmt: skip
    ap.add_argument(
        "--max-rounds", type=int, default=60, help="measured rounds per size, at most (default 60)"
    )
    ap.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted (default 1)")
    ap.add_argument("--master", help="host:port of a running mooncake_master (default: start one)")
    ap.add_argument("--metadata", help="its metadata server URL (with --master)")
    ap.add_argument(
        "--staging-max-block", type=int, help="the tier's staging_max_block (default: the tier's, 512 KiB)"
    )
    ap.add_argument(
        "--store-staging-max-block", type=int,
        help="the tier's store_staging_max_block (default: the tier's, 2 MiB)",
    )  # fmt: skip
    ap.add_argument(
        "--row-pad", type=int, default=4096,
        help="the engine's primary_row_pad (default 4096, as docs/remote.md configures it: blocks move "
        "in place; 0: staged / zero-copy as the thresholds choose)",
    )  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    sys.path.insert(0, str(_TESTS))
    # The store's processes without pytest: a missing install is one line, not a traceback.
    from mooncake_procs import MooncakeStore, missing

    reason = missing(executables=not args.master)
    if reason is not None:
        print(f"bench_mooncake: {reason}", file=sys.stderr)
        return 2
    from mooncake.store import MooncakeDistributedStore

    store = None
    if args.master:
        master, metadata = args.master, args.metadata
    else:
        store = MooncakeStore(Path(tempfile.mkdtemp(prefix="bench-mooncake-")), segment="2GB")
        master, metadata = store.master_addr, store.metadata_server
    client = MooncakeDistributedStore()
    try:
        if client.setup("127.0.0.1", metadata, 0, 16 << 20, "tcp", "", master) != 0:
            raise RuntimeError(f"mooncake setup with {master} failed")
        opts = (args.blocks, args.threads, args.repeat, args.warmup, args.seconds, args.max_rounds)
        extra: dict[str, Any] = {}
        for opt in ("staging_max_block", "store_staging_max_block"):
            if getattr(args, opt) is not None:
                extra[opt] = getattr(args, opt)
        results = [
            bench_size(master, metadata, client, int(s), *opts, tier_options=extra, row_pad=args.row_pad)
            for s in args.sizes.split(",")
        ]
        client.close()
    finally:
        if store is not None:
            store.stop()
    ratios: dict[str, float] = {}
    for r in results:
        tag = _size_tag(r["block_bytes"])
        ratios[f"store_{tag}"] = round(r["ratio_store"], 3)
        ratios[f"load_{tag}"] = round(r["ratio_load"], 3)
        for against in ("one_call", "chunked", "format"):
            ratios[f"store_{tag}_vs_{against}"] = round(r[f"ratio_store_vs_{against}"], 3)
            ratios[f"load_{tag}_vs_{against}"] = round(r[f"ratio_load_vs_{against}"], 3)
    spread = {f"{k}_{_size_tag(r['block_bytes'])}": v for r in results for k, v in r["spread"].items()}
    ceiling = {
        f"{op}_{_size_tag(r['block_bytes'])}": round(r[f"ratio_ceiling_{op}"], 3)
        for r in results
        for op in ("store", "load")
    }
    doc = {"bench": "mooncake", "results": results, "ratios": ratios, "ceiling": ceiling, "spread": spread}
    if args.json:
        print(json.dumps(doc))
    else:
        for r in results:
            m = r["MBps"]
            print(
                f"{_size_tag(r['block_bytes']):>7}  store {m['store']:7.1f} MB/s"
                f" (raw chunked {m['raw_store_chunked']:7.1f}, one call {m['raw_store_one']:7.1f})"
                f"  load {m['load']:7.1f} MB/s"
                f" (raw chunked {m['raw_load_chunked']:7.1f}, one call {m['raw_load_one']:7.1f})"
                f"  ratios vs the faster raw {r['ratio_store']:.2f} / {r['ratio_load']:.2f}"
                f" (per-round min-max {r['spread']['store']['min']:.2f}-{r['spread']['store']['max']:.2f}"
                f" / {r['spread']['load']['min']:.2f}-{r['spread']['load']['max']:.2f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
