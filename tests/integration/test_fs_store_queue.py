"""Store jobs on the batched writer are written in shares (job_queue.py): a burst of one-block
store jobs is written in a few batched calls, each job reported exactly once after its blocks are
published, a second tier over the same root finds every block, and the queue's early stop (a job
that must evict waits for the ones before it) puts the rest back in order, settling each entry once
and calling ``after`` outside the lock with exactly the entries that asked for it (Hypothesis)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.jobs import TransferJob
from kvtier.testing.primary import wait_for_jobs
from kvtier.tiers.async_tier import ChunkOutcome
from kvtier.tiers.fs.job_queue import JobQueue
from kvtier.transfer.workers import Priority

BLOCK = 64 << 10  # one file per block (above the small-block path)
JOBS = 40
THREADS = 4


def test_a_burst_of_one_block_stores_is_written_in_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary = h.aligned_primary(JOBS, BLOCK)
    keys = [h.key_of(f"w{i}") for i in range(JOBS)]
    for slot, k in enumerate(keys):
        primary.block(slot)[:] = h.payload_of(k, BLOCK)
    tier = h.make_tier(primary, tmp_path, threads=THREADS)
    try:
        if not tier._store.batched:
            pytest.skip("no batched writer here (no C compiler): stores run one task per chunk")
        assert tier.wait_scan(10)
        calls: list[int] = []
        real = tier._store.write_chunks

        def counted(chunks):  # type: ignore[no-untyped-def]
            calls.append(sum(len(items) for _, items in chunks))
            return real(chunks)

        monkeypatch.setattr(tier._store, "write_chunks", counted)
        gate = threading.Event()
        for _ in range(THREADS):
            tier.run_on_worker(Priority.LOAD, gate.wait)  # every worker held: the jobs queue
        ids = list(range(80_000, 80_000 + JOBS))
        for slot, (job_id, k) in enumerate(zip(ids, keys, strict=True)):
            tier.submit_store(TransferJob(job_id, [k], np.array([slot], dtype=np.int32)))
        gate.set()
        results = wait_for_jobs(tier, ids, timeout=60)
        assert sorted(results) == ids and all(r.success for r in results.values())
        assert all(r.nbytes == BLOCK for r in results.values())
        assert sum(calls) == JOBS and max(calls) <= -(-JOBS // THREADS), calls
        assert len(calls) < JOBS // 2, calls
        stats = tier.get_stats()
        assert stats["store_batches"] == len(calls) and stats["stores"] == JOBS
        assert not tier.index.storing and not h.temp_files(tier.layout.ns_dir)
        assert tier.usage().usage == JOBS * tier.layout.file_size(len(keys[0]))  # nothing reserved left
    finally:
        tier.shutdown()
    primary.rows[:] = 0
    again = h.make_tier(primary, tmp_path, threads=THREADS)
    try:
        assert again.wait_scan(10)
        assert h.load(again, primary, keys).success
        for slot, k in enumerate(keys):
            assert primary.block(slot).tobytes() == h.payload_of(k, BLOCK).tobytes()
    finally:
        again.shutdown()


def test_a_store_burst_steps_aside_for_a_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker, a burst of 100 one-block stores (two batches of at most 64); a load arrives
    while the first batch is being written: it is served between the batches, not after the
    whole burst."""
    n = 100
    primary = h.aligned_primary(n + 2, BLOCK)
    wanted = h.key_of("wanted")
    primary.block(n)[:] = h.payload_of(wanted, BLOCK)
    tier = h.make_tier(primary, tmp_path, threads=1)
    try:
        if not tier._store.batched:
            pytest.skip("no batched writer here (no C compiler): stores run one task per chunk")
        assert tier.wait_scan(10)
        tier.submit_store(TransferJob(1, [wanted], np.array([n], dtype=np.int32)))
        assert wait_for_jobs(tier, [1], timeout=60)[1].success
        keys = [h.key_of(f"b{i}") for i in range(n)]
        gate = threading.Event()
        tier.run_on_worker(Priority.LOAD, gate.wait)
        for slot, k in enumerate(keys):
            tier.submit_store(TransferJob(100 + slot, [k], np.array([slot], dtype=np.int32)))
        real = tier._store.write_chunks

        def load_arrives(chunks):  # type: ignore[no-untyped-def]
            if not order_of_calls:  # the engine asks for a load while the burst is written
                tier.submit_load(TransferJob(99, [wanted], np.array([n + 1], dtype=np.int32), True))
            order_of_calls.append(len(chunks))
            return real(chunks)

        order_of_calls: list[int] = []
        monkeypatch.setattr(tier._store, "write_chunks", load_arrives)
        gate.set()
        order: list[int] = []
        deadline = time.monotonic() + 60
        while len(order) < n + 1 and time.monotonic() < deadline:
            order.extend(r.job_id for r in tier.get_finished_jobs() if r.success)
            time.sleep(0.001)
        assert sorted(order) == [99, *range(100, 100 + n)]
        assert order_of_calls == [64, 36]
        assert order.index(99) < n, order  # some stores were reported after the load
        assert primary.block(n + 1).tobytes() == h.payload_of(wanted, BLOCK).tobytes()
    finally:
        tier.shutdown()


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=40),
    flushers=st.integers(1, 4),
    max_blocks=st.integers(1, 16),
    stops=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    wants_after=st.sets(st.integers(0, 39)),
)
def test_an_early_stop_puts_the_rest_back_in_order(
    sizes: list[int], flushers: int, max_blocks: int, stops: list[int], wants_after: set[int]
) -> None:
    """``run`` answers only a prefix of some batches (as the store path does before a job that
    must evict): every entry is still settled exactly once and in queue order, and ``after`` gets,
    without the lock, exactly the settled entries whose ``settle`` returned ``True``."""
    lock = threading.Lock()
    settled: list[int] = []
    aftered: list[int] = []
    calls = [0]

    def run(entries: list[tuple[int, int]]) -> list[ChunkOutcome]:
        keep = min(len(entries), stops[calls[0] % len(stops)])
        calls[0] += 1
        return [ChunkOutcome() for _ in entries[:keep]]

    def settle(entry: tuple[int, int], outcome: ChunkOutcome) -> bool:
        assert lock.locked()
        settled.append(entry[0])
        return entry[0] in wants_after

    def after(entries: list[tuple[int, int]]) -> None:
        assert not lock.locked()
        assert entries and all(e[0] in wants_after for e in entries)
        aftered.extend(e[0] for e in entries)

    queue: JobQueue[tuple[int, int]] = JobQueue(
        run, settle, blocks=lambda e: e[1], lock=lock, flushers=flushers, max_blocks=max_blocks,
        share=True, after=after,
    )  # fmt: skip
    for i, n in enumerate(sizes):
        queue.put((i, n))
    queue.flush()
    assert settled == list(range(len(sizes)))
    assert aftered == [i for i in range(len(sizes)) if i in wants_after]


