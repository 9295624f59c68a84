"""Values the :class:`kvtier.engine.Engine` API takes and returns (requests, reports, handles, events).

These sit on the per-request hot path (the simulator makes hundreds of thousands of calls per
second), so the ones created per call are ``__slots__`` classes or named tuples with plain
``__init__`` (a frozen dataclass's ``__init__`` costs several times more). Treat them as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from kvtier.keys import BlockKey, LookupCode, LookupResult

__all__ = ["EngineEvent", "LoadHandle", "LookupReport", "RequestContext", "StoreHandle"]

# Code -> result, indexed by the byte value (derived once from LookupCode).
_RESULTS = tuple(code.result for code in LookupCode)
_ALL_MISS, _ALL_HIT = bytes([LookupCode.MISS]), bytes([LookupCode.HIT])


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Who is asking. ``tenant`` scopes every key of the request (see ``docs/engine.md``)."""

    request_id: str = ""
    tenant: str | None = None


class LookupReport:
    """Answer of :meth:`Engine.lookup`.

    Attributes:
        num_hits: number of *leading* keys that are HIT in the primary tier (loadable now).
        results: one :class:`LookupResult` per key, in key order (built on first access).
        pending: number of keys answered ``HIT_PENDING``.
        codes: the results as bytes, one per key (0 MISS, 1 HIT, 2 HIT_PENDING, 3 RETRY), for callers
            that count outcomes fast (``codes.count(1)``, ``numpy.frombuffer(codes, numpy.int8)``).
    """

    __slots__ = ("_results", "codes", "num_hits", "pending")

    MISS, HIT, HIT_PENDING, RETRY = (int(code) for code in LookupCode)

    def __init__(
        self,
        num_hits: int,
        results: list[LookupResult] | None = None,
        pending: int = 0,
        codes: bytes | None = None,
    ) -> None:
        self.num_hits = num_hits
        self.pending = pending
        self._results = results
        if codes is None:
            codes = bytes(LookupCode.of(r) for r in (results or ()))
        self.codes = codes

    @property
    def results(self) -> list[LookupResult]:
        if self._results is None:
            c = self.codes
            if not c.strip(_ALL_MISS):  # all misses (the common request): one C-level list
                self._results = [LookupResult.MISS] * len(c)
            elif not c.strip(_ALL_HIT):
                self._results = [LookupResult.HIT] * len(c)
            else:
                self._results = [_RESULTS[x] for x in c]
        return self._results

    @property
    def hits(self) -> int:
        """Keys answered HIT anywhere in the list (not only the leading run)."""
        return self.codes.count(LookupReport.HIT)

    def __len__(self) -> int:
        return len(self.codes)

    def __repr__(self) -> str:
        return f"LookupReport(num_hits={self.num_hits}, pending={self.pending}, codes={self.codes!r})"


def _slots(
    slot_ids: npt.NDArray[np.int32] | list[int],
) -> tuple[list[int], npt.NDArray[np.int32] | None]:
    if isinstance(slot_ids, np.ndarray):
        arr = slot_ids.astype(np.int32, copy=False)
        return arr.tolist(), arr
    return list(slot_ids), None


class _Handle:
    """What store and load handles share: keys, their slots (a list, and an ``int32`` array on demand)."""

    __slots__ = ("_slot_ids", "keys", "request", "slots", "token")

    keys: list[BlockKey]
    slots: list[int]
    _slot_ids: npt.NDArray[np.int32] | None

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def slot_ids(self) -> npt.NDArray[np.int32]:
        """``int32`` array of the slots (built on first access; ``slots`` is the same as a list)."""
        if self._slot_ids is None:
            self._slot_ids = np.array(self.slots, dtype=np.int32)
        return self._slot_ids

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.keys)} keys, slots={self.slots})"


class StoreHandle(_Handle):
    """Slots reserved by :meth:`Engine.prepare_store`; hand it back to :meth:`Engine.complete_store`.

    Attributes:
        keys: accepted keys (already resident and duplicate keys are skipped; keys that found no
            slot because everything else is pinned are dropped).
        slot_ids: primary slot of ``keys[i]`` (``int32``), state WRITING until completion.
        positions: index of ``keys[i]`` in the key list given to ``prepare_store`` (to pick the data).
        request: the request context given to ``prepare_store``.
        internal_keys: the keys as the engine stores them (tenant-scoped); same as ``keys`` without a
            tenant.
    """

    __slots__ = ("infos", "internal_keys", "positions")

    def __init__(
        self,
        keys: list[BlockKey],
        slot_ids: npt.NDArray[np.int32] | list[int],
        positions: list[int] | None = None,
        request: RequestContext | None = None,
        internal_keys: list[BlockKey] | None = None,
        infos: Any = None,
        token: int = 0,
    ) -> None:
        self.keys = keys
        if type(slot_ids) is list:
            self.slots, self._slot_ids = slot_ids, None
        else:
            self.slots, self._slot_ids = _slots(slot_ids)
        self.positions = positions if positions is not None else list(range(len(keys)))
        self.request = request
        self.internal_keys = internal_keys if internal_keys is not None else keys
        self.infos = infos
        self.token = token


class LoadHandle(_Handle):
    """Pinned READY slots from :meth:`Engine.prepare_load`; release with :meth:`Engine.complete_load`."""

    __slots__ = ()

    def __init__(
        self,
        keys: list[BlockKey],
        slot_ids: npt.NDArray[np.int32] | list[int],
        request: RequestContext | None = None,
        token: int = 0,
    ) -> None:
        self.keys = keys
        self.slots, self._slot_ids = _slots(slot_ids)
        self.request = request
        self.token = token


class EngineEvent(NamedTuple):
    """Something that happened to blocks, for metrics and logs.

    ``kind`` is one of ``"stored"`` (a block became READY in the primary tier, ``tier`` None, or a
    store job into ``tier`` finished), ``"evicted"`` (dropped from the primary tier), ``"promoted"``
    (copied from ``tier`` into the primary tier), ``"promotion_failed"``, ``"store_failed"``,
    ``"dropped"`` (a store found no slot), ``"reset"`` (keys dropped by :meth:`Engine.reset`).
    ``keys`` are engine-internal keys (tenant-scoped when the request had a tenant).
    """

    kind: str
    keys: tuple[BlockKey, ...]
    tier: str | None = None
    time: float = 0.0
