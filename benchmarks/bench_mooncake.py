"""mooncake tier throughput through the engine, next to Mooncake's own batched zero-copy calls moving
the same bytes, same run, same store.

A ``mooncake_master`` and a separate ``mooncake_client`` holder are started on free loopback ports
(``MC_TCP_BIND_ADDRESS=127.0.0.1``; or ``--master``/``--metadata`` name a running store). For each
block size (default 256 KiB, 1 MiB and 2 MiB, 32 blocks each):

* **tier store**: ``Engine.prepare_store`` + copy into the primary slots + ``complete_store``; timed
  from ``complete_store`` until ``drain()`` returns: the tier's job (checksum, header, the batched
  multi-buffer put of header + slot).
* **tier load**: ``Engine.reset()`` empties the primary tier; ``lookup`` finds every key in the tier
  and promotes them (batched multi-buffer get, header and checksum verified); timed until every key
  is a hit.
* **raw store / load**: a plain ``MooncakeDistributedStore`` with a registered buffer holding the
  same bytes: ``batch_put_from`` / ``batch_get_into`` of exactly the payloads (no header, no
  checksum) in the tier's chunks over the same number of threads (``ratios`` ``store_<size>``,
  ``load_<size>``), and as one call for all blocks (``..._vs_one_call``). Every variant gets the same
  number of rounds (a best-of over more samples would favour it on a noisy machine).

Each figure is the best of ``--repeat`` rounds (fresh keys each round, tier and raw alternating which
goes first; keys are removed after each round so the store never fills). ``--json`` prints ONE JSON
object whose ``ratios`` are tier / raw throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.engine import Engine
from kvtier.keys import BlockKey
from kvtier.tiers.mooncake import MooncakeTier

_TESTS = Path(__file__).resolve().parents[1] / "tests" / "integration"


def _raw_round(
    client: Any, pool: ThreadPoolExecutor, buf: np.ndarray, names: list[str], per: int
) -> dict[str, float]:
    n, bb = buf.shape[0] // 2, buf.shape[1]
    base = int(buf.ctypes.data)
    src = [base + i * bb for i in range(n)]
    dst = [base + (n + i) * bb for i in range(n)]
    out: dict[str, float] = {}

    def chunked(fn: Any, keys: list[str], ptrs: list[int], expect: int) -> None:
        jobs = [
            pool.submit(fn, keys[lo : lo + per], ptrs[lo : lo + per], [bb] * len(keys[lo : lo + per]))
            for lo in range(0, n, per)
        ]
        for j in jobs:
            if any(code != expect for code in j.result()):
                raise RuntimeError("raw Mooncake call failed")

    for mode in ("one", "chunked"):
        tag = [f"{x}-{mode}" for x in names]
        t0 = time.perf_counter()
        if mode == "one":
            codes = client.batch_put_from(tag, src, [bb] * n)
        else:
            chunked(client.batch_put_from, tag, src, 0)
            codes = [0]
        t1 = time.perf_counter()
        if any(codes):
            raise RuntimeError(f"raw batch_put_from answered {codes[:4]}")
        buf[n:] = 0
        t2 = time.perf_counter()
        if mode == "one":
            codes = client.batch_get_into(tag, dst, [bb] * n)
            if any(c != bb for c in codes):
                raise RuntimeError(f"raw batch_get_into answered {codes[:4]}")
        else:
            chunked(client.batch_get_into, tag, dst, bb)
        t3 = time.perf_counter()
        if not np.array_equal(buf[:n], buf[n:]):
            raise RuntimeError("raw Mooncake calls returned wrong bytes")
        client.batch_remove(tag, True)
        out[f"raw_store_{mode}"] = t1 - t0
        out[f"raw_load_{mode}"] = t3 - t2
    return out


def _tier_round(eng: Engine, keys: list[BlockKey], data: np.ndarray, out: np.ndarray) -> dict[str, float]:
    n = len(keys)
    rows = eng.primary.rows
    h = eng.prepare_store(keys)
    for i, s in enumerate(h.slot_ids):
        rows[s, : eng.block_bytes] = data[i]
    t1 = time.perf_counter()
    eng.complete_store(h)
    eng.drain()
    t2 = time.perf_counter()
    eng.reset()  # empty the primary tier: every key must come back from the store
    t3 = time.perf_counter()
    rep = eng.lookup(keys)
    while rep.num_hits < n:
        if rep.num_hits + rep.pending < n and not rep.codes.count(3):
            raise RuntimeError(f"mooncake tier lost blocks: {rep.codes.count(0)} of {n} missed")
        eng.drain()
        rep = eng.lookup(keys)
    t4 = time.perf_counter()
    if eng.load_blocks(keys, out) != n or not np.array_equal(out, data):
        raise RuntimeError("mooncake tier returned wrong bytes")
    eng.reset()
    return {"store": t2 - t1, "load": t4 - t3}


def bench_size(
    master: str, metadata: str, client: Any, block_bytes: int, blocks: int, threads: int, repeat: int
) -> dict[str, Any]:
    per = max(1, -(-blocks // threads))
    tier_cfg = {
        "type": "mooncake",
        "master_server_addr": master,
        "metadata_server": metadata,
        "threads": threads,
        "batch_blocks": per,
        "key_prefix": f"bench-{os.getpid()}",
    }
    cfg = {
        "block_bytes": block_bytes,
        "cpu_bytes_to_use": block_bytes * blocks,
        "model": f"bench-mooncake-{block_bytes}",
        "secondary_tiers": [tier_cfg],
    }
    rng = np.random.default_rng(block_bytes)
    data = rng.integers(0, 256, (blocks, block_bytes), dtype=np.uint8)
    out = np.zeros_like(data)
    buf = np.zeros((2 * blocks, block_bytes), dtype=np.uint8)
    buf[:blocks] = data
    if client.register_buffer(int(buf.ctypes.data), int(buf.nbytes)) != 0:
        raise RuntimeError("register_buffer failed")
    best: dict[str, float] = {}
    try:
        with Engine(cfg) as eng, ThreadPoolExecutor(threads) as pool:
            tier = eng.tiers[0]
            assert isinstance(tier, MooncakeTier)
            for r in range(repeat):
                keys = [BlockKey(f"b{block_bytes}/{r}/{i}".encode()) for i in range(blocks)]
                names = [f"raw-{os.getpid()}/{block_bytes}/{r}/{i}" for i in range(blocks)]
                got: dict[str, float] = {}
                for side in ("tier", "raw") if r % 2 == 0 else ("raw", "tier"):
                    if side == "tier":
                        got.update(_tier_round(eng, keys, data, out))
                        client.batch_remove([tier._name(k) for k in keys], True)
                    else:
                        got.update(_raw_round(client, pool, buf, names, per))
                for k, v in got.items():
                    best[k] = min(best.get(k, float("inf")), v)
            stats = tier.get_stats()
    finally:
        client.unregister_buffer(int(buf.ctypes.data))
    mb = blocks * block_bytes / 1e6
    tput = {k: mb / v for k, v in best.items()}
    return {
        "block_bytes": block_bytes,
        "blocks": blocks,
        "threads": threads,
        "MBps": {k: round(v, 1) for k, v in tput.items()},
        "ratio_store": tput["store"] / tput["raw_store_chunked"],
        "ratio_load": tput["load"] / tput["raw_load_chunked"],
        "ratio_store_vs_one_call": tput["store"] / tput["raw_store_one"],
        "ratio_load_vs_one_call": tput["load"] / tput["raw_load_one"],
        "corrupt": stats["corrupt"],
        "failed_jobs": stats["failed_jobs"],
    }


def _size_tag(n: int) -> str:
    return f"{n >> 20}MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10}KiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sizes", default="262144,1048576,2097152", help="block sizes in bytes, comma separated")
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=12)
    ap.add_argument("--master", help="host:port of a running mooncake_master (default: start one)")
    ap.add_argument("--metadata", help="its metadata server URL (with --master)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    from mooncake.store import MooncakeDistributedStore

    store = None
    if args.master:
        master, metadata = args.master, args.metadata
    else:
        sys.path.insert(0, str(_TESTS))
        from mooncake_servers import MooncakeStore

        store = MooncakeStore(Path(tempfile.mkdtemp(prefix="bench-mooncake-")), segment="2GB")
        master, metadata = store.master_addr, store.metadata_server
    client = MooncakeDistributedStore()
    try:
        if client.setup("127.0.0.1", metadata, 0, 16 << 20, "tcp", "", master) != 0:
            raise RuntimeError(f"mooncake setup with {master} failed")
        results = [
            bench_size(master, metadata, client, int(s), args.blocks, args.threads, args.repeat)
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
        ratios[f"store_{tag}_vs_one_call"] = round(r["ratio_store_vs_one_call"], 3)
        ratios[f"load_{tag}_vs_one_call"] = round(r["ratio_load_vs_one_call"], 3)
    doc = {"bench": "mooncake", "results": results, "ratios": ratios}
    if args.json:
        print(json.dumps(doc))
    else:
        for r in results:
            m = r["MBps"]
            print(
                f"{_size_tag(r['block_bytes']):>7}  store {m['store']:7.1f} MB/s"
                f" (raw {m['raw_store_chunked']:7.1f}, one call {m['raw_store_one']:7.1f})"
                f"  load {m['load']:7.1f} MB/s"
                f" (raw {m['raw_load_chunked']:7.1f}, one call {m['raw_load_one']:7.1f})"
                f"  ratios {r['ratio_store']:.2f} / {r['ratio_load']:.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
