"""p2p fetch throughput between two processes on loopback, next to a raw socket transfer, same run.

A server process holds ``--blocks`` blocks of each size (default 1 MiB and 4 MiB) in a real
Engine's primary tier and runs two servers on 127.0.0.1:

* the kvtier **block server** (handshake, HMAC auth, pinning, per-block checksums when asked);
* a **raw socket** server: for each 4-byte request it sends the same rows of the same primary
  buffer with ``sendmsg`` (one scatter-gather call, as the block server), nothing else (no framing,
  no pinning, no checksum, no timeouts): the best a Python TCP transfer of these bytes can do.

This process fetches all blocks per round, into the rows of a destination buffer with
``recv_into``, over one connection each:

* **p2p**: ``PeerConnection.fetch`` (what a p2p tier worker does per chunk), ``verify`` off (the
  transport) and on (the tier's default: one xxh3 pass on each side);
* **raw**: request, then ``recv_into(..., MSG_WAITALL)`` of exactly the same bytes into the same
  rows. Both sides of both transfers use the same socket options (``TCP_NODELAY``, blocking with
  5 s kernel timeouts) and keep the kernel's socket buffer sizes (autotuned).

Each round runs raw and both p2p variants back to back (alternating the order), after
``--warmup`` rounds that are not counted; at least ``--repeat`` rounds are measured, and more (up
to ``--max-rounds``) while the size has run less than ``--seconds``. ``ratios`` (p2p / raw
throughput, the target is >= 0.8 for the transport) is the median over rounds of the paired
per-round ratio, which cancels most of the drift of a shared machine; ``spread`` gives the
per-round ratios' min, quartiles and max, and the GB/s figures are medians over rounds.
``--json`` prints ONE JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import struct
import sys
import threading
import time
from typing import Any

import numpy as np

from benchstats import paired_ratio, rounds  # benchmarks/benchstats.py, next to this script

SECRET = b"bench-p2p-secret"


def _keys(n: int) -> list[bytes]:
    return [b"bench-key-%06d" % i for i in range(n)]


def _server(block_bytes: int, n: int, conn: Any) -> None:
    from kvtier.engine import Engine
    from kvtier.keys import BlockKey
    from kvtier.p2p.server import BlockServer

    engine = Engine({"block_bytes": block_bytes, "cpu_bytes_to_use": block_bytes * (n + 1)})
    keys = [BlockKey(k) for k in _keys(n)]
    data = np.random.default_rng(1).integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    engine.store_blocks(keys, data)
    server = BlockServer(engine, secret=SECRET)
    rows = np.asarray(engine.primary_kv_view)
    slots = engine.serving.pin_resident(keys).slots  # held for the raw server's reads too
    raw = socket.create_server(("127.0.0.1", 0))

    def serve_raw() -> None:
        c, _ = raw.accept()
        _same_options(c)
        with c:
            while True:
                req = c.recv(4)
                if len(req) < 4:
                    return
                (count,) = struct.unpack("<I", req)
                _send_rows(c, [rows[int(s), :block_bytes].data for s in slots[:count]])

    threading.Thread(target=serve_raw, daemon=True).start()
    conn.send((server.port, raw.getsockname()[1], engine.namespace))
    conn.recv()  # run until told to stop
    server.close()
    raw.close()


def _same_options(sock: socket.socket) -> None:
    """The socket options of the block server's and PeerConnection's plain sockets: TCP_NODELAY,
    blocking, 5 s kernel timeouts. Measured here, a receiver with ``SO_RCVTIMEO`` reads 1 MiB
    blocks with ``MSG_WAITALL`` faster than one without, so the reference gets it too."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(None)
    for opt in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, opt, struct.pack("@ll", 5, 0))


def _send_rows(c: socket.socket, bufs: list[memoryview]) -> None:
    """All rows in as few ``sendmsg`` calls as the kernel takes (blocking socket, no timeout)."""
    while bufs:
        sent = c.sendmsg(bufs[:1024])
        while sent:
            if sent >= bufs[0].nbytes:
                sent -= bufs.pop(0).nbytes
            else:
                bufs[0], sent = bufs[0][sent:], 0


