"""One kvtier instance in its own process for the p2p tests: an Engine with a ``p2p`` tier.

Run as ``python p2p_node.py CONFIG_JSON``; prints ``ready <block server address>`` and then answers
line commands on stdin (one reply line each):

``store SEED N``   store the N blocks of :func:`blocks` ``(SEED, N)``; replies ``stored N``
``get SEED N T``   look up those keys until all are HIT (engine.poll between tries, at most T s),
                   load the ones that are and reply ``got <sha256 hex of each or ->`` (space-separated)
``local``          store and load one private block; replies ``local ok`` (the engine still serves)
``stats``          reply ``stats <json of the p2p tier's stats>``
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import numpy as np

from kvtier.engine import Engine
from kvtier.keys import BlockKey, LookupCode


def blocks(seed: int, n: int, block_bytes: int) -> tuple[list[BlockKey], np.ndarray]:
    """Deterministic keys and payloads (every process derives the same ones)."""
    rng = np.random.default_rng(seed)
    keys = [BlockKey(hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=16).digest()) for i in range(n)]
    return keys, rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)


def digest(row: np.ndarray) -> str:
    return hashlib.sha256(row.tobytes()).hexdigest()


def main() -> None:
    config = json.loads(sys.argv[1])
    bb = config["block_bytes"]
    with Engine(config) as engine:
        service = engine.serving.block_service
        print("ready", service.address if service else "-", flush=True)
        for line in sys.stdin:
            cmd, *args = line.split()
            if cmd == "store":
                keys, data = blocks(int(args[0]), int(args[1]), bb)
                n = engine.store_blocks(keys, data)
                if service is not None and service.publisher is not None:
                    service.publisher.flush()
                print("stored", n, flush=True)
            elif cmd == "get":
                keys, _ = blocks(int(args[0]), int(args[1]), bb)
                deadline = time.monotonic() + float(args[2])
                while True:
                    report = engine.lookup(keys)
                    if all(c == LookupCode.HIT for c in report.codes) or time.monotonic() > deadline:
                        break
                    engine.poll()
                    time.sleep(0.02)
                out = []
                for key, code in zip(keys, report.codes, strict=True):
                    if code != LookupCode.HIT:
                        out.append("-")
                        continue
                    buf = np.zeros((1, bb), dtype=np.uint8)
                    out.append(digest(buf[0]) if engine.load_blocks([key], buf) == 1 else "-")
                print("got", *out, flush=True)
            elif cmd == "local":
                keys, data = blocks(10_000 + int(time.monotonic() * 1000) % 1000, 1, bb)
                engine.store_blocks(keys, data)
                buf = np.zeros((1, bb), dtype=np.uint8)
                ok = engine.load_blocks(keys, buf) == 1 and bytes(buf[0]) == bytes(data[0])
                print("local", "ok" if ok else "bad", flush=True)
            elif cmd == "stats":
                tiers = engine.stats()["tiers"]
                print("stats", json.dumps(next(iter(tiers.values()))), flush=True)


if __name__ == "__main__":
    main()
