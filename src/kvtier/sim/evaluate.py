"""Measure a policy on a trace: flat block-hit ratio and per-request prefix-hit ratio.

Used by the policy tests and ``benchmarks/bench_policies.py``; the same two procedures drive both a
kvtier :class:`~kvtier.policies.base.CachePolicy` and a libCacheSim cache (a dev-only dependency,
imported lazily), so the figures are comparable.

**Flat replay** (what a generic cache simulator computes): every block of every request, in order,
is one access. A resident block is a hit (``touch``); a miss evicts one block if the cache is full
(``evict(1, incoming=block)``) and inserts the block.

**Prefix replay** (what a KV cache is worth: a request can only reuse a *leading* run of blocks,
since block ``i``'s KV depends on blocks ``0..i-1``): requests are replayed one at a time, in file
order. For each request, first count its leading blocks that are resident (stop at the first one
that is not) -- that count is the request's prefix hit. Then access all its blocks in order exactly
as in the flat replay, inserting misses with ``BlockInfo(parent=previous block, depth=i,
tenant=request tenant)``. The prefix-hit ratio is the sum of prefix hits over the total number of
block references. libCacheSim caches are probed with ``find(req, update_cache=False)`` (no side
effects on their state) and accessed with ``get(req)``, so they see exactly the same accesses as
the flat replay; only the probe is added.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from kvtier.keys import BlockInfo, BlockKey
from kvtier.policies.base import CachePolicy
from kvtier.sim.opt import next_use
from kvtier.sim.trace import TraceRequest

__all__ = [
    "PrefixStats",
    "flat_hits",
    "lcs_cache",
    "lcs_flat_hit_ratio",
    "lcs_prefix_replay",
    "prefix_replay",
    "write_oracle_general",
]


@dataclass(frozen=True, slots=True)
class PrefixStats:
    """Result of a prefix replay.

    Attributes:
        refs: block references (sum of request lengths).
        prefix_hits: blocks served from the cache as a leading run (usable KV).
        block_hits: blocks that were resident when accessed (the flat hit count).
    """

    refs: int
    prefix_hits: int
    block_hits: int

    @property
    def prefix_hit_ratio(self) -> float:
        return self.prefix_hits / self.refs if self.refs else 0.0

    @property
    def block_hit_ratio(self) -> float:
        return self.block_hits / self.refs if self.refs else 0.0


def flat_hits(policy: CachePolicy, seq: Sequence[int] | np.ndarray) -> int:
    """Hits of ``policy`` on the flat sequence of block ids (ids used directly as keys)."""
    cap = policy.capacity
    hits = 0
    ids = seq.tolist() if isinstance(seq, np.ndarray) else list(seq)
    touch, insert, evict = policy.touch, policy.insert, policy.evict
    for obj in ids:
        key = cast(BlockKey, obj)
        if key in policy:
            hits += 1
            touch(key)
        else:
            if len(policy) >= cap:
                evict(1, (), key)
            insert(key, None)
    return hits


def prefix_replay(policy: CachePolicy, requests: Sequence[TraceRequest]) -> PrefixStats:
    """Per-request prefix replay of a kvtier policy (see the module docstring)."""
    cap = policy.capacity
    refs = prefix = hits = 0
    for req in requests:
        keys = cast(tuple[BlockKey, ...], req.blocks)
        lead = 0
        for key in keys:
            if key not in policy:
                break
            lead += 1
        prefix += lead
        refs += len(keys)
        parent: BlockKey | None = None
        for depth, key in enumerate(keys):
            if key in policy:
                hits += 1
                policy.touch(key)
            else:
                if len(policy) >= cap:
                    policy.evict(1, (), key)
                policy.insert(key, BlockInfo(parent=parent, depth=depth, tenant=req.tenant))
            parent = key
    return PrefixStats(refs=refs, prefix_hits=prefix, block_hits=hits)


# ------------------------------------------------------------------------------------------------
# libCacheSim (dev dependency): reference implementations of the same procedures.
# ------------------------------------------------------------------------------------------------

_ORACLE_GENERAL = np.dtype([("time", "<u4"), ("obj_id", "<u8"), ("size", "<u4"), ("next", "<i8")])


def write_oracle_general(seq: Sequence[int] | np.ndarray, path: str | Path) -> Path:
    """Write ``seq`` as a libCacheSim ``oracleGeneral`` binary trace (unit sizes, next-access index)."""
    arr = np.asarray(seq, dtype=np.int64)
    nxt = next_use(arr)
    rec = np.zeros(arr.size, dtype=_ORACLE_GENERAL)
    rec["time"] = np.arange(arr.size, dtype=np.uint32)
    rec["obj_id"] = arr.astype(np.uint64)
    rec["size"] = 1
    rec["next"] = np.where(nxt >= arr.size, -1, nxt)
    out = Path(path)
    rec.tofile(out)
    return out


def lcs_cache(name: str, capacity: int) -> Any:
    """A libCacheSim cache by class name (``"LRU"``, ``"ARC"``, ``"S3FIFO"``, ``"Sieve"``, ...)."""
    import libcachesim

    return getattr(libcachesim, name)(int(capacity))


def lcs_flat_hit_ratio(name: str, trace_path: str | Path, capacity: int) -> float:
    """libCacheSim's hit ratio for ``name`` on an ``oracleGeneral`` file from :func:`write_oracle_general`.

    The reader is deliberately never closed: ``TraceReader.close()`` double-frees in 0.3.5.
    """
    import libcachesim

    reader = libcachesim.TraceReader(str(trace_path), libcachesim.TraceType.ORACLE_GENERAL_TRACE)
    miss_ratio, _ = lcs_cache(name, capacity).process_trace(reader)
    return 1.0 - float(miss_ratio)


def lcs_prefix_replay(name: str, requests: Sequence[TraceRequest], capacity: int) -> PrefixStats:
    """Per-request prefix replay of libCacheSim's ``name`` (same procedure as :func:`prefix_replay`)."""
    import libcachesim

    cache = lcs_cache(name, capacity)
    probe = libcachesim.Request()
    req = libcachesim.Request()
    probe.obj_size = req.obj_size = 1
    inner = getattr(cache, "_cache", cache)  # the C++ object: skips a Python wrapper call per access
    find, get = inner.find, inner.get
    refs = prefix = hits = 0
    for r in requests:
        lead = 0
        for block in r.blocks:
            probe.obj_id = block
            if find(probe, False) is None:
                break
            lead += 1
        prefix += lead
        refs += len(r.blocks)
        for block in r.blocks:
            req.obj_id = block
            hits += bool(get(req))
    return PrefixStats(refs=refs, prefix_hits=prefix, block_hits=hits)