def _measure(block_bytes: int, n: int, repeat: int, warmup: int, seconds: float, most: int) -> dict[str, Any]:
    from kvtier.p2p.client import PeerConnection

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_server, args=(block_bytes, n, child), daemon=True)
    proc.start()
    try:
        p2p_port, raw_port, namespace = parent.recv()
        dest = np.zeros((n, block_bytes), dtype=np.uint8)
        views = [dest[i].data for i in range(n)]
        keys = _keys(n)
        peer = PeerConnection("127.0.0.1", p2p_port, block_bytes=block_bytes, layout="", namespace=namespace,
                              secret=SECRET, timeout=5.0)  # fmt: skip
        raw = socket.create_connection(("127.0.0.1", raw_port))
        _same_options(raw)
        times: dict[str, list[float]] = {"p2p": [], "p2p_verified": [], "raw": []}

        def raw_round() -> None:
            raw.sendall(struct.pack("<I", n))
            for v in views:
                got = 0
                while got < block_bytes:
                    k = raw.recv_into(v[got:], block_bytes - got, socket.MSG_WAITALL)
                    if k == 0:
                        raise ConnectionError("raw server closed")
                    got += k

        for r in rounds(warmup + repeat, warmup + most, seconds):
            order = ["raw", "p2p", "p2p_verified"] if r % 2 == 0 else ["p2p_verified", "p2p", "raw"]
            for what in order:
                t0 = time.perf_counter()
                if what == "raw":
                    raw_round()
                else:
                    ok = peer.fetch(keys, views, 60.0, verify=what == "p2p_verified")
                    assert all(ok), "a benchmark block failed to arrive"
                if r >= warmup:
                    times[what].append(time.perf_counter() - t0)
        peer.close()
        raw.close()
        total = n * block_bytes
        out: dict[str, Any] = {k: total / statistics.median(v) / 1e9 for k, v in times.items()}
        out["rounds"] = len(times["raw"])
        for k in ("p2p", "p2p_verified"):  # rounds are paired: the median of raw/p2p per round
            out[f"ratio_{k}"], out[f"spread_{k}"] = paired_ratio(times["raw"], times[k])
        return out
    finally:
        parent.send("stop")
        proc.join(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4", help="block sizes in MiB, comma-separated (default 1,4)")
    ap.add_argument("--blocks", type=int, default=64, help="blocks per round (default 64)")
    ap.add_argument("--repeat", type=int, default=9, help="measured rounds per size, at least (default 9)")
    ap.add_argument(
        "--seconds", type=float, default=10.0,
        help="more rounds (up to --max-rounds) while a size has run less than this (default 10)",
    )  # fmt: skip
    ap.add_argument("--max-rounds", type=int, default=60, help="rounds per size, at most (default 60)")
    ap.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted (default 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    results: dict[str, Any] = {"blocks": args.blocks, "rounds": {}, "gbps": {}, "ratios": {}, "spread": {}}
    for mib in (int(x) for x in args.sizes.split(",")):
        r = _measure(mib << 20, args.blocks, args.repeat, args.warmup, args.seconds, args.max_rounds)
        results["rounds"][f"{mib}MiB"] = r.pop("rounds")
        results["gbps"][f"{mib}MiB"] = r
        for k in ("p2p", "p2p_verified"):
            results["ratios"][f"{k}_{mib}MiB"] = r.pop(f"ratio_{k}")
            results["spread"][f"{k}_{mib}MiB"] = r.pop(f"spread_{k}")
    if args.json:
        print(json.dumps(results))
        return 0
    print(
        f"{'block':>6} {'p2p GB/s':>9} {'verified':>9} {'raw GB/s':>9} {'ratio':>6} {'ratio(verified)':>16}"
        "  per-round ratio min-max"
    )
    for mib in (int(x) for x in args.sizes.split(",")):
        r, q = results["gbps"][f"{mib}MiB"], results["ratios"]
        sp = results["spread"][f"p2p_{mib}MiB"]
        print(f"{mib:>4}Mi {r['p2p']:>9.2f} {r['p2p_verified']:>9.2f} {r['raw']:>9.2f} "
              f"{q[f'p2p_{mib}MiB']:>6.2f} {q[f'p2p_verified_{mib}MiB']:>16.2f}"
              f"  {sp['min']:.2f}-{sp['max']:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
