"""Per-tenant quotas, implemented once for every built-in policy.

:class:`QuotaAwarePolicy` is the base of the built-ins. It implements the public
:class:`~kvtier.policies.base.CachePolicy` methods as thin wrappers around private ``_insert``,
``_touch``, ``_remove`` and ``_evict`` hooks that each policy supplies; when the ``tenant_quota``
option is set, the wrappers also keep a :class:`TenantQuota` ledger and bias eviction.

Quota semantics (option ``tenant_quota``: fraction of capacity in ``(0, 1]``, default off):
    * the limit is ``max(1, floor(tenant_quota * capacity))`` blocks per *named* tenant (the
      ``BlockInfo.tenant`` passed to ``insert``); blocks inserted without a tenant are never charged;
    * when ``evict`` runs and some tenant holds more than its limit, that tenant's own least recently
      used unprotected blocks are the victims (largest overshoot first) before the wrapped policy is
      asked for the rest. So a tenant can overshoot only while the cache has free room or by one
      eviction batch; under contention it can never push everyone else out;
    * atomicity is kept: if the remaining victims cannot be found, nothing changes.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from kvtier.keys import BlockInfo, BlockKey
from kvtier.policies.base import CachePolicy

__all__ = ["QuotaAwarePolicy", "TenantQuota", "as_set", "unprotected_count"]


def as_set(protected: Collection[BlockKey]) -> Collection[BlockKey]:
    """``protected`` with O(1) membership (sets, frozensets and dicts pass through as they are)."""
    if isinstance(protected, set | frozenset | dict) or not protected:
        return protected
    return set(protected)


def unprotected_count(policy: CachePolicy, protected: Collection[BlockKey]) -> int:
    """Resident keys of ``policy`` that are not in ``protected`` (protected may hold absent keys)."""
    return len(policy) - sum(1 for k in as_set(protected) if k in policy)


class TenantQuota:
    """Ledger of which named tenant holds which resident keys, in least-recently-used order."""

    __slots__ = ("_by_tenant", "_owner", "limit")

    def __init__(self, capacity: int, fraction: float) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"tenant_quota must be a fraction in (0, 1], got {fraction!r}")
        self.limit = max(1, int(fraction * capacity))
        self._owner: dict[BlockKey, str] = {}
        self._by_tenant: dict[str, OrderedDict[BlockKey, None]] = {}

    def usage(self, tenant: str) -> int:
        """Resident blocks charged to ``tenant``."""
        keys = self._by_tenant.get(tenant)
        return len(keys) if keys is not None else 0

    def on_insert(self, key: BlockKey, info: BlockInfo | None) -> None:
        if info is None or info.tenant is None:
            return
        self._owner[key] = info.tenant
        self._by_tenant.setdefault(info.tenant, OrderedDict())[key] = None

    def on_touch(self, key: BlockKey) -> None:
        tenant = self._owner.get(key)
        if tenant is not None:
            self._by_tenant[tenant].move_to_end(key)

    def on_remove(self, key: BlockKey) -> None:
        tenant = self._owner.pop(key, None)
        if tenant is not None:
            keys = self._by_tenant[tenant]
            del keys[key]
            if not keys:
                del self._by_tenant[tenant]

    def forced_victims(self, n: int, protected: Collection[BlockKey]) -> list[BlockKey]:
        """Up to ``n`` unprotected keys of over-quota tenants (biggest overshoot first). No mutation."""
        over = [(len(keys) - self.limit, t) for t, keys in self._by_tenant.items() if len(keys) > self.limit]
        if not over:
            return []
        over.sort(reverse=True)
        victims: list[BlockKey] = []
        for excess, tenant in over:
            taken = 0
            for key in self._by_tenant[tenant]:
                if len(victims) == n or taken == excess:
                    break
                if key not in protected:
                    victims.append(key)
                    taken += 1
            if len(victims) == n:
                break
        return victims


class QuotaAwarePolicy(CachePolicy):
    """Base of the built-in policies: public methods wrap private hooks and apply tenant quotas.

    Out-of-contract calls are tolerated rather than trusted: ``touch`` of an absent key is ignored
    (``_touch`` must raise ``KeyError`` for it before changing anything that matters) and ``insert``
    of a resident key counts as a touch.

    Subclasses implement ``_insert``, ``_touch``, ``_remove`` (drop a resident key, no ghost entry)
    and ``_evict`` (the policy's own atomic choice, same contract as :meth:`CachePolicy.evict`), and
    set ``_resident`` to the mappings whose keys are the resident keys (disjoint; ghosts apart): one
    for most policies, ARC's T1 and T2, S3-FIFO's small and main queues. ``len``, ``in`` and
    iteration read them. Subclasses must not call the public methods internally.
    """

    def __init__(self, capacity: int, *, tenant_quota: float | None = None) -> None:
        super().__init__(capacity)
        self._quota: TenantQuota | None = (
            None if tenant_quota is None else TenantQuota(self.capacity, float(tenant_quota))
        )
        self._resident: tuple[Mapping[BlockKey, Any], ...] = ()

    def __len__(self) -> int:
        return sum(map(len, self._resident))

    def __contains__(self, key: object) -> bool:
        # A plain loop: any() over a generator costs ~5x on this per-reference path (sim, evaluate).
        for keys in self._resident:  # noqa: SIM110
            if key in keys:
                return True
        return False

    def __iter__(self) -> Iterator[BlockKey]:
        # A snapshot: the owner may evict while it walks the keys.
        return iter([key for keys in self._resident for key in keys])

    @abstractmethod
    def _insert(self, key: BlockKey, info: BlockInfo | None) -> None: ...

    @abstractmethod
    def _touch(self, key: BlockKey) -> None: ...

    @abstractmethod
    def _remove(self, key: BlockKey) -> None: ...

    @abstractmethod
    def _evict(
        self, n: int, protected: Collection[BlockKey], incoming: BlockKey | None
    ) -> list[BlockKey]: ...

    def insert(self, key: BlockKey, info: BlockInfo | None = None) -> None:
        if key in self:
            # Out of contract (the owner inserts absent keys only); a cache must not corrupt itself
            # or crash its caller over it, so a repeated insert counts as a hit.
            self.touch(key)
            return
        self._insert(key, info)
        if self._quota is not None:
            self._quota.on_insert(key, info)

    def touch(self, key: BlockKey) -> None:
        try:
            self._touch(key)
        except KeyError:
            return  # out of contract (not resident): ignored, a cache never crashes its caller
        if self._quota is not None:
            self._quota.on_touch(key)

    def remove(self, key: BlockKey) -> None:
        self._remove(key)
        if self._quota is not None:
            self._quota.on_remove(key)

    def evict(
        self,
        n: int = 1,
        protected: Collection[BlockKey] = (),
        incoming: BlockKey | None = None,
    ) -> list[BlockKey]:
        if n <= 0:
            return []
        protected = as_set(protected)
        quota = self._quota
        if quota is None:
            return self._evict(n, protected, incoming)
        forced = quota.forced_victims(n, protected)
        rest: list[BlockKey] = []
        if len(forced) < n:
            shield = set(protected)
            shield.update(forced)
            rest = self._evict(n - len(forced), shield, incoming)
            if not rest:
                return []
        for key in forced:
            self._remove(key)
            quota.on_remove(key)
        for key in rest:
            quota.on_remove(key)
        return forced + rest

    def touch_many(self, keys: Iterable[BlockKey]) -> None:
        for key in keys:
            self.touch(key)
