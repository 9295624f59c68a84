"""Group commits of the fs tier's store path: many small store jobs share critical sections, and
the outcome (what is stored, evicted, dropped, counted) is that of one section per job."""

from __future__ import annotations

import threading
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import numpy as np

from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey
from kvtier.testing.primary import wait_for_jobs
from kvtier.transfer.workers import Priority

BLOCK = 4096
JOBS = 24


def _queue_single_block_jobs(tier, primary, keys: list[BlockKey]) -> list[int]:  # type: ignore[no-untyped-def]
    """Submit one store job per key while the only worker is held, so they all queue up."""
    gate = threading.Event()
    tier.run_on_worker(Priority.STORE, gate.wait)  # occupies the single worker
    ids = []
    for slot, k in enumerate(keys):
        primary.block(slot)[:] = h.payload_of(k, BLOCK)
        ids.append(10_000 + slot)
        tier.submit_store(TransferJob(ids[-1], [k], np.array([slot], dtype=np.int32)))
    gate.set()
    return ids


def test_queued_small_jobs_reserve_together_and_stay_exact(tmp_path: Path) -> None:
    primary = h.aligned_primary(JOBS, BLOCK)
    tier = h.make_tier(primary, tmp_path, threads=1)
    try:
        assert tier.wait_scan(10)
        keys = [h.key_of(f"b{i}") for i in range(JOBS)]
        before = tier.get_stats()["acct_sections"]
        ids = _queue_single_block_jobs(tier, primary, keys)
        results = wait_for_jobs(tier, ids, timeout=60)
        assert all(r.success for r in results.values())
        sections = tier.get_stats()["acct_sections"] - before
        # One shared reservation + one publication per job (with one thread nothing else can
        # overlap); one section per job each way would be 2 * JOBS.
        assert sections <= JOBS + 2, sections
        st = tier.usage()
        assert st.reserved == 0
        assert (
            st.published
            == sum(h.block_files(tier.layout.ns_dir).values())
            == JOBS * tier.layout.file_size(16)
        )
        res = h.load(tier, primary, keys)
        assert res.success
        for slot, k in enumerate(keys):
            assert primary.block(slot).tobytes() == h.payload_of(k, BLOCK).tobytes()
    finally:
        tier.shutdown()


def test_queued_jobs_needing_room_evict_as_one_job_at_a_time(tmp_path: Path) -> None:
    """A full tier: every queued job must evict. Jobs that would need victims are not reserved
    ahead, so LRU evicts exactly what one section per job would: the oldest blocks, in order."""
    primary = h.aligned_primary(JOBS, BLOCK)
    cap = 8
    size = h.make_tier(primary, tmp_path / "probe").layout.file_size(16)
    tier = h.make_tier(primary, tmp_path / "root", threads=1, max_bytes=cap * size)
    try:
        assert tier.wait_scan(10)
        old = [h.key_of(f"old{i}") for i in range(cap)]
        for k in old:  # one job each: LRU order old0 (oldest) .. old7
            assert h.store(tier, primary, [k]).success
        new = [h.key_of(f"new{i}") for i in range(JOBS)]
        ids = _queue_single_block_jobs(tier, primary, new)
        results = wait_for_jobs(tier, ids, timeout=60)
        assert all(r.success for r in results.values())
        assert tier.indexed_keys() == set(new[-cap:])  # what sequential LRU keeps
        assert tier.stats.evictions == JOBS and tier.stats.dropped_stores == 0
        st = tier.usage()
        assert st.reserved == 0
        on_disk = h.block_files(tier.layout.ns_dir)
        assert st.published == sum(on_disk.values()) == cap * size
    finally:
        tier.shutdown()


def test_lingering_publications_strand_no_job_with_many_threads_and_split_jobs(tmp_path: Path) -> None:
    """Four workers, jobs of one block and jobs split into one-block chunks, all queued at once:
    finished jobs wait for a running chunk's publication (and publications reserve for queued
    jobs), yet every job is reported, every block is published and loads back, and nothing
    stays reserved. A job left unpublished would time the wait out."""
    threads, n = 4, 60
    primary = h.aligned_primary(n, BLOCK)
    tier = h.make_tier(primary, tmp_path, threads=threads)
    tier.batch_blocks = 1
    try:
        assert tier.wait_scan(10)
        keys = [h.key_of(f"s{i}") for i in range(n)]
        gates = [threading.Event() for _ in range(threads)]
        for g in gates:
            tier.run_on_worker(Priority.STORE, g.wait)  # every worker held: the jobs queue up
        ids, slot = [], 0
        for j, size in enumerate([1, 3, 1, 1, 5, 1, 2] * 10):
            if slot + size > n:
                break
            for s in range(slot, slot + size):
                primary.block(s)[:] = h.payload_of(keys[s], BLOCK)
            ids.append(20_000 + j)
            tier.submit_store(
                TransferJob(ids[-1], keys[slot : slot + size], np.arange(slot, slot + size, dtype=np.int32))
            )
            slot += size
        for g in gates:
            g.set()
        results = wait_for_jobs(tier, ids, timeout=60)
        assert len(results) == len(ids) and all(r.success for r in results.values())
        stored = keys[:slot]
        assert tier.indexed_keys() == set(stored)
        st = tier.usage()
        assert st.reserved == 0
        files = h.block_files(tier.layout.ns_dir)
        assert st.published == sum(files.values()) == slot * tier.layout.file_size(16)
        primary.view.cast("B")[:] = b"\0" * len(primary.view.cast("B"))
        res = h.load(tier, primary, stored)
        assert res.success
        for s, k in enumerate(stored):
            assert primary.block(s).tobytes() == h.payload_of(k, BLOCK).tobytes()
    finally:
        tier.shutdown()
