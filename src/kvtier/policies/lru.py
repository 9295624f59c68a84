"""Least-recently-used eviction: the baseline every other policy is measured against.

An :class:`~collections.OrderedDict` keeps keys from least to most recently used; ``touch`` is a
``move_to_end`` and ``evict`` pops from the front, skipping protected keys. Matches libCacheSim's LRU
exactly (same hit ratio on any trace), and is the fastest built-in (several million ops/s).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

from kvtier.keys import BlockInfo, BlockKey
from kvtier.policies.quota import QuotaAwarePolicy

__all__ = ["LRUPolicy"]


class LRUPolicy(QuotaAwarePolicy):
    """Evicts the least recently inserted-or-touched unprotected key.

    Options: ``tenant_quota`` (see :mod:`kvtier.policies.quota`).
    """

    name = "lru"

    def __init__(self, capacity: int, *, tenant_quota: float | None = None) -> None:
        super().__init__(capacity, tenant_quota=tenant_quota)
        # Front = least recently used. Values unused; an OrderedDict is a C-level linked hash map.
        self._order: OrderedDict[BlockKey, None] = OrderedDict()
        self._resident = (self._order,)

    def _insert(self, key: BlockKey, info: BlockInfo | None) -> None:
        self._order[key] = None

    def _touch(self, key: BlockKey) -> None:
        self._order.move_to_end(key)

    def _remove(self, key: BlockKey) -> None:
        self._order.pop(key, None)

    def _evict(self, n: int, protected: Collection[BlockKey], incoming: BlockKey | None) -> list[BlockKey]:
        order = self._order
        if n > len(order):
            return []
        if not protected:
            return [order.popitem(last=False)[0] for _ in range(n)]
        victims: list[BlockKey] = []
        for key in order:
            if key not in protected:
                victims.append(key)
                if len(victims) == n:
                    break
        else:
            return []
        for key in victims:
            del order[key]
        return victims

    # Hot-path batch versions: one C-level call per key, no per-key Python wrapper, when no quota.
    def touch_many(self, keys: Iterable[BlockKey]) -> None:
        if self._quota is not None:
            super().touch_many(keys)
            return
        move = self._order.move_to_end
        for key in keys:
            try:
                move(key)
            except KeyError:
                continue  # not resident: out of contract, ignored like touch()

    def insert_many(self, keys: Iterable[BlockKey], infos: Iterable[BlockInfo | None] | None = None) -> None:
        if self._quota is not None:
            super().insert_many(keys, infos)
            return
        if infos is not None:
            keys = list(keys)
            infos = list(infos)
            if len(keys) != len(infos):
                raise ValueError(f"insert_many: {len(keys)} keys but {len(infos)} infos")
        self._order.update(dict.fromkeys(keys))
