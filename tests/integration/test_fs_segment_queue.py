"""Small store jobs on the small-block path are written in batches (segment_queue.py): queued jobs
share a ``pwritev`` and an index append, each job is still reported exactly once with exactly its
keys, a restart finds every block, and a failing batch fails its jobs without stranding the queue.
The queue itself is checked with real threads racing puts against flushers (Hypothesis)."""

from __future__ import annotations

import threading
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey
from kvtier.testing.primary import wait_for_jobs
from kvtier.tiers.async_tier import ChunkOutcome, JobState
from kvtier.tiers.fs.job_queue import JobQueue
from kvtier.transfer.workers import Priority

BLOCK = 4096
JOBS = 40


def _queued(tier, primary, keys: list[BlockKey], first_id: int) -> list[int]:  # type: ignore[no-untyped-def]
    """One store job per key, submitted while the tier's only worker is held (they all queue)."""
    gate = threading.Event()
    tier.run_on_worker(Priority.STORE, gate.wait)
    ids = []
    for slot, k in enumerate(keys):
        primary.block(slot)[:] = h.payload_of(k, BLOCK)
        ids.append(first_id + slot)
        tier.submit_store(TransferJob(ids[-1], [k], np.array([slot], dtype=np.int32)))
    gate.set()
    return ids


def test_queued_one_block_jobs_share_batches_and_each_is_reported_once(tmp_path: Path) -> None:
    primary = h.aligned_primary(JOBS, BLOCK)
    keys = [h.key_of(f"q{i}") for i in range(JOBS)]
    tier = h.make_tier(primary, tmp_path, threads=1, small_block_bytes="64KiB")
    try:
        assert tier.segments is not None
        ids = _queued(tier, primary, keys, 50_000)
        results = wait_for_jobs(tier, ids, timeout=60)
        assert sorted(results) == ids and all(r.success for r in results.values())
        assert all(r.nbytes == BLOCK for r in results.values())
        assert tier.get_finished_jobs() == [] and not tier.has_pending_work()
        stats = tier.get_stats()
        assert stats["stores"] == JOBS and stats["failed_jobs"] == 0
        # The held worker let every job queue: one flusher wrote them in a few batches.
        assert 1 <= stats["seg_store_batches"] < JOBS // 4, stats["seg_store_batches"]
        assert not tier.index.storing
    finally:
        tier.shutdown()
    again = h.make_tier(primary, tmp_path, threads=1, small_block_bytes="64KiB")
    try:
        assert h.load(again, primary, keys).success
        for slot, k in enumerate(keys):
            assert primary.block(slot).tobytes() == h.payload_of(k, BLOCK).tobytes()
    finally:
        again.shutdown()


def test_a_failing_batch_fails_its_jobs_and_the_next_ones_are_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary = h.aligned_primary(JOBS, BLOCK)
    keys = [h.key_of(f"f{i}") for i in range(JOBS)]
    tier = h.make_tier(primary, tmp_path, threads=1, small_block_bytes="64KiB")
    try:
        assert tier.segments is not None

        def broken(states: list[JobState]) -> list[ChunkOutcome]:
            raise OSError(5, "injected EIO in a batch")

        monkeypatch.setattr(tier.segments, "write_jobs", broken)
        ids = _queued(tier, primary, keys[:10], 60_000)
        failed = wait_for_jobs(tier, ids, timeout=60)
        assert sorted(failed) == ids
        assert not any(r.success for r in failed.values())
        assert all("injected EIO" in (r.error or "") for r in failed.values())
        assert not tier.index.storing  # nothing stays "in flight" for ever
        monkeypatch.undo()
        ids = _queued(tier, primary, keys, 61_000)
        assert all(r.success for r in wait_for_jobs(tier, ids, timeout=60).values())
        assert h.load(tier, primary, keys).success
    finally:
        tier.shutdown()


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=60),
    flushers=st.integers(1, 3),
    max_blocks=st.integers(1, 16),
    fail_every=st.integers(0, 5),
)
def test_every_put_job_is_settled_once_in_bounded_batches(
    sizes: list[int], flushers: int, max_blocks: int, fail_every: int
) -> None:
    """Two producer threads put jobs while up to ``flushers`` flusher threads drain the queue; a
    write that raises (every ``fail_every``-th batch) fails only that batch's jobs."""
    lock = threading.Lock()
    settled: list[JobState] = []
    batches: list[int] = []
    running = [0, 0]  # now, most at once

    def write(states: list[JobState]) -> list[ChunkOutcome]:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
            batches.append(sum(len(s.items) for s in states))
            n = len(batches)
        try:
            if fail_every and n % fail_every == 0:
                raise RuntimeError("injected")
            return [ChunkOutcome(done=[k for k, _ in s.items]) for s in states]
        finally:
            with lock:
                running[0] -= 1

    settle_lock = threading.Lock()

    def settle(state: JobState, outcome: ChunkOutcome) -> bool:
        assert settle_lock.locked()  # the queue holds the lock it was given around every settle
        with lock:
            state.ok.update(outcome.done)
            state.error = outcome.error
            settled.append(state)
        return False

    queue: JobQueue[JobState] = JobQueue(
        write, settle, blocks=lambda s: len(s.items), lock=settle_lock, flushers=flushers,
        max_blocks=max_blocks,
    )  # fmt: skip
    states = []
    for i, n in enumerate(sizes):
        keys = [BlockKey(f"{i}/{j}".encode()) for j in range(n)]
        job = TransferJob(i, keys, np.arange(n, dtype=np.int32))
        states.append(JobState(job, False, list(zip(keys, range(n), strict=True))))
    threads: list[threading.Thread] = []

    def produce(part: list[JobState]) -> None:
        for s in part:
            if queue.put(s):
                t = threading.Thread(target=queue.flush)
                with lock:
                    threads.append(t)
                t.start()

    producers = [threading.Thread(target=produce, args=(states[i::2],)) for i in range(2)]
    for p in producers:
        p.start()
    for p in producers:
        p.join()
    while True:
        with lock:
            pending = [t for t in threads if t.is_alive()]
        if not pending:
            break
        for t in pending:
            t.join(10)
    assert sorted(s.job.job_id for s in settled) == list(range(len(sizes)))  # each exactly once
    assert running[1] <= flushers
    assert all(b <= max(max_blocks, max(sizes)) for b in batches)
    for s in settled:
        assert (s.error is None and s.ok == set(s.job.keys)) or (s.error and not s.ok)
