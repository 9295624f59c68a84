"""Where each small block is: the fs tier's in-memory map of its segments (tier lock held).

:class:`SegmentMap` keeps, for every block of the small-block path, its segment, offset and record
length, and per segment the blocks located there and their live bytes (what compaction would copy).
It keeps the tier's :class:`~kvtier.tiers.fs.index.FsIndex` (lookups, the eviction policy) in step:
a placed block is indexed, a forgotten one leaves the index. The latest record read for a key wins
(another process stored or compacted it: both records hold the same verified block).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.keys import BlockKey
from kvtier.tiers.fs.parts import FsParts
from kvtier.tiers.fs.segment_files import SegmentDir
from kvtier.tiers.fs.segment_index import SegmentName

__all__ = ["SegmentMap", "SegInfo"]


@dataclass(slots=True)
class SegInfo:
    """What this process knows of one segment (guarded by the tier lock)."""

    name: SegmentName
    keys: set[BlockKey] = field(default_factory=set)
    live: int = 0
    sealed: bool = False
    idx_off: int = 0  # bytes of the .idx decoded so far (others' segments)


class SegmentMap:
    """Blocks -> ``(segment, offset, length)`` and segments -> their blocks (see the module doc).

    Args:
        parts: the tier's shared parts (its index, stats).
        seg_dir: the segment directory (cached read descriptors are dropped with their segment).
    """

    def __init__(self, parts: FsParts, seg_dir: SegmentDir) -> None:
        self.parts = parts
        self.dir = seg_dir
        self.locs: dict[BlockKey, tuple[SegmentName, int, int]] = {}
        self.segs: dict[SegmentName, SegInfo] = {}

    @staticmethod
    def new_seg(name: SegmentName) -> SegInfo:
        return SegInfo(name)

    def live_locked(self, name: SegmentName) -> int:
        seg = self.segs.get(name)
        return 0 if seg is None else seg.live

    def evict_locked(self, n: int) -> int:
        index = self.parts.index
        victims = index.policy.evict(n, index.protected_locked())
        for v in victims:
            self.forget_locked(v, evicted=True)
        return len(victims)

    def place_locked(self, key: BlockKey, name: SegmentName, off: int, length: int, now: float) -> None:
        """``key``'s record is at ``off`` in segment ``name`` (the latest record read wins)."""
        old = self.locs.get(key)
        if old is not None:
            prev = self.segs.get(old[0])
            if prev is not None and key in prev.keys:
                prev.keys.discard(key)
                prev.live -= old[2]
        seg = self.segs.get(name)
        if seg is None:
            seg = self.segs[name] = SegInfo(name)
        self.locs[key] = (name, off, length)
        seg.keys.add(key)
        seg.live += length
        index = self.parts.index
        if key in index.sizes:
            return
        policy = index.policy
        if len(policy) >= policy.capacity:
            for v in policy.evict(1, index.protected_locked()):
                self.forget_locked(v, evicted=True)
        index.add_locked(key, length, now)

    def place_many_locked(
        self, name: SegmentName, recs: list[tuple[BlockKey, int, int]], when: float
    ) -> None:
        """:meth:`place_locked` for many records of one segment (the restart path: keys not yet
        located are added in bulk, the policy filled with one ``insert_many``)."""
        locs, index = self.locs, self.parts.index
        policy = index.policy
        fresh = [r for r in recs if r[0] not in locs and r[0] not in index.sizes]
        if len(fresh) != len(recs) or len(policy) + len(fresh) > policy.capacity:
            for key, off, length in recs:
                self.place_locked(key, name, off, length, when)
            return
        seg = self.segs.get(name)
        if seg is None:
            seg = self.segs[name] = SegInfo(name)
        keys = [k for k, _, _ in fresh]
        locs.update((k, (name, off, n)) for k, off, n in fresh)
        seg.keys.update(keys)
        seg.live += sum(n for _, _, n in fresh)
        index.sizes.update((k, n) for k, _, n in fresh)
        index.access.update((k, when) for k in keys)
        policy.insert_many(keys)

    def forget_locked(self, key: BlockKey, *, evicted: bool = False) -> None:
        loc = self.locs.pop(key, None)
        if loc is not None:
            seg = self.segs.get(loc[0])
            if seg is not None and key in seg.keys:
                seg.keys.discard(key)
                seg.live -= loc[2]
        if key in self.parts.index.sizes:
            self.parts.index.forget_locked(key, evicted=evicted)
            if evicted:
                self.parts.stats.evictions += 1

    def drop_segment_locked(self, name: SegmentName, keep: set[BlockKey] | None = None) -> None:
        """Segment ``name`` is gone: forget its blocks (but ``keep``, being copied elsewhere)."""
        seg = self.segs.pop(name, None)
        if seg is not None:
            for k in seg.keys:
                loc = self.locs.get(k)
                if loc is not None and loc[0] == name and (keep is None or k not in keep):
                    self.locs.pop(k)
                    if k in self.parts.index.sizes:
                        self.parts.index.forget_locked(k)
                        self.parts.stats.evictions += 1
        self.dir.drop(name)
