"""The primary tier: one host buffer of fixed-size slots, their states and pins.

Mechanism only: the :class:`PrimaryTier` owns the buffer, the key -> slot index, the free list, the
per-slot state and pin counts; *which* block to evict is the :class:`~kvtier.policies.base.CachePolicy`'s
decision. Orchestration (secondary tiers, write policies, jobs) lives in :mod:`kvtier.engine`.

Slot states::

    FREE --reserve--> WRITING --commit--> READY <--pin/unpin--> READY+pinned(n)
                         |                  |  evict (write_back, not yet in a tier)
                         +--abort--> FREE   +------------------> FLUSHING --last unpin--> FREE

* WRITING: bytes are being written (by the inference engine or a promotion); never readable and never
  in the policy, so never a victim.
* READY: readable, in the policy (evictable unless pinned).
* FLUSHING: chosen as a victim but still being copied to a secondary tier (write-back); readable, no
  longer in the policy, freed when the last pin goes -- unless a lookup hits it first, which makes it
  READY again (:meth:`PrimaryTier.rescue`).

Every method is called under the engine's lock; none blocks. Per-slot state lives in a ``bytearray``
and ``array('i')`` (fast per-element access from Python: a request is ~25 blocks, where numpy's fixed
cost per operation would dominate) with numpy views over the same memory for whole-buffer scans
(stats, reset, flush). The simulate path must stay near one microsecond per block.
"""

from __future__ import annotations

import array
import enum
import itertools
import logging
import os
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from kvtier.config import row_stride
from kvtier.errors import ConfigError, MisuseError
from kvtier.keys import BlockInfo, BlockKey
from kvtier.policies.base import CachePolicy
from kvtier.transfer.buffers import HostBuffer, attach_buffer, open_buffer

__all__ = ["BACKINGS", "PrimaryTier", "SlotState"]

log = logging.getLogger(__name__)

BACKINGS = ("heap", "shm", "torch", "none")

I32 = npt.NDArray[np.integer[Any]]


class SlotState(enum.IntEnum):
    """State of one primary slot (one byte of ``PrimaryTier.states``)."""

    FREE = 0
    WRITING = 1
    READY = 2
    FLUSHING = 3


# Plain ints derived once from SlotState: the per-block loops compare exact ints (which CPython
# specialises) and store them into the ``states`` bytearray.
_FREE, _WRITING, _READY, _FLUSHING = (
    int(SlotState.FREE), int(SlotState.WRITING), int(SlotState.READY), int(SlotState.FLUSHING)
)  # fmt: skip


