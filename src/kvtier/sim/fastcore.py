"""The simulate hot path on dense block ids: the engine's decisions for LRU/SIEVE/S3-FIFO/ARC.

:func:`kvtier.sim.replay.replay` in simulate mode sends a primary-only stack with LRU, SIEVE, S3-FIFO or
ARC (no policy options, no tenants, no hook or metrics) here instead of through the engine. The step per
request is the engine's (docs/replay.md "engine" semantics, as ``Engine.access`` does it): every
resident block hits and touches the policy in key order; then the distinct misses are stored in key
order — when they do not fit, ``min(need - free, resident)`` victims are evicted first and the first
``min(need, free)`` misses inserted. Equality with the engine is tested on random traces
(tests/sim/test_sim_fastcore.py) and by the reference tests, which now run on this path.

Two implementations of one contract:

* a C core (``fastcore.c``, shipped as package data), compiled on first use with the system's C
  compiler into a private cache directory (``$XDG_CACHE_HOME/kvtier`` or ``~/.cache/kvtier``, mode
  0700) and loaded with :mod:`ctypes`: tens of millions of block references per second;
* a pure-Python twin (:func:`_simulate_py`: the engine's policy calls on the real policy objects,
  over int ids), used when no compiler is found, compilation fails, or ``KVTIER_SIM_CORE=python``;
  about a million references per second.

Why not a build-time extension: ``pip install -e '.[cli]'`` must work on a machine with no compiler,
and a lazily built, cached library needs no build-system change. Why ctypes and not the engine's
objects: the win comes from dense integer ids and arrays, which the engine's key-based API cannot use.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.native import load_library

__all__ = ["FastResult", "POLICIES", "core_name", "simulate_ids"]

#: Policies with a fast path, and their code in fastcore.c.
POLICIES = {"lru": 0, "sieve": 1, "s3fifo": 2, "arc": 3}
_SOURCE = Path(__file__).with_name("fastcore.c")
_lib: Any = None
_lib_tried = False


@dataclass(frozen=True, slots=True)
class FastResult:
    """Per-request outcomes of a fast replay, and the primary tier's counters."""

    hits: np.ndarray  #: int32: blocks of the request that hit
    prefix: np.ndarray  #: int32: length of the request's leading run of hits
    last_hit: np.ndarray  #: bool: whether the request's last block hit
    evictions: int
    stores: int
    dropped: int
    core: str  #: "c" or "python"


def _load_c() -> Any:
    """The compiled core (built once per source version, see :mod:`kvtier.native`), or ``None``."""
    global _lib, _lib_tried
    if _lib_tried:
        return _lib
    _lib_tried = True
    lib = load_library(_SOURCE, disable_env="KVTIER_SIM_CORE")
    if lib is None:
        return None
    fn = lib.kv_simulate
    p = ctypes.c_void_p
    fn.argtypes = [ctypes.c_int, p, p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int64, p, p, p, p, p]
    fn.restype = ctypes.c_int
    _lib = lib
    return lib


def core_name() -> str:
    """``"c"`` when the compiled core is available here, else ``"python"``."""
    return "c" if _load_c() is not None else "python"


def simulate_ids(
    policy: str, ids: np.ndarray, offsets: np.ndarray, nuniq: int, capacity: int, *, core: str | None = None
) -> FastResult:
    """Replay requests given as dense ids (``ids[offsets[r]:offsets[r+1]]``) through ``policy``.

    ``ids`` are int32 in ``[0, nuniq)``; ``capacity`` >= 1 blocks. ``core`` forces ``"c"`` or
    ``"python"`` (tests compare them); by default the C core is used when it loads.
    """
    if policy not in POLICIES:
        raise ValueError(f"no fast path for policy {policy!r} (have {sorted(POLICIES)})")
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1 block, got {capacity}")
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    nreq = offsets.size - 1
    lib = None if core == "python" else _load_c()
    if core == "c" and lib is None:
        raise RuntimeError("the compiled simulate core is not available (no C compiler?)")
    if lib is not None:
        hits = np.empty(nreq, dtype=np.int32)
        prefix = np.empty(nreq, dtype=np.int32)
        last = np.empty(nreq, dtype=np.uint8)
        counters = np.zeros(3, dtype=np.int64)
        params = _params(policy, capacity)
        rc = lib.kv_simulate(
            POLICIES[policy],
            ids.ctypes.data,
            offsets.ctypes.data,
            nreq,
            nuniq,
            capacity,
            params.ctypes.data,
            hits.ctypes.data,
            prefix.ctypes.data,
            last.ctypes.data,
            counters.ctypes.data,
        )
        if rc == 0:
            ev, st, dr = (int(x) for x in counters)
            return FastResult(hits, prefix, last.astype(bool), ev, st, dr, "c")
    return _simulate_py(policy, ids.tolist(), offsets.tolist(), capacity)


def _policy(policy: str, cap: int) -> Any:
    """The real policy object, with its default options (the fast path takes no options)."""
    from kvtier.policies.arc import ARCPolicy
    from kvtier.policies.base import CachePolicy
    from kvtier.policies.lru import LRUPolicy
    from kvtier.policies.s3fifo import S3FIFOPolicy
    from kvtier.policies.sieve import SIEVEPolicy

    classes: dict[str, type[CachePolicy]] = {
        "lru": LRUPolicy,
        "sieve": SIEVEPolicy,
        "s3fifo": S3FIFOPolicy,
        "arc": ARCPolicy,
    }
    return classes[policy](cap)


def _params(policy: str, cap: int) -> np.ndarray:
    """S3-FIFO's queue sizes exactly as :class:`S3FIFOPolicy` rounds them (zeros otherwise)."""
    out = np.zeros(3, dtype=np.int64)
    if policy == "s3fifo":
        p = _policy(policy, cap)
        out[:] = (p._small_cap, p._ghost_cap, p._threshold)
    return out


def _simulate_py(policy: str, ids: list[int], offs: list[int], cap: int) -> FastResult:
    """The specification of fastcore.c: the engine's policy calls, on the real policy, over int ids.

    Per request: ``touch_many`` of the resident blocks in key order; then, if the distinct misses do
    not fit, one ``evict(n, (), incoming=first miss)``; then ``insert_many`` of the misses that fit.
    """
    pol = _policy(policy, cap)
    contains = pol.__contains__
    nreq = len(offs) - 1
    hits_out = [0] * nreq
    prefix_out = [0] * nreq
    last_out = [False] * nreq
    evictions = stores = dropped = 0
    for r in range(nreq):
        blocks = ids[offs[r] : offs[r + 1]]
        n = len(blocks)
        present = list(map(contains, blocks))
        hit = [b for b, p in zip(blocks, present, strict=True) if p]
        h = len(hit)
        hits_out[r] = h
        prefix_out[r] = present.index(False) if h < n else n
        last_out[r] = n > 0 and present[-1]
        if hit:
            pol.touch_many(hit)
        if h == n:
            continue
        miss = list(dict.fromkeys(b for b, p in zip(blocks, present, strict=True) if not p))
        need = len(miss)
        size = len(pol)
        if need > cap - size:
            ne = min(need - (cap - size), size)
            if ne > 0:
                pol.evict(ne, (), miss[0])
            evictions += ne
        take = min(need, cap - len(pol))
        if take > 0:
            pol.insert_many(miss[:take])
        stores += take
        dropped += need - take
    return FastResult(
        np.asarray(hits_out, dtype=np.int32),
        np.asarray(prefix_out, dtype=np.int32),
        np.asarray(last_out, dtype=bool),
        evictions,
        stores,
        dropped,
        "python",
    )
