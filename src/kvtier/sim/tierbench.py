"""``kvtier bench``: throughput of each tier next to its physical reference, measured in one run.

* **primary tier** — ``Engine.store_blocks`` / ``load_blocks`` of a batch of blocks (a primary-only
  engine built from the config's sizes, so write-through does not muddy the figure) against a plain
  numpy ``memcpy`` of the same bytes;
* **each secondary tier** — built by the configured spec on a private buffer, one batched store job
  and one batched load job of the same blocks (loads verified byte for byte), against raw file I/O
  (one ``open``/``write``/``close`` per block, then ``readinto``) in a directory on the same
  filesystem for ``STORAGE`` tiers, or ``memcpy`` for ``CPU`` tiers. ``REMOTE`` tiers have no generic
  reference here (their raw client is backend specific): they are reported with ``reference: null``.

Ratios are kvtier / reference (higher is better; 1.0 = as fast as the raw medium). Load latency is
the median of single-block load jobs; the cost model reads ``load_bytes_per_s`` and
``load_latency_s`` from this report (``cost_model.bench_file``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.config import KvtierConfig
from kvtier.jobs import TransferJob, wait_for_job
from kvtier.keys import BlockKey, make_namespace
from kvtier.sim.payload import PayloadFactory
from kvtier.tiers.base import SecondaryTier

__all__ = ["run_bench"]

_JOB_BASE = 1 << 40  # job ids far from anything an engine would use
_TIMEOUT = 60.0


def _best(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def _keys(n: int, salt: str) -> list[BlockKey]:
    # A fresh salt per run: persistent tiers must not answer "already stored" from a previous bench.
    ns = make_namespace("kvtier-bench", block_size=1, cache_salt=salt)
    return ns.trace_keys(range(n))


def _memcpy_reference(src: np.ndarray, repeats: int) -> dict[str, Any]:
    dst = np.empty_like(src)
    secs = _best(lambda: np.copyto(dst, src), repeats)
    bps = src.nbytes / secs
    return {"kind": "memcpy", "store_bytes_per_s": bps, "load_bytes_per_s": bps}


def _file_reference(directory: Path, data: np.ndarray, repeats: int) -> dict[str, Any]:
    """Raw per-block file writes and reads (no checksum, no rename, no threads)."""
    directory.mkdir(parents=True, exist_ok=True)
    n = data.shape[0]
    paths = [directory / f"b{i}" for i in range(n)]
    out = np.empty_like(data)

    def write() -> None:
        for i, p in enumerate(paths):
            with open(p, "wb") as f:
                f.write(data[i])

    def read() -> None:
        for i, p in enumerate(paths):
            with open(p, "rb", buffering=0) as f:
                f.readinto(memoryview(out[i]))

    try:
        ws = _best(write, repeats)
        rs = _best(read, repeats)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"kind": "file_io", "store_bytes_per_s": data.nbytes / ws, "load_bytes_per_s": data.nbytes / rs}


def _bench_primary(
    config: KvtierConfig, keys: list[BlockKey], data: np.ndarray, repeats: int
) -> dict[str, Any]:
    from kvtier.engine import Engine

    n = len(keys)
    cfg = dataclasses.replace(
        config,
        secondary_tiers=(),
        primary_backing="heap",
        cpu_bytes_to_use=n * config.row_stride,
        metrics_port=None,
    )
    out = np.empty_like(data)
    with Engine(cfg) as eng:
        store_s = float("inf")
        for _ in range(repeats):
            eng.reset()
            t0 = time.perf_counter()
            eng.store_blocks(keys, data)
            store_s = min(store_s, time.perf_counter() - t0)
        load_s = _best(lambda: eng.load_blocks(keys, out), repeats)
        one = np.empty((1, data.shape[1]), dtype=np.uint8)
        lat = []
        for k in keys[:16]:
            t0 = time.perf_counter()
            eng.load_blocks([k], one)
            lat.append(time.perf_counter() - t0)
    ok = bool(np.array_equal(out, data))
    return {
        "name": "primary",
        "type": "primary/heap",
        "medium": "CPU",
        "store_bytes_per_s": data.nbytes / store_s,
        "load_bytes_per_s": data.nbytes / load_s,
        "load_latency_s": statistics.median(lat),
        "verified": ok,
    }


def _bench_tier(
    tier: SecondaryTier, rows: np.ndarray, keys: list[BlockKey], data: np.ndarray, repeats: int
) -> dict[str, Any]:
    n = len(keys)
    bb = data.shape[1]
    slots = np.arange(n, dtype=np.int32)
    rows[:n, :bb] = data
    jid = _JOB_BASE
    t0 = time.perf_counter()
    tier.submit_store(TransferJob(jid, keys, slots))
    res = wait_for_job(tier, jid, _TIMEOUT, drain=True)
    store_s = max(time.perf_counter() - t0, 1e-9)
    stored = len(res.transferred(keys))
    load_s = float("inf")
    loaded = 0
    for r in range(repeats):
        rows[:n, :bb] = 0
        jid += 1
        t0 = time.perf_counter()
        tier.submit_load(TransferJob(jid, keys, slots, is_promotion=True))
        res = wait_for_job(tier, jid, _TIMEOUT, drain=True)
        load_s = min(load_s, max(time.perf_counter() - t0, 1e-9))
        loaded = len(res.transferred(keys)) if r == 0 else loaded
    ok = bool(np.array_equal(rows[:n, :bb], data)) and loaded == n
    lat = []
    for i in range(min(16, n)):
        jid += 1
        t0 = time.perf_counter()
        tier.submit_load(TransferJob(jid, [keys[i]], slots[i : i + 1], is_promotion=True))
        wait_for_job(tier, jid, _TIMEOUT, drain=True)
        lat.append(time.perf_counter() - t0)
    return {
        "name": tier.name,
        "type": type(tier).__name__,
        "medium": tier.medium,
        "store_bytes_per_s": stored * bb / store_s,
        "load_bytes_per_s": n * bb / load_s,
        "load_latency_s": statistics.median(lat) if lat else 0.0,
        "stored_blocks": stored,
        "verified": ok,
    }


def _reference_dir(config: KvtierConfig, index: int) -> Path | None:
    root = (
        config.secondary_tiers[index].options.get("root_dir") if index < len(config.secondary_tiers) else None
    )
    if isinstance(root, str | os.PathLike) and Path(root).is_dir():
        return Path(tempfile.mkdtemp(prefix=".kvtier-bench-ref-", dir=root))
    return None


def run_bench(config: KvtierConfig, *, blocks: int = 256, repeats: int = 3) -> dict[str, Any]:
    """Measure the primary tier and every configured tier; one JSON-ready object with ``ratios``."""
    from kvtier.plugins import create_spec, tier_contexts
    from kvtier.specs.base import OffloadingSpec

    if blocks < 1 or repeats < 1:
        raise ValueError("blocks and repeats must be >= 1")
    bb = config.block_bytes
    keys = _keys(blocks, os.urandom(8).hex())
    data = PayloadFactory(bb).make(keys)
    entries: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}

    prim = _bench_primary(config, keys, data, repeats)
    prim["reference"] = _memcpy_reference(data, repeats)
    entries.append(prim)

    if config.secondary_tiers:
        buf = np.zeros((blocks, config.row_stride), dtype=np.uint8)
        view = memoryview(buf)  # type: ignore[arg-type]
        spec: OffloadingSpec = create_spec(config)
        tiers = spec.create_tiers(view, tier_contexts(config, namespace="kvtier-bench"))
        try:
            for i, tier in enumerate(tiers):
                entry = _bench_tier(tier, buf, keys, data, repeats)
                if tier.medium == "STORAGE":
                    d = _reference_dir(config, i)
                    tmp = None
                    if d is None:
                        tmp = tempfile.mkdtemp(prefix="kvtier-bench-ref-")
                        d = Path(tmp)
                    try:
                        entry["reference"] = _file_reference(d, data, repeats)
                    finally:
                        if tmp is not None:
                            shutil.rmtree(tmp, ignore_errors=True)
                elif tier.medium == "CPU":
                    entry["reference"] = _memcpy_reference(data, repeats)
                else:
                    entry["reference"] = None
                entries.append(entry)
        finally:
            for tier in tiers:
                tier.shutdown()

    for e in entries:
        ref = e.get("reference")
        if ref:
            e["ratios"] = {
                "store": e["store_bytes_per_s"] / ref["store_bytes_per_s"],
                "load": e["load_bytes_per_s"] / ref["load_bytes_per_s"],
            }
            ratios[f"{e['name']}.store"] = e["ratios"]["store"]
            ratios[f"{e['name']}.load"] = e["ratios"]["load"]
        else:
            e["ratios"] = None
    return {"block_bytes": bb, "blocks": blocks, "repeats": repeats, "tiers": entries, "ratios": ratios}
