"""One engine process of :class:`~kvtier.testing.SharedStoreTests`: ``python -m kvtier.testing.engine_proc
CONFIG MODE N SEED TIMEOUT``.

``MODE`` is ``store`` (store N blocks through the engine, wait for write-through, print how many) or
``load`` (look the N keys up until they are promoted from the tier or ``timeout`` passes, load
them, print how many came back byte-exact). Payloads are a pure function of (seed, index), so one
process can check what another stored. Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np

from kvtier.engine import Engine
from kvtier.keys import BlockKey

__all__ = ["blocks", "run"]


def blocks(n: int, seed: int, block_bytes: int) -> tuple[list[BlockKey], np.ndarray]:
    keys = [BlockKey(f"shared-{seed}-{i}".encode()) for i in range(n)]
    data = np.random.default_rng(seed).integers(0, 256, (n, block_bytes), dtype=np.uint8)
    return keys, data


def run(config: dict[str, Any], mode: str, n: int, seed: int, timeout: float = 10.0) -> dict[str, Any]:
    """Store or load (``mode``) ``n`` blocks of ``seed`` through an engine on ``config``."""
    keys, data = blocks(n, seed, int(config["block_bytes"]))
    with Engine(config) as eng:
        if mode == "store":
            stored = eng.store_blocks(keys, data)
            eng.drain()
            deadline = time.monotonic() + timeout
            while eng.stats()["tiers"][eng.tiers[0].name]["stores"] < n and time.monotonic() < deadline:
                eng.poll()
                time.sleep(0.01)
            return {"stored": stored, "tier_stores": eng.stats()["tiers"][eng.tiers[0].name]["stores"]}
        deadline = time.monotonic() + timeout
        hits = 0
        while time.monotonic() < deadline:
            hits = eng.lookup(keys).num_hits
            if hits == n:
                break
            eng.poll()
            time.sleep(0.01)
        if hits < n:
            return {"hits": hits, "exact": 0}
        out = np.zeros_like(data)
        loaded = eng.load_blocks(keys, out)
        exact = sum(bool(np.array_equal(out[i], data[i])) for i in range(n)) if loaded == n else 0
        return {"hits": hits, "exact": exact}


if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    print(json.dumps(run(cfg, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))))
