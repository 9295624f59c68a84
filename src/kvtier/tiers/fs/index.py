"""The fs tier's in-memory picture of its tree: which blocks it holds, their order and what is busy.

Lookups are answered from here without a syscall (a dict membership test). Every field is guarded by
the tier's lock (the ``lock`` given to the constructor); methods named ``*_locked`` expect the caller
to hold it. The index never touches the disk: the store path, the load path and the scanner decide
*what* changes and do the file work; this class keeps the dicts, the policy and the warm-restart
flags consistent with each other.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence

from kvtier.keys import BlockKey, LookupResult
from kvtier.policies.base import CachePolicy
from kvtier.tiers.base import RemovalLog
from kvtier.tiers.fs.layout import Layout

__all__ = ["FsIndex"]


class FsIndex:
    """Held blocks (size and last access), the eviction policy, and the blocks in flight.

    Args:
        lock: the tier's lock; it guards every field.
        policy: orders the held blocks and picks victims (replaced after the start-up scan).
        present_tops: top-level shard directories that exist now; lookups in the others are
            authoritative MISSes at once (a fresh tree never answers RETRY).
        layout: the tree's layout (which top-level shard a key lives in).
        removals: where a held key that is forgotten is noted (the tier's log; a private one if
            ``None``).
    """

    def __init__(
        self,
        lock: threading.Lock,
        policy: CachePolicy,
        present_tops: set[int],
        layout: Layout,
        removals: RemovalLog | None = None,
    ) -> None:
        self.lock = lock
        self.removals = removals if removals is not None else RemovalLog()
        self.policy = policy
        #: Block -> file size in bytes.
        self.sizes: dict[BlockKey, int] = {}
        #: Block -> last access (wall clock; mtime on disk), for the restart order.
        self.access: dict[BlockKey, float] = {}
        #: Blocks being written by a store job of this process (never victims; a second store skips).
        self.storing: set[BlockKey] = set()
        #: Blocks being read by load jobs (never victims).
        self.loading: Counter[BlockKey] = Counter()
        #: Blocks removed while the start-up scan runs (the scan must not resurrect them).
        self.tombstones: set[BlockKey] = set()
        #: Top-level shards already scanned (lookups there are authoritative).
        self._top_of = layout.top_of
        self.top_done = bytearray(layout.top_count)
        for top in range(layout.top_count):
            if top not in present_tops:
                self.top_done[top] = 1
        #: The start-up scan has finished: every lookup is authoritative.
        self.scan_done = False

    # -- lookups (engine thread; no lock: dict reads are atomic) --------------------------------
    def answer(self, key: BlockKey) -> LookupResult:
        if key in self.sizes:
            return LookupResult.HIT
        if self.scan_done or self.top_done[self._top_of(key)]:
            return LookupResult.MISS
        return LookupResult.RETRY

    def __len__(self) -> int:
        return len(self.sizes)

    def __contains__(self, key: object) -> bool:
        return key in self.sizes

    # -- changes (lock held) ----------------------------------------------------------------------
    def protected_locked(self) -> set[BlockKey]:
        """Blocks that must not be evicted now (being read or written)."""
        return set(self.loading) | self.storing

    def touch_locked(self, keys: Iterable[BlockKey], now: float) -> None:
        """Keys were just used: refresh their policy order and access time."""
        policy = self.policy
        for k in keys:
            if k in self.sizes and k in policy:
                policy.touch(k)
                self.access[k] = now

    def forget_locked(self, key: BlockKey, *, evicted: bool = False) -> None:
        """Drop ``key`` (evicted, removed by another process, found missing or corrupt).

        ``evicted``: the policy chose ``key`` as a victim, so it has forgotten it already, keeping
        whatever history it keeps of victims (S3-FIFO's ghost, ARC's B1/B2); ``remove`` would
        erase that history too, and a victim stored again would be ordered as never seen."""
        if self.sizes.pop(key, None) is not None:
            self.removals.note((key,))
        self.access.pop(key, None)
        if not evicted:
            self.policy.remove(key)
        if not self.scan_done:
            self.tombstones.add(key)

    def add_locked(self, key: BlockKey, size: int, when: float) -> None:
        """Index a block now in the tree; the policy orders it if it has room."""
        if len(self.policy) < self.policy.capacity:
            self.policy.insert(key)
        self.sizes[key] = size
        self.access[key] = when

    def begin_loads_locked(self, keys: Iterable[BlockKey]) -> None:
        self.loading.update(keys)

    def end_loads_locked(self, keys: Sequence[BlockKey]) -> None:
        loading = self.loading
        loading.subtract(keys)
        for k in keys:
            if loading[k] <= 0:
                del loading[k]  # Counter: no KeyError for a key listed twice
