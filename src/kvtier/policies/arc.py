"""ARC: Adaptive Replacement Cache (Megiddo & Modha, FAST'03), libCacheSim's variant.

Four LRU lists: ``T1`` (seen once recently), ``T2`` (seen at least twice), and their ghosts ``B1``/``B2``
(keys only, not resident, not counted in ``len``). A miss that hits a ghost list shows the cache
chose wrongly: ``p``, the target size of ``T1``, moves towards the list that would have kept it, and
the key re-enters in ``T2``.

Matches libCacheSim 0.3.5's ``ARC`` decision for decision on a flat trace (the unit test checks the
hit ratio to 1e-4 at 1 % and 10 % of the conversation trace's unique blocks). The details taken from
that variant rather than the paper's pseudo-code:

* the ``REPLACE`` step for a ghost hit runs when the miss is handled, i.e. in :meth:`evict` when
  ``incoming`` is the ghost key (this is why ARC needs ``incoming``);
* ``p`` is a float and moves by ``max(|B2| / |B1|, 1)`` on a ``B1`` hit, ``max(|B1| / |B2|, 1)`` on a
  ``B2`` hit (true division, as in the paper's reference code), clamped to ``[0, capacity]``;
* ``REPLACE`` takes from ``T1`` when ``|T1| > p``, or ``|T1| == p`` on a ``B2`` hit, or ``T2`` is empty;
* a plain miss with ``|T1| + |B1| + 1 > c`` drops the ``B1`` LRU and replaces when ``B1`` is not empty,
  else evicts the ``T1`` LRU without a ghost; otherwise the ``B2`` LRU is dropped when the four
  lists hold ``>= 2c`` keys, then ``REPLACE``.

kvtier additions: protected keys are skipped (the next unprotected key from the LRU end of the same
list is taken, falling back to the other list); an ``insert`` of a ghost key while the cache has room
(possible only after owner removals) adapts ``p`` and enters ``T2`` without a ``REPLACE``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from kvtier.keys import BlockInfo, BlockKey
from kvtier.policies.quota import QuotaAwarePolicy, unprotected_count

__all__ = ["ARCPolicy"]

_Lru = OrderedDict[BlockKey, None]


def _lru_unprotected(lst: _Lru, protected: Collection[BlockKey]) -> BlockKey | None:
    """Least recently used key of ``lst`` not in ``protected``."""
    for key in lst:
        if key not in protected:
            return key
    return None


class ARCPolicy(QuotaAwarePolicy):
    """Adaptive Replacement Cache. Options: ``tenant_quota``."""

    name = "arc"

    def __init__(self, capacity: int, *, tenant_quota: float | None = None) -> None:
        super().__init__(capacity, tenant_quota=tenant_quota)
        # Every list is ordered LRU first; the ghosts hold keys only.
        self._t1: _Lru = OrderedDict()
        self._t2: _Lru = OrderedDict()
        self._b1: _Lru = OrderedDict()
        self._b2: _Lru = OrderedDict()
        self._p = 0.0
        # A ghost hit consumed by evict(incoming=k): the following insert(k) goes to T2.
        self._pending_ghost: BlockKey | None = None
        self._resident = (self._t1, self._t2)

    @property
    def target_t1(self) -> float:
        """ARC's adaptive target size ``p`` of ``T1``."""
        return self._p

    def _insert(self, key: BlockKey, info: BlockInfo | None) -> None:
        if self._pending_ghost == key:
            self._pending_ghost = None
            self._t2[key] = None
            return
        ghost = self._ghost_of(key)
        if ghost is not None:
            self._adapt(from_b1=ghost is self._b1)
            del ghost[key]
            self._t2[key] = None
        else:
            self._t1[key] = None

    def _ghost_of(self, key: BlockKey) -> _Lru | None:
        """The ghost list (B1 or B2) remembering ``key``, if one does."""
        if key in self._b1:
            return self._b1
        return self._b2 if key in self._b2 else None

    def _touch(self, key: BlockKey) -> None:
        if key in self._t1:
            del self._t1[key]
            self._t2[key] = None
        else:
            self._t2.move_to_end(key)

    def _remove(self, key: BlockKey) -> None:
        # An invalidated block earns no ghost credit either.
        for lst in (self._t1, self._t2, self._b1, self._b2):
            lst.pop(key, None)
        if self._pending_ghost == key:
            self._pending_ghost = None

    def _adapt(self, *, from_b1: bool) -> None:
        b1, b2 = len(self._b1), len(self._b2)
        if from_b1:
            self._p = min(self._p + max(b2 / b1, 1.0), float(self.capacity))
        else:
            self._p = max(self._p - max(b1 / b2, 1.0), 0.0)

    def _replace(self, in_b2: bool, protected: Collection[BlockKey]) -> BlockKey:
        """The paper's REPLACE: demote the LRU of T1 or T2 to its ghost list."""
        t1_len = len(self._t1)
        prefer_t1 = (t1_len > 0 and (t1_len > self._p or (t1_len == self._p and in_b2))) or not self._t2
        first, ghost_first = (self._t1, self._b1) if prefer_t1 else (self._t2, self._b2)
        second, ghost_second = (self._t2, self._b2) if prefer_t1 else (self._t1, self._b1)
        victim = _lru_unprotected(first, protected)
        lst, ghost = first, ghost_first
        if victim is None:
            victim = _lru_unprotected(second, protected)
            lst, ghost = second, ghost_second
        assert victim is not None  # evict() checked that an unprotected key exists
        del lst[victim]
        ghost[victim] = None
        return victim

    def _evict_one(self, incoming: BlockKey | None, protected: Collection[BlockKey]) -> BlockKey:
        c = self.capacity
        if incoming is not None and (ghost := self._ghost_of(incoming)) is not None:
            # A ghost hit: adapt p, make room as REPLACE says, and let insert(incoming) go to T2.
            from_b1 = ghost is self._b1
            self._adapt(from_b1=from_b1)
            victim = self._replace(not from_b1, protected)
            del ghost[incoming]
            self._pending_ghost = incoming
            return victim
        if len(self._t1) + len(self._b1) + 1 > c:
            if self._b1:
                self._b1.popitem(last=False)
                return self._replace(False, protected)
            # T1 fills the cache by itself: evict its LRU outright, no ghost.
            oldest = _lru_unprotected(self._t1, protected)
            if oldest is None:
                return self._replace(False, protected)
            del self._t1[oldest]
            return oldest
        if len(self._t1) + len(self._t2) + len(self._b1) + len(self._b2) >= 2 * c and self._b2:
            self._b2.popitem(last=False)
        return self._replace(False, protected)

    def _evict(self, n: int, protected: Collection[BlockKey], incoming: BlockKey | None) -> list[BlockKey]:
        if unprotected_count(self, protected) < n:
            return []
        victims = [self._evict_one(incoming, protected)]
        victims += [self._evict_one(None, protected) for _ in range(n - 1)]
        return victims
