"""Prefix-aware eviction: leaf-first, frequency-learning, for KV caches.

A KV block is only useful as part of a *leading* run: block ``i`` of a prompt can be reused only if
blocks ``0..i-1`` are reused too. Generic policies ignore this and happily evict a prompt's first
block while its tail stays cached (the tail is then dead weight). This policy uses what a KV cache
knows and a generic cache does not:

* **Position in the prefix tree** (``BlockInfo.parent``): only *leaves* -- resident blocks with no
  resident child -- are eviction candidates, so a chain is always trimmed from its tail and a head
  is never evicted while its tail is cached (evicting it would strand the tail). Blocks whose parent
  is not resident (stranded: unusable as a prefix hit until the parent returns) go first.
* **Sharing frequency**: every access of a block counts, so a system-prompt block shared by many
  conversations carries the count of all of them.
* **A learned reuse curve**: the policy measures online, for each use count ``k`` (capped at 8) and
  each depth class (root, 1-3, 4-15, 16+), the fraction of blocks seen ``k`` times that are seen
  again (``P(reuse | k, depth)``). In conversation traces it climbs steeply with ``k`` (about 0.24,
  0.42, 0.50, 0.58, ... 0.88) -- the strongest signal there is -- and falls with depth (early blocks
  are shared by more conversations than late ones).
* **Ghost history**: counts and last-use times of recently evicted blocks (``ghost_factor`` x capacity
  entries, keys only) so a block that comes back resumes its count instead of starting over.

Priority of a leaf (lowest is evicted) combines recency and the reuse curve on one time scale::

    priority = last_use + horizon * ln P(reuse | uses, depth)

i.e. a block seen ``k`` times stays as long as a block seen once that was used ``horizon * ln(P(k) /
P(1))`` accesses more recently. ``horizon`` (in block accesses) defaults to the running mean *first*-reuse
distance the policy observes (a block's second use, as a hit or a ghost return) times 1.5, because
long distances are censored (never observed once both cache and ghost have forgotten the block); set
it to a fixed number to pin it. First reuses only: the blocks whose fate the horizon decides are the
ones seen once, and the short gaps of hot blocks (a template or system prompt every request reads)
say nothing about them (counted, they shrank the horizon several-fold on the arXiv trace, where 72 %
of reuses are 18 template blocks'). Because ``now`` is common to every block, the ordering is static
between touches, so a lazy heap suffices: ``touch``/``insert`` are O(log n), ``evict`` amortised
O(log n).

Protected keys are skipped; if every unprotected key is an inner node (all its leaves protected),
inner nodes are evicted in priority order as a last resort, so :meth:`evict` still returns exactly
``n`` victims whenever ``n`` unprotected keys exist. Without ``BlockInfo`` every block is its own
root and the policy is a frequency-aware LRU.

Options: ``horizon`` (None = adaptive), ``ghost_factor`` (4.0), ``tenant_quota``.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Collection

from kvtier.keys import BlockInfo, BlockKey
from kvtier.numbers import NONNEGATIVE, Range, check_number
from kvtier.policies.quota import QuotaAwarePolicy, unprotected_count

__all__ = ["PrefixAwarePolicy"]

_MAX_CLASS = 8  # use counts above this share one reuse estimate
_REFRESH = 256  # uses between refreshes of the cached curve
#: A fixed horizon: block accesses, > 0 (``None`` is the adaptive one).
_HORIZON = Range(0, 1e15, open_low=True, unit="block accesses")
_STRANDED = -math.inf


def _depth_bucket(depth: int) -> int:
    """Chain position class: the root, blocks 1-3, 4-15, 16 and deeper."""
    return 0 if depth <= 0 else 1 if depth < 4 else 2 if depth < 16 else 3


class _Entry:
    __slots__ = ("depth", "last", "parent", "prio", "uses")

    def __init__(self, parent: BlockKey | None, depth: int, uses: int, last: int) -> None:
        self.parent = parent
        self.depth = depth
        self.uses = uses
        self.last = last
        self.prio = 0.0


class PrefixAwarePolicy(QuotaAwarePolicy):
    """Leaf-first eviction ordered by recency plus a learned reuse-probability curve."""

    name = "prefix"

    def __init__(
        self,
        capacity: int,
        *,
        horizon: float | None = None,
        ghost_factor: float = 4.0,
        tenant_quota: float | None = None,
    ) -> None:
        super().__init__(capacity, tenant_quota=tenant_quota)
        # kvtier.numbers' one check (finite, in range): NaN passed the old `<= 0` comparisons.
        if horizon is not None:
            check_number("horizon", horizon, _HORIZON)
        check_number("ghost_factor", ghost_factor, NONNEGATIVE)
        self._fixed_horizon = None if horizon is None else float(horizon)
        self._ghost_cap = int(ghost_factor * self.capacity)
        self._entries: dict[BlockKey, _Entry] = {}
        self._resident = (self._entries,)
        # Resident children per parent key (the parent itself may be absent: then they are stranded).
        self._kids: dict[BlockKey, set[BlockKey]] = {}
        self._heap: list[tuple[float, int, BlockKey]] = []  # candidate leaves, lazily validated
        self._seq = 0
        self._clock = 0
        self._ghost: OrderedDict[BlockKey, tuple[int, int]] = OrderedDict()  # key -> (uses, last)
        # reach[b][k]: blocks of depth class b that reached k uses (k < _MAX_CLASS); for the top
        # class, accesses made at >= _MAX_CLASS uses and how many were followed by another one.
        self._reach = [[0] * (_MAX_CLASS + 2) for _ in range(4)]
        self._gap_mean = float(max(self.capacity, 16))  # adaptive horizon: mean first-reuse distance
        # Cached ln P(reuse | k) and horizon, refreshed every _REFRESH uses: scoring is on the hot
        # path, and the curve moves slowly once a few thousand accesses have been seen.
        self._logp = [[0.0] * (_MAX_CLASS + 1) for _ in range(4)]
        self._horizon_now = 0.0
        self._until_refresh = 0
        self._refresh()

    # ---------------------------------------------------------------------------------- queries
    @property
    def horizon(self) -> float:
        """Current horizon (block accesses) weighing frequency against recency."""
        if self._fixed_horizon is not None:
            return self._fixed_horizon
        # Reuse distances longer than what the cache plus its ghost can remember are never seen,
        # so the observed mean is biased low; scaling it by 1.5 is a simple, capacity-free correction
        # (1.0 under-weights frequency in small caches, 2.0 over-weights it in large ones).
        return 1.5 * self._gap_mean

    def reuse_probability(self, uses: int, depth: int = 0) -> float:
        """The learned ``P(reuse | uses, depth class)`` (Laplace-smoothed)."""
        k = min(max(uses, 1), _MAX_CLASS)
        reach = self._reach[_depth_bucket(depth)]
        return (reach[k + 1] + 1) / (reach[k] + 2)

    # ------------------------------------------------------------------------------- internals
    def _refresh(self) -> None:
        self._logp = [
            [0.0] + [math.log((reach[k + 1] + 1) / (reach[k] + 2)) for k in range(1, _MAX_CLASS + 1)]
            for reach in self._reach
        ]
        self._horizon_now = self.horizon
        self._until_refresh = _REFRESH

    def _count_use(self, uses: int, bucket: int) -> None:
        reach = self._reach[bucket]
        reach[min(uses, _MAX_CLASS)] += 1
        if uses > _MAX_CLASS:
            reach[_MAX_CLASS + 1] += 1
        self._until_refresh -= 1
        if self._until_refresh <= 0:
            self._refresh()

    def _observe_gap(self, gap: int) -> None:
        self._gap_mean += (gap - self._gap_mean) / 1024.0

    def _score(self, key: BlockKey, entry: _Entry) -> None:
        parent = entry.parent
        if parent is not None and parent not in self._entries:
            entry.prio = _STRANDED  # unreachable as a prefix hit until its parent returns
        else:
            uses = entry.uses
            entry.prio = (
                entry.last
                + self._horizon_now
                * self._logp[_depth_bucket(entry.depth)][uses if uses < _MAX_CLASS else _MAX_CLASS]
            )
        if not self._kids.get(key):
            self._seq += 1
            heapq.heappush(self._heap, (entry.prio, self._seq, key))

    def _insert(self, key: BlockKey, info: BlockInfo | None) -> None:
        self._clock += 1
        parent = info.parent if info is not None else None
        uses = 1
        past = self._ghost.pop(key, None)
        if past is not None:
            uses = past[0] + 1
            if past[0] == 1:
                self._observe_gap(self._clock - past[1])
        entry = _Entry(parent, info.depth if info is not None else 0, uses, self._clock)
        self._count_use(uses, _depth_bucket(entry.depth))
        self._entries[key] = entry
        if parent is not None:
            self._kids.setdefault(parent, set()).add(key)
        self._score(key, entry)
        # Resident children of this key (kept while it was away) are reachable again.
        self._rescore_children(key)

    def _rescore_children(self, key: BlockKey) -> None:
        """Re-score ``key``'s resident children after it arrived or left (stranded or not)."""
        children = self._kids.get(key)
        if children:
            entries = self._entries
            for child in children:
                self._score(child, entries[child])

    def _touch(self, key: BlockKey) -> None:
        entry = self._entries[key]
        self._clock += 1
        if entry.uses == 1:
            self._observe_gap(self._clock - entry.last)
        entry.uses += 1
        entry.last = self._clock
        self._count_use(entry.uses, _depth_bucket(entry.depth))
        self._score(key, entry)
        if len(self._heap) > 4 * len(self._entries) + 64:
            self._compact()  # hits alone (no evictions) must not grow the lazy heap without bound

    def _drop(self, key: BlockKey) -> _Entry:
        entry = self._entries.pop(key)
        parent = entry.parent
        if parent is not None:
            siblings = self._kids[parent]
            siblings.discard(key)
            if not siblings:
                del self._kids[parent]
                pentry = self._entries.get(parent)
                if pentry is not None:  # the parent just became a leaf: a candidate now
                    self._seq += 1
                    heapq.heappush(self._heap, (pentry.prio, self._seq, parent))
        # Rare (leaf-first eviction avoids it; owner removals, quotas and pins can force it): the
        # children left behind are now stranded and should go first.
        self._rescore_children(key)
        return entry

    def _remove(self, key: BlockKey) -> None:
        if key in self._entries:
            self._drop(key)
            self._ghost.pop(key, None)

    def _remember(self, key: BlockKey, entry: _Entry) -> None:
        if self._ghost_cap <= 0:
            return
        self._ghost[key] = (entry.uses, entry.last)
        while len(self._ghost) > self._ghost_cap:
            self._ghost.popitem(last=False)

    def _pop_leaf(
        self, protected: Collection[BlockKey], skipped: list[tuple[float, int, BlockKey]]
    ) -> BlockKey | None:
        heap, entries, kids = self._heap, self._entries, self._kids
        while heap:
            item = heapq.heappop(heap)
            prio, _, key = item
            entry = entries.get(key)
            if entry is None or entry.prio != prio or kids.get(key):
                continue  # stale: evicted, re-scored, or no longer a leaf
            if key in protected:
                skipped.append(item)
                continue
            return key
        return None

    def _evict(self, n: int, protected: Collection[BlockKey], incoming: BlockKey | None) -> list[BlockKey]:
        if unprotected_count(self, protected) < n:
            return []
        victims: list[BlockKey] = []
        skipped: list[tuple[float, int, BlockKey]] = []
        for _ in range(n):
            key = self._pop_leaf(protected, skipped)
            if key is None:
                # Every unprotected key is an inner node above protected leaves: take the deepest
                # (it strands the fewest blocks), lowest priority first among equals.
                key = min(
                    (k for k in self._entries if k not in protected),
                    key=lambda k: (-self._entries[k].depth, self._entries[k].prio),
                )
            entry = self._drop(key)
            self._remember(key, entry)
            victims.append(key)
        for item in skipped:
            heapq.heappush(self._heap, item)
        if len(self._heap) > 4 * len(self._entries) + 64:
            self._compact()
        return victims

    def _compact(self) -> None:
        """Rebuild the heap from the live leaves (drops stale entries)."""
        kids = self._kids
        self._heap = [(e.prio, i, k) for i, (k, e) in enumerate(self._entries.items()) if not kids.get(k)]
        self._seq = len(self._heap)
        heapq.heapify(self._heap)
