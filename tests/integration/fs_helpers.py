"""Helpers for the fs-tier integration tests, also runnable as the writer subprocess.

Imported by path from the test files (``load_helpers()``), and run as a script by the crash and
capacity tests: ``python fs_helpers.py <mode> <json-args>``. Payloads are a pure function of the
key, so any process can check what any other stored.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey
from kvtier.testing.primary import PrimaryBuffer, wait_for_jobs
from kvtier.tiers.base import TierContext
from kvtier.tiers.fs import FsTier

NAMESPACE = "fs-test-ns"
_job_ids = iter(range(1, 1 << 62))


def aligned_primary(num_slots: int, block_bytes: int) -> PrimaryBuffer:
    """A page-aligned primary buffer (like a real pinned/shm buffer), so O_DIRECT is exercised."""
    row = -(-block_bytes // 4096) * 4096
    mem = mmap.mmap(-1, num_slots * row)
    rows = np.frombuffer(mem, dtype=np.uint8).reshape(num_slots, row)
    return PrimaryBuffer(memoryview(rows), rows, block_bytes)


def key_of(name: str) -> BlockKey:
    return BlockKey(xxhash.xxh3_128_digest(name.encode()))


def payload_of(key: bytes, n: int) -> np.ndarray:
    return np.random.default_rng(xxhash.xxh3_64_intdigest(key)).integers(0, 256, n, dtype=np.uint8)


def make_tier(primary: PrimaryBuffer, root: str | Path, namespace: str = NAMESPACE, **options: Any) -> FsTier:
    # Most tests start many tiers on fresh trees: skip the background creation of the 4,352 shard
    # directories unless a test asks for it (the contract suite and one layout test use the default).
    options.setdefault("precreate_dirs", False)
    # These helpers test the one-file-per-block path unless a test asks for the small-block segments
    # (tests/integration/test_fs_segments*.py do).
    options.setdefault("small_block_bytes", 0)
    ctx = TierContext(name="fs", block_bytes=primary.block_bytes, namespace=namespace)
    return FsTier(primary_kv_view=primary.view, context=ctx, root_dir=str(root), **options)


def make_striped(
    primary: PrimaryBuffer, roots: Sequence[str | Path], namespace: str = NAMESPACE, **options: Any
) -> Any:
    """A striped fs tier (``root_dirs``) over ``roots``, with :func:`make_tier`'s test defaults."""
    options.setdefault("precreate_dirs", False)
    options.setdefault("small_block_bytes", 0)
    ctx = TierContext(name="fs", block_bytes=primary.block_bytes, namespace=namespace)
    return FsTier(primary_kv_view=primary.view, context=ctx, root_dirs=[str(r) for r in roots], **options)


def store(tier: FsTier, primary: PrimaryBuffer, keys: Sequence[BlockKey], timeout: float = 60) -> JobResult:
    """Fill slots 0..n-1 with each key's payload and store them as one job."""
    for slot, k in enumerate(keys):
        primary.block(slot)[:] = payload_of(k, primary.block_bytes)
    job = TransferJob(next(_job_ids), list(keys), np.arange(len(keys), dtype=np.int32))
    tier.submit_store(job)
    return wait_for_jobs(tier, [job.job_id], timeout=timeout)[job.job_id]


def load(tier: FsTier, primary: PrimaryBuffer, keys: Sequence[BlockKey], timeout: float = 60) -> JobResult:
    """Load keys into slots 0..n-1 (poisoned first, so stale bytes cannot pass as a load)."""
    for slot in range(len(keys)):
        primary.block(slot)[:] = 0xEE
    job = TransferJob(next(_job_ids), list(keys), np.arange(len(keys), dtype=np.int32), is_promotion=True)
    tier.submit_load(job)
    return wait_for_jobs(tier, [job.job_id], timeout=timeout)[job.job_id]


def tree_files(ns_dir: str | Path, include_tmp: bool = True) -> dict[str, int]:
    """Every block (and temp) file under a namespace directory -> size in bytes."""
    out: dict[str, int] = {}
    for dirpath, _, files in os.walk(ns_dir):
        rel = os.path.relpath(dirpath, ns_dir)
        top = rel.split(os.sep)[0]
        if top == "procs" or (top == "tmp" and not include_tmp) or rel == ".":
            continue
        for f in files:
            p = os.path.join(dirpath, f)
            with contextlib.suppress(FileNotFoundError):
                out[p] = os.stat(p).st_size
    return out


def block_files(ns_dir: str | Path) -> dict[str, int]:
    return {p: s for p, s in tree_files(ns_dir, include_tmp=False).items()}


def temp_files(ns_dir: str | Path) -> list[str]:
    """Every file under the namespace's ``tmp/`` (its shard directories included)."""
    return [os.path.join(d, f) for d, _, files in os.walk(os.path.join(ns_dir, "tmp")) for f in files]


# -- subprocess modes ----------------------------------------------------------------------------
def _writer(args: dict[str, Any]) -> None:
    """Store batches of keys forever (crash test) or a fixed list (capacity test)."""
    primary = aligned_primary(args["batch"], args["block_bytes"])
    build = make_striped if isinstance(args["root"], list) else make_tier
    tier = build(
        primary, args["root"], max_bytes=args.get("max_bytes"), threads=args.get("threads", 2),
        **args.get("options", {}),
    )  # fmt: skip
    tier.wait_scan()
    prefix, count, batch = args["prefix"], args.get("count", 1 << 30), args["batch"]
    stored: list[str] = []
    i = 0
    print("ready", flush=True)
    while i < count:
        keys = [key_of(f"{prefix}-{j}") for j in range(i, min(i + batch, count))]
        res = store(tier, primary, keys)
        stored += [k.hex() for k in res.transferred(keys)]
        i += batch
        print(f"batch {i}", flush=True)
    if "barrier" in args:  # wait until every writer finished storing, then sync with the others
        Path(args["barrier"], prefix).touch()
        while len(os.listdir(args["barrier"])) < args["writers"]:
            time.sleep(0.01)
        tier.refresh()
    index = sorted(k.hex() for k in tier.indexed_keys())
    tier.shutdown()
    out = {"stored": stored, "index": index, "evictions": tier.stats.evictions}
    Path(args["out"]).write_text(json.dumps(out))


def _reader(args: dict[str, Any]) -> None:
    """Open a striped tier over ``roots`` and load every key of ``names``; print which came back
    with their stored payload (the second process of the striping test)."""
    primary = aligned_primary(len(args["names"]), args["block_bytes"])
    tier = make_striped(primary, args["roots"])
    tier.wait_scan(30)
    keys = [key_of(n) for n in args["names"]]
    hits = [str(r) for r in tier.lookup_many(keys)]
    res = load(tier, primary, keys)
    good = [
        n for slot, (n, k) in enumerate(zip(args["names"], keys, strict=True))
        if k in res.transferred(keys) and (primary.block(slot) == payload_of(k, primary.block_bytes)).all()
    ]  # fmt: skip
    tier.shutdown()
    Path(args["out"]).write_text(json.dumps({"hits": hits, "good": good}))


def spawn_args(mode: str, args: dict[str, Any]) -> list[str]:
    return [sys.executable, __file__, mode, json.dumps(args)]


if __name__ == "__main__":
    _mode, _args = sys.argv[1], json.loads(sys.argv[2])
    if _mode == "writer":
        _writer(_args)
    elif _mode == "reader":
        _reader(_args)
    else:
        raise SystemExit(f"unknown mode {_mode}")
    time.sleep(0)
