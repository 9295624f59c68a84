"""The ``example`` tier: the reference implementation of the :class:`SecondaryTier` contract.

It keeps blocks in process memory and really copies their bytes from and to the primary buffer
(vLLM's example tier only records keys), so tests can check round trips byte for byte. It is built on
:class:`~kvtier.tiers.async_tier.AsyncTier` like every I/O-doing tier, with ``runs_inline``: a memory
copy is fast and cannot fail on a medium, so each job runs as one chunk inside ``submit_*``, but it is
reported through :meth:`ExampleTier.get_finished_jobs` exactly once, like an asynchronous tier's.
Read it next to the base: it is the smallest complete tier (an index, a store chunk, a load chunk).

Config::

    {"type": "example", "capacity_blocks": 1024}

``capacity_blocks`` (optional, default unbounded) bounds the number of blocks held; when full, the
least recently stored or loaded block is dropped (counted in ``evictions``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, ClassVar

from kvtier.errors import ConfigError
from kvtier.keys import BlockKey, LookupResult
from kvtier.numbers import COUNT, Ranges
from kvtier.tiers.async_tier import AsyncTier, ChunkOutcome, JobState
from kvtier.tiers.base import TierContext

__all__ = ["ExampleTier"]

Item = tuple[BlockKey, int]


class ExampleTier(AsyncTier):
    """In-memory secondary tier that copies real bytes; LRU-bounded when ``capacity_blocks`` is set."""

    medium: ClassVar[str] = "CPU"
    runs_inline: ClassVar[bool] = True
    option_ranges: ClassVar[Ranges] = {"capacity_blocks": COUNT}

    def __init__(
        self,
        *,
        primary_kv_view: memoryview,
        context: TierContext,
        capacity_blocks: int | None = None,
    ) -> None:
        super().__init__(primary_kv_view=primary_kv_view, context=context, threads=1)
        if capacity_blocks is not None and (
            isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int) or capacity_blocks < 1
        ):
            raise ConfigError("capacity_blocks", f"expected an integer >= 1 or null, got {capacity_blocks!r}")
        self.capacity_blocks = capacity_blocks
        # Insertion order doubles as recency order: move_to_end on every use makes it an LRU.
        self._blocks: OrderedDict[BlockKey, bytes] = OrderedDict()

    # -- index (engine thread) -----------------------------------------------------------------
    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        return self.stats.counted(LookupResult.HIT if key in self._blocks else LookupResult.MISS)

    def touch(self, keys: Iterable[BlockKey]) -> None:
        for key in keys:
            if key in self._blocks:
                self._blocks.move_to_end(key)

    # -- block I/O (inline: the submitting thread) -----------------------------------------------
    def _store_chunk(self, state: JobState, items: list[Item]) -> ChunkOutcome:
        done: list[BlockKey] = []
        held: list[BlockKey] = []
        for key, slot in items:
            if key in self._blocks:
                # Already held (also: twice in this job): skipped and counted as stored, since
                # keys name content. Checked in job order, so capacity eviction is sequential.
                held.append(key)
                continue
            if self.capacity_blocks is not None and len(self._blocks) >= self.capacity_blocks:
                victim, _ = self._blocks.popitem(last=False)
                self.stats.evictions += 1
                self.removals.note((victim,))
            # tobytes() copies out of the primary row: the slot may be reused as soon as the job is
            # reported, so the tier must own its bytes.
            self._blocks[key] = self.slot_array(slot).tobytes()
            done.append(key)
        return ChunkOutcome(done=done, nbytes=len(done) * self.block_bytes, held=held)

    def _load_chunk(self, state: JobState, items: list[Item]) -> ChunkOutcome:
        done: list[BlockKey] = []
        for key, slot in items:
            data = self._blocks.get(key)
            if data is None:
                continue  # missing keys are simply left out of successful_keys
            self._blocks.move_to_end(key)
            self.slot_array(slot)[:] = memoryview(data)
            done.append(key)
        missing = len({k for k, _ in items}) - len(set(done))
        error = f"{missing} key(s) not held" if missing else None
        return ChunkOutcome(done=done, nbytes=len(done) * self.block_bytes, error=error)

    def config_info(self) -> dict[str, Any]:
        info = super().config_info()
        info["capacity_blocks"] = self.capacity_blocks
        info["blocks"] = len(self._blocks)
        return info

    # -- helpers -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        return key in self._blocks
