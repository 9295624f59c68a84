"""The ``example`` tier: the reference implementation of the :class:`SecondaryTier` contract.

It keeps blocks in process memory and really copies their bytes from and to the primary buffer
(vLLM's example tier only records keys), so tests can check round trips byte for byte. Jobs finish
inside ``submit_*`` (a memory copy is fast and cannot fail on a medium) but are reported through
:meth:`ExampleTier.get_finished_jobs` exactly once, like an asynchronous tier would.

Config::

    {"type": "example", "capacity_blocks": 1024}

``capacity_blocks`` (optional, default unbounded) bounds the number of blocks held; when full, the
least recently stored or loaded block is dropped (counted in ``evictions``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, ClassVar

from kvtier.errors import ConfigError, MisuseError
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.tiers.base import SecondaryTier, TierContext

__all__ = ["ExampleTier"]


class ExampleTier(SecondaryTier):
    """In-memory secondary tier that copies real bytes; LRU-bounded when ``capacity_blocks`` is set."""

    medium: ClassVar[str] = "CPU"

    def __init__(
        self,
        *,
        primary_kv_view: memoryview,
        context: TierContext,
        capacity_blocks: int | None = None,
    ) -> None:
        super().__init__(primary_kv_view=primary_kv_view, context=context)
        if capacity_blocks is not None and (
            isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int) or capacity_blocks < 1
        ):
            raise ConfigError("capacity_blocks", f"expected an integer >= 1 or null, got {capacity_blocks!r}")
        self.capacity_blocks = capacity_blocks
        # Insertion order doubles as recency order: move_to_end on every use makes it an LRU.
        self._blocks: OrderedDict[BlockKey, bytes] = OrderedDict()
        self._finished: list[JobResult] = []
        self._unreported: set[int] = set()
        self._closed = False

    # -- contract ----------------------------------------------------------------------------
    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        self.stats.lookups += 1
        if key in self._blocks:
            self.stats.hits += 1
            return LookupResult.HIT
        return LookupResult.MISS

    def submit_store(self, job: TransferJob) -> None:
        self._accept(job)
        start = time.perf_counter()
        nbytes = 0
        for key, slot in zip(job.keys, job.slot_ids, strict=True):
            if key in self._blocks:
                # Already held: skipped and counted as stored (its bytes are the same block).
                continue
            if self.capacity_blocks is not None and len(self._blocks) >= self.capacity_blocks:
                self._blocks.popitem(last=False)
                self.stats.evictions += 1
            # bytes(...) copies out of the primary row: the slot may be reused as soon as the job is
            # reported, so the tier must own its bytes.
            self._blocks[key] = self.slot_array(int(slot)).tobytes()
            nbytes += self.block_bytes
            self.stats.stores += 1
        self.stats.bytes_written += nbytes
        self._finish(JobResult(job.job_id, True, None, nbytes, time.perf_counter() - start))

    def submit_load(self, job: TransferJob) -> None:
        self._accept(job)
        start = time.perf_counter()
        done: set[BlockKey] = set()
        for key, slot in zip(job.keys, job.slot_ids, strict=True):
            data = self._blocks.get(key)
            if data is None:
                continue  # missing keys are simply left out of successful_keys
            self._blocks.move_to_end(key)
            self.slot_array(int(slot))[:] = memoryview(data)
            done.add(key)
        nbytes = len(done) * self.block_bytes
        self.stats.loads += len(done)
        self.stats.bytes_read += nbytes
        ok = len(done) == len(set(job.keys))
        if not ok:
            self.stats.failed_jobs += 1
        self._finish(
            JobResult(
                job.job_id,
                ok,
                None if ok else frozenset(done),
                nbytes,
                time.perf_counter() - start,
                None if ok else f"{len(set(job.keys)) - len(done)} key(s) not held",
            )
        )

    def get_finished_jobs(self) -> list[JobResult]:
        done, self._finished = self._finished, []
        for result in done:
            self._unreported.discard(result.job_id)
        return done

    def drain(self) -> None:
        """Nothing to wait for: every job finished inside its ``submit_*`` call."""

    def has_pending_work(self) -> bool:
        return bool(self._unreported)

    def touch(self, keys: Any) -> None:
        for key in keys:
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def config_info(self) -> dict[str, Any]:
        info = super().config_info()
        info["capacity_blocks"] = self.capacity_blocks
        info["blocks"] = len(self._blocks)
        return info

    def shutdown(self) -> None:
        self._closed = True

    # -- helpers -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        return key in self._blocks

    def _accept(self, job: TransferJob) -> None:
        # Misuse is raised (the engine has a bug); backend failures never are (there are none here).
        if self._closed:
            raise MisuseError(f"tier {self.name!r}: job {job.job_id} submitted after shutdown()")
        if job.job_id in self._unreported:
            raise MisuseError(f"tier {self.name!r}: job id {job.job_id} is already in flight")
        num_slots = self.rows.shape[0]
        for slot in job.slot_ids:
            if not 0 <= int(slot) < num_slots:
                raise MisuseError(
                    f"tier {self.name!r}: job {job.job_id} names slot {int(slot)} outside 0..{num_slots - 1}"
                )
        self._unreported.add(job.job_id)

    def _finish(self, result: JobResult) -> None:
        self._finished.append(result)
