"""Serving p2p from a vLLM instance's primary tier, next to kvtier's own engine serving, same run.

Both servers are kvtier's :class:`~kvtier.tiers.p2p.server.BlockServer` on 127.0.0.1 in this process,
holding the same ``--blocks`` blocks of ``--row-kib`` KiB:

* **vllm**: vLLM 0.33's own ``TieringOffloadingSpec`` and ``TieringOffloadingManager`` (CPU primary
  tier over ``/dev/shm``) with a ``KvtierTier`` p2p entry that serves; every LOOKUP and FETCH is
  queued and answered by vLLM's tier-poll thread in ``serve_external_requests`` (the pin is a vLLM
  job, released through ``get_finished_jobs``) -- what a vLLM engine does between steps;
* **reference**: a kvtier ``Engine``'s primary tier served directly by the server's connection
  thread (``Engine.serving`` pins), the path kvtier's own engines use.

One client thread keeps one authenticated connection to each; a round is one LOOKUP of every block
and one FETCH of all of them (checksums on, as the p2p tier asks) from each server, in alternating
order. The ratio is the median over rounds of reference seconds / vllm seconds (higher is better;
1.0 = serving through vLLM's thread costs nothing). The difference is the hop to vLLM's thread:
up to one tier-poll interval (vLLM's default 1 ms) per request, plus the manager's lock.

    PYTHONPATH=src python benchmarks/bench_vllm_p2p_serve.py [--json] [--blocks 32] [--row-kib 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
warnings.simplefilter("ignore")  # vLLM's and torch's import-time deprecations are not measured

from vllm_helpers import ADAPTER, VllmStack, offload_keys, offloading_config, payload  # noqa: E402
from vllm_peer import Peer  # noqa: E402

from benchstats import paired_ratio, rounds  # noqa: E402
from kvtier.tiers.p2p.client import PeerConnection, parse_peer  # noqa: E402

SECRET_ENV = "KVTIER_BENCH_P2P_SECRET"
SECRET = "bench-vllm-p2p-serve"


def _round(conn: PeerConnection, keys: list[bytes], dests: list[memoryview]) -> float:
    t0 = time.perf_counter()
    held = conn.lookup(keys, 5.0)
    got = conn.fetch(keys, dests, 30.0, True)
    dt = time.perf_counter() - t0
    if not all(held) or not all(g is True for g in got):
        raise RuntimeError(f"a server missed blocks: held {sum(held)}, fetched {sum(g is True for g in got)}")
    return dt


def _connect(address: str, row: int, namespace: str) -> PeerConnection:
    host, port = parse_peer(address)
    return PeerConnection(
        host, port, block_bytes=row, layout="", namespace=namespace, secret=SECRET.encode(), timeout=5.0
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--row-kib", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not 1 <= args.blocks <= 1024 or not 4 <= args.row_kib <= 16384:
        sys.exit("--blocks must be in 1..1024 and --row-kib in 4..16384")
    os.environ[SECRET_ENV] = SECRET
    row = args.row_kib * 1024
    keys = offload_keys(args.blocks, salt=b"bench-serve")
    entry = {**ADAPTER, "tier": "p2p", "secret_env": SECRET_ENV, "serve": {"port": 0}}
    extra = {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": (args.blocks + 8) * row,
        "secondary_tiers": [entry],
    }
    stack = VllmStack(offloading_config(extra, row_bytes=row))
    peer = None
    conns: list[PeerConnection] = []
    try:
        stack.store(keys)
        namespace = stack.tier.namespace.root.hex()
        peer = Peer(keys, SECRET, block_bytes=row)
        peer.namespace = namespace
        vllm_conn = _connect(stack.tier.block_service.address, row, namespace)
        ref_conn = _connect(peer.address, row, namespace)
        conns = [vllm_conn, ref_conn]
        dest = np.zeros((args.blocks, row), dtype=np.uint8)
        dests = [dest[i].data for i in range(args.blocks)]
        for conn in (vllm_conn, ref_conn):  # warm-up, and both serve the same bytes
            _round(conn, keys, dests)
            for i, k in enumerate(keys):
                if not np.array_equal(dest[i], payload(k, row)):
                    raise RuntimeError("a server sent other bytes than the block stored")
        vllm_s: list[float] = []
        ref_s: list[float] = []
        for r in rounds(10, 400, args.seconds):
            pair = [(vllm_conn, vllm_s), (ref_conn, ref_s)]
            for conn, out in pair if r % 2 == 0 else pair[::-1]:
                out.append(_round(conn, keys, dests))
        ratio, spread = paired_ratio(ref_s, vllm_s)
        mib = args.blocks * row / 2**20
        result: dict[str, Any] = {
            "blocks": args.blocks,
            "row_bytes": row,
            "rounds": len(vllm_s),
            "vllm_ms": round(statistics.median(vllm_s) * 1e3, 3),
            "reference_ms": round(statistics.median(ref_s) * 1e3, 3),
            "vllm_mib_s": round(mib / statistics.median(vllm_s), 1),
            "reference_mib_s": round(mib / statistics.median(ref_s), 1),
            "ratios": {"lookup_fetch_time": round(ratio, 3)},
            "spread": {"lookup_fetch_time": spread},
        }
    finally:
        for c in conns:
            c.close()
        if peer is not None:
            peer.close()
        stack.close()
    if args.json:
        print(json.dumps(result))
        return
    r = result
    print(f"{args.blocks} blocks x {args.row_kib} KiB, one LOOKUP + one FETCH a round, {r['rounds']} rounds")
    print(f"  vLLM-served (tier-poll thread) {r['vllm_ms']:9.3f} ms  {r['vllm_mib_s']:8.1f} MiB/s")
    print(f"  kvtier engine (reference)      {r['reference_ms']:9.3f} ms  {r['reference_mib_s']:8.1f} MiB/s")
    print(f"  ratio reference/vllm time: {ratio:.3f} (spread {spread})")


if __name__ == "__main__":
    main()