def test_a_run_that_answers_nothing_fails_its_batch_and_the_queue_goes_on() -> None:
    """A ``run`` with no outcome at all would loop for ever on the same batch: it is a bug, and
    the batch fails like a raising one; the next entries still run."""
    lock = threading.Lock()
    seen: list[tuple[int, str | None]] = []
    calls = [0]

    def run(entries: list[int]) -> list[ChunkOutcome]:
        calls[0] += 1
        return [] if calls[0] == 1 else [ChunkOutcome() for _ in entries]

    def settle(entry: int, outcome: ChunkOutcome) -> bool:
        seen.append((entry, outcome.error))
        return False

    queue: JobQueue[int] = JobQueue(
        run, settle, blocks=lambda e: 1, lock=lock, flushers=2, max_blocks=2, share=True
    )
    for i in range(4):
        queue.put(i)
    queue.flush()
    assert [e for e, _ in seen] == [0, 1, 2, 3]
    assert seen[0][1] and "0 outcomes" in seen[0][1] and seen[1][1] == seen[0][1]
    assert seen[2][1] is None and seen[3][1] is None


def test_a_raising_settle_or_after_still_accounts_for_every_entry() -> None:
    """A ``settle`` that raises on one entry (a bug) does not skip the entries after it, and an
    ``after`` that raises does not lose its entries: both go to ``fail``, so the owner can report
    their jobs; every other entry is settled once."""
    lock = threading.Lock()
    settled: list[int] = []
    aftered: list[int] = []
    failed: list[int] = []

    def run(entries: list[int]) -> list[ChunkOutcome]:
        return [ChunkOutcome() for _ in entries]

    def settle(entry: int, outcome: ChunkOutcome) -> bool:
        if entry == 1:
            raise RuntimeError("injected bug in settle")
        settled.append(entry)
        return entry >= 4

    def after(entries: list[int]) -> None:
        aftered.extend(entries)
        if 5 in entries:
            raise RuntimeError("injected bug in after")

    queue: JobQueue[int] = JobQueue(
        run, settle, blocks=lambda e: 1, lock=lock, flushers=1, max_blocks=3, after=after,
        fail=lambda entries: failed.extend(entries),
    )  # fmt: skip
    for i in range(8):
        queue.put(i)
    queue.flush()
    assert settled == [0, 2, 3, 4, 5, 6, 7]
    assert aftered == [4, 5, 6, 7]  # batches [0 1 2] [3 4 5] [6 7]
    assert failed == [1, 4, 5]
    assert queue.batches == 3
