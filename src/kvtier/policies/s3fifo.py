"""S3-FIFO (Yang et al., SOSP'23): three FIFO queues, libCacheSim's variant.

A small FIFO ``S`` (10 % of capacity) filters one-hit wonders; the main FIFO ``M`` (the rest) is a
clock with a 2-bit counter; a ghost FIFO ``G`` (keys only, 90 % of capacity) remembers what ``S``
evicted. New keys enter ``S`` unless ``G`` remembers them (then ``M``). Hits only bump a counter.

Eviction (one victim): if ``M`` is over its share or ``S`` is empty, evict from ``M``: the oldest key
with counter 0 goes; others are re-queued with ``min(counter, 3) - 1``. Otherwise evict from ``S``:
the oldest key moves to ``M`` (counter reset to 0) if it was hit at least ``move_to_main_threshold``
(2) times while in ``S``, else it is evicted into ``G`` (oldest ghost dropped when ``G`` is full);
repeat until one key is evicted (falling through to ``M`` if ``S`` drains).

Matches libCacheSim 0.3.5's ``S3FIFO`` (the unit test checks the hit ratio to 1e-4 at 1 % and 10 %
of the conversation trace's unique blocks), including two details of that version:

* until the first eviction, a key that finds ``S`` full goes straight to ``M`` (the cache fills
  ``S`` first, then ``M``);
* the ghost is checked (and the ghost entry consumed) before eviction, so a ghost hit is taken from
  ``incoming`` in :meth:`evict`, or in :meth:`insert` when no eviction was needed.

Documented differences: libCacheSim refuses to cache anything when ``S`` has room for < 2 keys
(capacity < 20); kvtier keeps ``S`` at least 1 key and always admits. Protected keys are re-queued
at the back of their queue (with their counter unchanged in ``S``, decremented as usual in ``M``).

Options: ``small_size_ratio`` (0.1), ``ghost_size_ratio`` (0.9), ``move_to_main_threshold`` (2),
``tenant_quota``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from kvtier.keys import BlockInfo, BlockKey
from kvtier.numbers import COUNT, NONNEGATIVE, check_number
from kvtier.policies.quota import QuotaAwarePolicy, unprotected_count

__all__ = ["S3FIFOPolicy"]

_FREQ_CAP = 3


class S3FIFOPolicy(QuotaAwarePolicy):
    """S3-FIFO eviction (small + main + ghost FIFOs)."""

    name = "s3fifo"

    def __init__(
        self,
        capacity: int,
        *,
        small_size_ratio: float = 0.1,
        ghost_size_ratio: float = 0.9,
        move_to_main_threshold: int = 2,
        tenant_quota: float | None = None,
    ) -> None:
        super().__init__(capacity, tenant_quota=tenant_quota)
        if not 0.0 < small_size_ratio < 1.0:
            raise ValueError(f"small_size_ratio must be in (0, 1), got {small_size_ratio!r}")
        check_number("ghost_size_ratio", ghost_size_ratio, NONNEGATIVE)
        check_number("move_to_main_threshold", move_to_main_threshold, COUNT)
        # Same integer rounding as libCacheSim: small = floor(c * ratio), main = the rest.
        self._small_cap = max(1, int(self.capacity * small_size_ratio))
        self._main_cap = self.capacity - self._small_cap
        self._ghost_cap = int(self.capacity * ghost_size_ratio)
        self._threshold = int(move_to_main_threshold)
        # Queues map key -> hit counter; ordered oldest first.
        self._small: OrderedDict[BlockKey, int] = OrderedDict()
        self._main: OrderedDict[BlockKey, int] = OrderedDict()
        self._ghost: OrderedDict[BlockKey, None] = OrderedDict()
        self._has_evicted = False
        self._pending_ghost: BlockKey | None = None
        self._resident = (self._small, self._main)

    def _insert(self, key: BlockKey, info: BlockInfo | None) -> None:
        ghost_hit = self._pending_ghost == key
        self._pending_ghost = None
        if not ghost_hit and key in self._ghost:
            del self._ghost[key]
            ghost_hit = True
        if ghost_hit or (not self._has_evicted and len(self._small) >= self._small_cap):
            self._main[key] = 0
        else:
            self._small[key] = 0

    def _touch(self, key: BlockKey) -> None:
        small = self._small
        if key in small:
            small[key] = min(small[key] + 1, _FREQ_CAP)
        else:
            self._main[key] = min(self._main[key] + 1, _FREQ_CAP)

    def _remove(self, key: BlockKey) -> None:
        self._small.pop(key, None)
        self._main.pop(key, None)
        self._ghost.pop(key, None)
        if self._pending_ghost == key:
            self._pending_ghost = None

    def _to_ghost(self, key: BlockKey) -> None:
        if self._ghost_cap <= 0:
            return
        ghost = self._ghost
        while len(ghost) >= self._ghost_cap:
            ghost.popitem(last=False)
        ghost[key] = None

    def _evict_small(self, protected: Collection[BlockKey]) -> BlockKey | None:
        small, main = self._small, self._main
        skipped = 0
        while small and skipped <= len(small):
            key, freq = small.popitem(last=False)
            if freq >= self._threshold:
                main[key] = 0
            elif key in protected:
                small[key] = freq  # back of the queue, unchanged
                skipped += 1
            else:
                self._to_ghost(key)
                return key
        return None

    def _evict_main(self, protected: Collection[BlockKey]) -> BlockKey | None:
        main = self._main
        # Counters only go down here, so every unprotected key reaches 0 within _FREQ_CAP + 1 laps.
        budget = (_FREQ_CAP + 1) * len(main) + 1
        while main and budget > 0:
            budget -= 1
            key, freq = main.popitem(last=False)
            if freq >= 1:
                main[key] = min(freq, _FREQ_CAP) - 1
            elif key in protected:
                main[key] = 0
            else:
                return key
        return None

    def _evict_one(self, protected: Collection[BlockKey]) -> BlockKey:
        self._has_evicted = True
        for _ in range(3):
            main_first = len(self._main) > self._main_cap or not self._small
            first, second = (
                (self._evict_main, self._evict_small) if main_first else (self._evict_small, self._evict_main)
            )
            victim = first(protected)
            if victim is None:
                victim = second(protected)
            if victim is not None:
                return victim
        raise AssertionError("S3-FIFO found no unprotected victim although one exists")

    def _evict(self, n: int, protected: Collection[BlockKey], incoming: BlockKey | None) -> list[BlockKey]:
        if unprotected_count(self, protected) < n:
            return []
        # libCacheSim consumes a ghost entry when it looks the missing key up, before evicting.
        if incoming is not None and incoming in self._ghost:
            del self._ghost[incoming]
            self._pending_ghost = incoming
        return [self._evict_one(protected) for _ in range(n)]