class PrimaryTier:
    """Slots of ``row_stride`` bytes in one contiguous buffer, ordered by a policy.

    Args:
        num_slots: number of slots (the policy's capacity).
        block_bytes: payload bytes per block; ``row_stride`` is this rounded up to 4 KiB, plus
            ``row_pad`` rounded up to 4 KiB.
        row_pad: bytes each row keeps free after its block (``primary_row_pad``): a tier may use
            the end of row ``s - 1`` as the room right in front of slot ``s`` (the mooncake tier
            writes a block header there). Nothing else reads or writes past a row's block.
        policy: orders READY keys and picks victims; capacity must be ``num_slots``.
        backing: ``heap`` | ``shm`` | ``torch`` | ``none`` (see :mod:`kvtier.transfer.buffers`).
        shm_name: shared-memory name (``shm`` backing only).
        external: caller-owned memory used instead of allocating a buffer (``backing`` is then
            ``external``; see :func:`~kvtier.transfer.buffers.attach_buffer`).

    Attributes:
        primary_kv_view: 2-D zero-copy ``memoryview`` ``(num_slots, row_stride)``; for ``none`` the
            rows have length 0 (metadata only).
        rows: the same memory as a ``uint8`` numpy array.
        states: per-slot :class:`SlotState` values (``bytearray``; ``states_np`` is a numpy view).
        pins: per-slot reader count (``array('i')``; ``pins_np`` is a numpy view).
        index: key -> slot for every non-FREE slot; ``slot_keys`` the reverse.

    Slot arguments are sequences of ints (lists or ``int32`` arrays).
    """

    def __init__(
        self,
        num_slots: int,
        block_bytes: int,
        policy: CachePolicy,
        *,
        backing: str = "heap",
        shm_name: str | None = None,
        external: Any = None,
        row_pad: int = 0,
    ) -> None:
        if num_slots < 1:
            raise ConfigError(
                "cpu_bytes_to_use", f"the primary tier needs at least one slot, got {num_slots}"
            )
        if block_bytes < 1:
            raise ConfigError("block_bytes", f"must be at least 1 byte, got {block_bytes}")
        if backing not in BACKINGS:
            raise ConfigError("primary_backing", f"expected one of {', '.join(BACKINGS)}, got {backing!r}")
        if policy.capacity != num_slots:
            raise MisuseError(f"policy capacity {policy.capacity} != primary slots {num_slots}")
        n = int(num_slots)
        self.num_slots = n
        self.block_bytes = int(block_bytes)
        self.row_stride = row_stride(self.block_bytes, row_pad)
        self.policy = policy
        if external is not None:
            self.backing = "external"
            self._buffer: HostBuffer = attach_buffer(external, n, self.row_stride)
        else:
            self.backing = backing
            self._buffer = open_buffer(backing, n, self.row_stride, shm_name)
        self.rows: npt.NDArray[np.uint8] = self._buffer.rows
        self.primary_kv_view: memoryview = self._buffer.view
        self.states = bytearray(n)
        self.pins = array.array("i", bytes(4 * n))
        self.hits = array.array("i", bytes(4 * n))
        # 1 once the block has been handed to (or came from) the secondary tiers; write-back frees
        # such victims at once instead of flushing them again. ``hits`` and ``persisted`` are set
        # only by the engine's :class:`~kvtier.engine.writes.Residency` (the one owner of "which
        # block is in the tiers"); this class reads them and clears them when a slot is freed.
        self.persisted = bytearray(n)
        self.states_np = np.frombuffer(self.states, dtype=np.uint8)
        self.pins_np = np.frombuffer(self.pins, dtype=np.int32)
        self.persisted_np = np.frombuffer(self.persisted, dtype=np.uint8)
        self.slot_keys: list[BlockKey | None] = [None] * n
        self.index: dict[BlockKey, int] = {}
        # LIFO free stack: slot 0 is handed out first; reuse of warm rows keeps page faults low.
        self._free: list[int] = list(range(n - 1, -1, -1))
        self._pinned: set[BlockKey] = set()
        self._nflushing = 0
        # len(policy) kept here: the policy's __len__ is a Python call on the per-request path.
        self._in_policy = 0
        self.closed = False
        #: Whether ``hits``/``persisted`` matter (secondary tiers exist); skipped on the simulate path.
        self.track_tiers = True

    # -- queries -----------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def pinned_keys(self) -> frozenset[BlockKey]:
        return frozenset(self._pinned)

    def find(self, keys: Sequence[BlockKey]) -> list[int]:
        """Slot of each key, ``-1`` when not resident (any non-FREE state counts as resident)."""
        return list(map(self.index.get, keys, itertools.repeat(-1, len(keys))))

    def readable(self, slot: int) -> bool:
        return slot >= 0 and self.states[slot] in (_READY, _FLUSHING)

    def keys_of(self, slots: Sequence[int] | I32) -> list[BlockKey]:
        """Keys held by non-FREE ``slots``."""
        sk = self.slot_keys
        return cast(list[BlockKey], [sk[s] for s in _ints(slots)])

    def counts(self) -> dict[str, int]:
        """Slot counts by state (O(num_slots); for stats, not the hot path)."""
        st = self.states_np
        return {
            "num_slots": self.num_slots,
            "free": len(self._free),
            "writing": int(np.count_nonzero(st == _WRITING)),
            "ready": int(np.count_nonzero(st == _READY)),
            "flushing": int(np.count_nonzero(st == _FLUSHING)),
            "pinned": int(np.count_nonzero(self.pins_np)),
            "resident": len(self.index),
            "policy_len": len(self.policy),
            "row_stride": self.row_stride,
            "block_bytes": self.block_bytes,
        }

    # -- allocation --------------------------------------------------------------------------
    def reserve(
        self, keys: Sequence[BlockKey], *, flush_dirty: bool = False, evict: bool = True
    ) -> tuple[list[int], list[int], list[BlockKey], list[BlockKey], list[int], int]:
        """Reserve WRITING slots for the keys not resident yet, evicting READY blocks if needed.

        Returns ``(positions, slots, evicted, flush_keys, flush_slots, dropped)``: ``positions``
        index into ``keys`` (accepted keys, in order; duplicates and resident keys skipped),
        ``slots`` their new slots; ``evicted`` are the victims freed at once; with ``flush_dirty``
        victims not yet persisted in a secondary tier become FLUSHING instead (``flush_keys`` /
        ``flush_slots``): the caller must pin them and submit a store job. ``dropped`` counts the
        new keys left out because every other slot is pinned, writing or flushing (or, with
        ``evict=False``, because no slot is free).
        """
        n = len(keys)
        if n == 0:
            return [], [], [], [], [], 0
        found = list(map(self.index.get, keys, itertools.repeat(-1, n)))
        if max(found) < 0:  # the usual case: the caller passes the misses of its lookup
            pos = list(range(n))
            new_keys = keys if isinstance(keys, list) else list(keys)
        else:
            pos = [i for i, s in enumerate(found) if s < 0]
            if not pos:
                return [], [], [], [], [], 0
            new_keys = [keys[i] for i in pos]
        if len(set(new_keys)) != len(new_keys):
            first: dict[BlockKey, int] = {}
            for i in pos:
                first.setdefault(keys[i], i)
            pos = list(first.values())
            new_keys = list(first)
        need = len(pos)
        free = self._free
        evicted: list[BlockKey] = []
        flush_keys: list[BlockKey] = []
        flush_slots: list[int] = []
        if need > len(free) and evict:
            evicted, flush_keys, flush_slots = self._evict(need - len(free), new_keys[0], flush_dirty)
        take = min(need, len(free))
        if take == 0:
            return [], [], evicted, flush_keys, flush_slots, need
        slots = free[-take:]
        del free[-take:]
        slots.reverse()
        states = self.states
        sk = self.slot_keys
        if take < need:
            pos = pos[:take]
            new_keys = new_keys[:take]
        for s, k in zip(slots, new_keys, strict=True):  # plain loops: 3.11 specialises stores
            states[s] = _WRITING
            sk[s] = k
        self.index.update(zip(new_keys, slots, strict=True))
        return pos, slots, evicted, flush_keys, flush_slots, need - take

    def _evict(
        self, want: int, incoming: BlockKey, flush_dirty: bool
    ) -> tuple[list[BlockKey], list[BlockKey], list[int]]:
        policy = self.policy
        # Pinned READY keys are in the policy but not evictable; FLUSHING keys are pinned but were
        # already removed from the policy.
        evictable = self._in_policy - (len(self._pinned) - self._nflushing)
        n = min(want, evictable)
        if n <= 0:
            return [], [], []
        victims = policy.evict(n, self._pinned, incoming)
        if not victims:
            return [], [], []
        self._in_policy -= len(victims)
        index = self.index
        if flush_dirty:
            persisted = self.persisted
            dirty = [v for v in victims if not persisted[index[v]]]
            if dirty:
                clean = [v for v in victims if persisted[index[v]]]
                fslots = [index[v] for v in dirty]
                states = self.states
                for s in fslots:
                    states[s] = _FLUSHING
                self._nflushing += len(dirty)
                self._release(clean)
                return clean, dirty, fslots
        self._release(victims)
        return victims, [], []

    def _release(self, keys: Sequence[BlockKey]) -> None:
        """FREE the slots of ``keys`` and push them on the free stack."""
        pop = self.index.pop
        sk = self.slot_keys
        states = self.states
        hits = self.hits
        persisted = self.persisted
        slots = list(map(pop, keys))
        # Pushed in reverse so the next reserve pops them back in this order: victims freed in LRU
        # order come back as ascending runs, which the movers copy with one call per run.
        self._free.extend(reversed(slots))
        if not self.track_tiers:
            for s in slots:
                sk[s] = None
                states[s] = _FREE
            return
        for s in slots:
            sk[s] = None
            states[s] = _FREE
            hits[s] = 0
            persisted[s] = 0

    def commit(
        self,
        keys: Sequence[BlockKey],
        slots: Sequence[int] | I32,
        infos: Sequence[BlockInfo | None] | None = None,
    ) -> None:
        """WRITING -> READY for ``slots`` (holding ``keys``) and insert them into the policy."""
        sl = slots if type(slots) is list else _ints(slots)
        states = self.states
        for s in sl:
            if states[s] != _WRITING:
                raise MisuseError("commit of a slot that is not WRITING (completed twice?)")
        for s in sl:
            states[s] = _READY
        if sl:
            self.policy.insert_many(keys, infos)
            self._in_policy += len(sl)

    def abort(self, keys: Sequence[BlockKey], slots: Sequence[int] | I32) -> None:
        """WRITING -> FREE (a failed store or promotion)."""
        states = self.states
        for s in _ints(slots):
            if states[s] != _WRITING:
                raise MisuseError("abort of a slot that is not WRITING (completed twice?)")
        self._release(keys)

    def rescue(self, keys: Sequence[BlockKey]) -> None:
        """FLUSHING -> READY for ``keys`` (a write-back victim was hit again: keep it).

        The flush job still runs (its pin stays); when it ends the slot is simply unpinned. Safe for
        the policy's capacity: FLUSHING blocks are not in it, so it has room for each of them.
        """
        index, states = self.index, self.states
        back: list[BlockKey] = []
        for k in keys:  # state flips at once, so a key listed twice is rescued once
            s = index[k]
            if states[s] == _FLUSHING:
                states[s] = _READY
                back.append(k)
        self._nflushing -= len(back)
        if back:
            self.policy.insert_many(back)
            self._in_policy += len(back)

    # -- pins --------------------------------------------------------------------------------
    def pin(self, slots: Sequence[int] | I32) -> None:
        """Add one reader to each slot (READY or FLUSHING only)."""
        sl = _ints(slots)
        states = self.states
        for s in sl:
            if states[s] != _READY and states[s] != _FLUSHING:
                raise MisuseError("pin of a slot that is not readable (WRITING or FREE)")
        pins = self.pins
        sk = self.slot_keys
        add = self._pinned.add
        for s in sl:
            if pins[s] == 0:
                add(sk[s])  # type: ignore[arg-type]
            pins[s] += 1

    def unpin(self, slots: Sequence[int] | I32) -> list[BlockKey]:
        """Drop one reader from each slot; returns the keys of FLUSHING slots freed by this."""
        sl = _ints(slots)
        pins = self.pins
        for s in sl:
            if pins[s] <= 0:
                raise MisuseError("unpin of a slot that is not pinned (complete_load called twice?)")
        freed: list[BlockKey] = []
        sk = self.slot_keys
        states = self.states
        for s in sl:
            p = pins[s] - 1
            if p < 0:  # the same slot twice in one call, more often than it was pinned
                raise MisuseError("unpin of a slot more often than it was pinned")
            pins[s] = p
            if p == 0:
                k = sk[s]
                self._pinned.discard(k)
                if states[s] == _FLUSHING:
                    freed.append(k)  # type: ignore[arg-type]
        if freed:
            self._nflushing -= len(freed)
            self._release(freed)
        return freed

    # -- bulk --------------------------------------------------------------------------------
    def drop_unpinned(self) -> list[BlockKey]:
        """Free every READY slot without pins (``reset``); WRITING/FLUSHING/pinned slots stay."""
        victims = np.flatnonzero((self.states_np == _READY) & (self.pins_np == 0))
        keys = self.keys_of(victims)
        remove = self.policy.remove
        for k in keys:
            remove(k)
        self._in_policy -= len(keys)
        self._release(keys)
        return keys

    def dirty_ready(self) -> list[int]:
        """READY slots whose block is not yet in the secondary tiers."""
        due: list[int] = np.flatnonzero((self.states_np == _READY) & (self.persisted_np == 0)).tolist()
        return due

    def close(self) -> None:
        """Release the buffer (shared memory is unlinked by its last user). Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._buffer.close()

    def config_info(self) -> dict[str, Any]:
        return {
            "backing": self.backing,
            "num_slots": self.num_slots,
            "row_stride": self.row_stride,
            "block_bytes": self.block_bytes,
            "bytes": self.num_slots * self.row_stride if self.backing != "none" else 0,
            "pid": os.getpid(),
        }


def _ints(slots: Sequence[int] | I32) -> list[int]:
    if isinstance(slots, np.ndarray):
        return cast(list[int], slots.tolist())
    return slots if isinstance(slots, list) else list(slots)
