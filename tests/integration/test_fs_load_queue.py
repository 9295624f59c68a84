"""Load jobs on the batched reader are read in shares (job_queue.py): a burst of one-block load
jobs is read in a few batched calls, each at most its share of the queued blocks, every job is
reported exactly once with exactly its bytes, a job given up meanwhile reads nothing, and a test
seam that replaces ``_load_chunk`` still sees each chunk. The share rule itself is checked against
an independent model (Hypothesis)."""

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

BLOCK = 64 << 10  # one file per block (above the small-block path)
JOBS = 40
THREADS = 4


def _stored(tmp_path: Path, keys: list[BlockKey]):  # type: ignore[no-untyped-def]
    primary = h.aligned_primary(2 * len(keys), BLOCK)
    tier = h.make_tier(primary, tmp_path, threads=THREADS)
    if not tier._load.batched:
        tier.shutdown()
        pytest.skip("no batched reader here (no C compiler): loads run one task per chunk")
    for slot, k in enumerate(keys):
        primary.block(slot)[:] = h.payload_of(k, BLOCK)
    assert h.store(tier, primary, keys).success
    return primary, tier


def _held_loads(tier, keys: list[BlockKey], first_id: int, before_release=None) -> list[int]:  # type: ignore[no-untyped-def]
    """One load job per key into the second half of the buffer, submitted while every worker of the
    tier is held (so they all queue), then released."""
    gate = threading.Event()
    for _ in range(THREADS):
        tier.run_on_worker(Priority.LOAD, gate.wait)
    ids = []
    for i, k in enumerate(keys):
        ids.append(first_id + i)
        tier.submit_load(TransferJob(ids[-1], [k], np.array([len(keys) + i], dtype=np.int32), True))
    if before_release is not None:
        before_release(ids)
    gate.set()
    return ids


def test_a_burst_of_one_block_loads_is_read_in_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [h.key_of(f"l{i}") for i in range(JOBS)]
    primary, tier = _stored(tmp_path, keys)
    try:
        calls: list[int] = []
        real = tier._load.read_chunks

        def counted(groups, abandoned):  # type: ignore[no-untyped-def]
            calls.append(sum(len(g) for g in groups))
            return real(groups, abandoned)

        monkeypatch.setattr(tier._load, "read_chunks", counted)
        ids = _held_loads(tier, keys, 70_000)
        results = wait_for_jobs(tier, ids, timeout=60)
        assert sorted(results) == ids and all(r.success for r in results.values())
        assert all(r.nbytes == BLOCK for r in results.values())
        for i, k in enumerate(keys):
            assert primary.block(JOBS + i).tobytes() == h.payload_of(k, BLOCK).tobytes()
        assert sum(calls) == JOBS
        # Every batch is at most its share of what was queued (all 40 at the first take), and the
        # burst took far fewer hand-offs than one per job.
        assert max(calls) <= -(-JOBS // THREADS), calls
        assert len(calls) < JOBS // 2, calls
        assert tier.get_stats()["load_batches"] == len(calls)
        assert tier.get_stats()["loads"] == JOBS
        assert not tier.index.loading  # every job ended its loads (its blocks evictable again)
    finally:
        tier.shutdown()


def test_a_job_given_up_in_a_queued_batch_reads_nothing(tmp_path: Path) -> None:
    keys = [h.key_of(f"a{i}") for i in range(12)]
    primary, tier = _stored(tmp_path, keys)
    try:
        gave_up: list[int] = []

        def abandon_one(ids: list[int]) -> None:
            gave_up.append(ids[5])
            tier.abandon(ids[5])

        ids = _held_loads(tier, keys, 71_000, abandon_one)
        results = wait_for_jobs(tier, ids, timeout=60)
        assert sorted(results) == ids
        bad = results[gave_up[0]]
        assert not bad.success and "abandoned" in (bad.error or "")
        assert not primary.block(len(keys) + 5).any()  # its slot was never written
        assert all(results[j].success for j in ids if j != gave_up[0])
        # The job is forgotten once reported: the same id (a later job) loads again.
        tier.submit_load(TransferJob(gave_up[0], [keys[5]], np.array([len(keys) + 5], np.int32), True))
        assert wait_for_jobs(tier, [gave_up[0]], timeout=60)[gave_up[0]].success
        assert primary.block(len(keys) + 5).tobytes() == h.payload_of(keys[5], BLOCK).tobytes()
    finally:
        tier.shutdown()


def test_a_replaced_load_chunk_sees_each_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = [h.key_of(f"s{i}") for i in range(10)]
    _, tier = _stored(tmp_path, keys)
    try:
        seen: list[list[BlockKey]] = []
        real = tier._load_chunk

        def seam(state: JobState, items: list[tuple[BlockKey, int]]) -> ChunkOutcome:
            seen.append([k for k, _ in items])
            if items[0][0] == keys[3]:
                raise RuntimeError("injected bug in one chunk")
            return real(state, items)

        monkeypatch.setattr(tier, "_load_chunk", seam)
        ids = _held_loads(tier, keys, 72_000)
        results = wait_for_jobs(tier, ids, timeout=60)
        assert sorted(map(tuple, seen)) == sorted((k,) for k in keys)
        assert not results[ids[3]].success and "injected bug" in (results[ids[3]].error or "")
        assert all(results[j].success for j in ids if j != ids[3])
    finally:
        tier.shutdown()


def _model_batches(sizes: list[int], flushers: int, max_blocks: int) -> list[int]:
    """The blocks of each batch one flusher takes from a queue of ``sizes`` (share rule)."""
    out, left = [], list(sizes)
    while left:
        cap = max(1, min(max_blocks, -(-sum(left) // flushers)))
        n = left.pop(0)
        while left and n + left[0] <= cap:
            n += left.pop(0)
        out.append(n)
    return out


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 8), min_size=1, max_size=50),
    flushers=st.integers(1, 6),
    max_blocks=st.integers(1, 32),
)
def test_share_batches_match_the_model(sizes: list[int], flushers: int, max_blocks: int) -> None:
    """One flusher draining a queue takes, each time, whole entries up to the share of what is
    still queued (never fewer than one entry); every entry is settled once, in order."""
    lock = threading.Lock()
    batches: list[list[int]] = []
    settled: list[int] = []

    def run(entries: list[tuple[int, int]]) -> list[ChunkOutcome]:
        batches.append([n for _, n in entries])
        return [ChunkOutcome() for _ in entries]

    def settle(entry: tuple[int, int], outcome: ChunkOutcome) -> bool:
        assert lock.locked()
        settled.append(entry[0])
        return False

    queue: JobQueue[tuple[int, int]] = JobQueue(
        run, settle, blocks=lambda e: e[1], lock=lock, flushers=flushers, max_blocks=max_blocks, share=True
    )
    starts = sum(queue.put((i, n)) for i, n in enumerate(sizes))
    assert starts == min(flushers, len(sizes))
    queue.flush()
    assert settled == list(range(len(sizes)))
    assert [sum(b) for b in batches] == _model_batches(sizes, flushers, max_blocks)
