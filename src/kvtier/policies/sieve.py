"""SIEVE (Zhang et al., NSDI'24): a FIFO queue with a "visited" bit and a moving hand.

New keys enter at the head; a hit only sets the key's visited bit (no reordering, so hits are very
cheap). To evict, the hand walks from where it stopped towards the head (wrapping to the tail),
clearing visited bits, and evicts the first unvisited key; it then rests on that key's newer
neighbour. Matches libCacheSim 0.3.5's ``Sieve`` exactly on a flat trace.

kvtier addition: the hand steps over protected keys (clearing their bit if set, as it would anyway)
without evicting them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from kvtier.keys import BlockInfo, BlockKey
from kvtier.policies.quota import QuotaAwarePolicy, unprotected_count

__all__ = ["SIEVEPolicy"]


class _Node:
    __slots__ = ("key", "newer", "older", "visited")

    def __init__(self, key: BlockKey) -> None:
        self.key = key
        self.newer: _Node | None = None
        self.older: _Node | None = None
        self.visited = False


class SIEVEPolicy(QuotaAwarePolicy):
    """SIEVE eviction. Options: ``tenant_quota``."""

    name = "sieve"

    def __init__(self, capacity: int, *, tenant_quota: float | None = None) -> None:
        super().__init__(capacity, tenant_quota=tenant_quota)
        self._nodes: dict[BlockKey, _Node] = {}
        self._head: _Node | None = None  # newest
        self._tail: _Node | None = None  # oldest
        self._hand: _Node | None = None  # None: start from the tail
        self._resident = (self._nodes,)

    def _insert(self, key: BlockKey, info: BlockInfo | None) -> None:
        node = _Node(key)
        node.older = self._head
        if self._head is not None:
            self._head.newer = node
        else:
            self._tail = node
        self._head = node
        self._nodes[key] = node

    def _touch(self, key: BlockKey) -> None:
        self._nodes[key].visited = True

    def _unlink(self, node: _Node) -> None:
        if self._hand is node:
            self._hand = node.newer
        if node.newer is not None:
            node.newer.older = node.older
        else:
            self._head = node.older
        if node.older is not None:
            node.older.newer = node.newer
        else:
            self._tail = node.newer
        del self._nodes[node.key]

    def _remove(self, key: BlockKey) -> None:
        node = self._nodes.get(key)
        if node is not None:
            self._unlink(node)

    def _evict(self, n: int, protected: Collection[BlockKey], incoming: BlockKey | None) -> list[BlockKey]:
        if unprotected_count(self, protected) < n:
            return []
        victims: list[BlockKey] = []
        for _ in range(n):
            node = self._hand if self._hand is not None else self._tail
            assert node is not None
            while node.visited or node.key in protected:
                node.visited = False
                nxt = node.newer
                node = nxt if nxt is not None else self._tail
                assert node is not None
            self._unlink(node)  # moves the hand to the victim's newer neighbour
            self._hand = node.newer
            victims.append(node.key)
        return victims

    def touch_many(self, keys: Iterable[BlockKey]) -> None:
        if self._quota is not None:
            super().touch_many(keys)
            return
        nodes = self._nodes
        for key in keys:
            node = nodes.get(key)
            if node is not None:
                node.visited = True
