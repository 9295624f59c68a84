"""A third party's kvtier tier, loaded by the vLLM adapter through ``tier_module_path``.

Real code on the kvtier tier contract (``kvtier.tiers.base``), not a mock: blocks are copied from and
to the primary buffer on a worker thread. Options let a test make it slow (``delay``: seconds per
job, to hold copies in flight across a drain) or faulty in the ways a buggy or failing backend is:
``raise_on_submit`` (submit_* raises), ``duplicate_reports`` (every result is reported twice),
``fail_stores`` (every store job fails), ``lose_keys`` (each load loses its last key, which is then gone:
a partial success), ``drop_first_stored`` (a store job's first block is evicted again before the job
is reported). Blocks it stops holding are noted in the contract's removal log. The adapter must
turn all of these into vLLM's contract: no exception, one report per job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.tiers.base import SecondaryTier, TierContext


class ProbeTier(SecondaryTier):
    medium: ClassVar[str] = "CPU"

    def __init__(
        self,
        *,
        primary_kv_view: memoryview,
        context: TierContext,
        delay: float = 0.0,
        raise_on_submit: bool = False,
        duplicate_reports: bool = False,
        fail_stores: bool = False,
        lose_keys: bool = False,
        drop_first_stored: bool = False,
    ) -> None:
        super().__init__(primary_kv_view=primary_kv_view, context=context)
        self.delay = float(delay)
        self.raise_on_submit = raise_on_submit
        self.duplicate_reports = duplicate_reports
        self.fail_stores = fail_stores
        self.lose_keys = lose_keys
        self.drop_first_stored = drop_first_stored
        self.blocks: dict[BlockKey, bytes] = {}
        self.store_calls = 0
        self.copies_running = 0
        self.max_copies_seen_by_drain = -1
        self._lock = threading.Lock()
        self._results: list[JobResult] = []
        self._futures: list[Any] = []
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="probe-tier")

    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        self.stats.lookups += 1
        with self._lock:
            hit = key in self.blocks
        self.stats.hits += hit
        return LookupResult.HIT if hit else LookupResult.MISS

    def _run(self, job: TransferJob, load: bool) -> None:
        with self._lock:
            self.copies_running += 1
        try:
            time.sleep(self.delay)
            done: list[BlockKey] = []
            for i, (key, slot) in enumerate(zip(job.keys, job.slot_ids, strict=True)):
                if load:
                    if self.lose_keys and i == len(job.keys) - 1:
                        with self._lock:  # the backend found the block gone: a later lookup misses
                            if self.blocks.pop(key, None) is not None:
                                self.removals.note((key,))
                        continue
                    with self._lock:
                        data = self.blocks.get(key)
                    if data is None:
                        continue
                    self.slot_array(int(slot))[:] = memoryview(data)
                elif not self.fail_stores:
                    with self._lock:
                        self.blocks[key] = self.slot_array(int(slot)).tobytes()
                else:
                    continue
                done.append(key)
            if not load and self.drop_first_stored and done:
                with self._lock:  # evicted again by the next store, before this job is reported
                    if self.blocks.pop(done[0], None) is not None:
                        self.removals.note(done[:1])
            ok = len(done) == len(job.keys)
            result = JobResult(
                job.job_id,
                ok,
                None if ok else frozenset(done),
                nbytes=len(done) * self.block_bytes,
                seconds=self.delay,
            )
        finally:
            with self._lock:
                self.copies_running -= 1
        with self._lock:
            self._results.append(result)
            if self.duplicate_reports:
                self._results.append(result)

    def _submit(self, job: TransferJob, load: bool) -> None:
        if self.raise_on_submit:
            raise RuntimeError("probe tier: backend refused the job")
        self._futures.append(self._pool.submit(self._run, job, load))

    def submit_store(self, job: TransferJob) -> None:
        self.store_calls += 1
        self._submit(job, load=False)

    def submit_load(self, job: TransferJob) -> None:
        self._submit(job, load=True)

    def get_finished_jobs(self) -> list[JobResult]:
        with self._lock:
            out, self._results = self._results, []
        return out

    def has_pending_work(self) -> bool:
        return any(not f.done() for f in self._futures)

    def drain(self) -> None:
        for f in list(self._futures):
            f.result()
        self._futures.clear()
        with self._lock:
            self.max_copies_seen_by_drain = max(self.max_copies_seen_by_drain, self.copies_running)

    def touch(self, keys: Iterable[BlockKey]) -> None:
        return None

    def shutdown(self) -> None:
        self.drain()
        self._pool.shutdown(wait=True)
