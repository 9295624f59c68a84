"""The tier contract's removal log: every key a tier stops holding is reported once, only when asked."""

from __future__ import annotations

import threading

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey
from kvtier.tiers.base import RemovalLog, TierContext
from kvtier.tiers.example import ExampleTier
from kvtier.tiers.remote.index import ExistenceIndex

KEYS = st.lists(st.binary(min_size=1, max_size=8).map(BlockKey), max_size=40)


@given(batches=st.lists(KEYS, max_size=6), limit=st.integers(1, 50))
def test_log_keeps_the_newest_keys_in_order_and_counts_the_rest(
    batches: list[list[BlockKey]], limit: int
) -> None:
    log = RemovalLog(limit)
    log.note(batches[0] if batches else [])
    assert log.take() == [], "disabled: nothing kept"
    log.enable()
    noted: list[BlockKey] = []
    for batch in batches:
        log.note(batch)
        noted.extend(batch)
    got = log.take()
    assert got == noted[-limit:] if noted else got == []
    assert log.lost == max(0, len(noted) - limit)
    assert log.take() == []


def test_log_is_safe_from_many_threads() -> None:
    log = RemovalLog()
    log.enable()

    def worker(i: int) -> None:
        for j in range(500):
            log.note([BlockKey(f"{i}-{j}".encode())])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    taken: list[BlockKey] = []
    while any(t.is_alive() for t in threads):
        taken += log.take()
    for t in threads:
        t.join()
    taken += log.take()
    assert sorted(taken) == sorted(BlockKey(f"{i}-{j}".encode()) for i in range(4) for j in range(500))


@given(ops=st.lists(st.tuples(st.sampled_from(["add", "forget"]), st.integers(0, 7)), max_size=60))
def test_existence_index_notes_a_known_key_that_is_forgotten(ops: list[tuple[str, int]]) -> None:
    log = RemovalLog()
    log.enable()
    idx = ExistenceIndex(capacity=100, negative_ttl=1.0, removals=log)
    known: set[BlockKey] = set()
    expect: list[BlockKey] = []
    for op, n in ops:
        key = BlockKey(bytes([n]))
        if op == "add":
            idx.add(key)
            known.add(key)
        else:
            if key in known:
                expect.append(key)
            known.discard(key)
            idx.forget(key, 0.0)
    assert log.take() == expect


def test_example_tier_notes_what_its_capacity_evicts() -> None:
    rows = np.zeros((8, 64), dtype=np.uint8)
    tier = ExampleTier(
        primary_kv_view=memoryview(rows), context=TierContext(name="ex", block_bytes=64), capacity_blocks=3
    )
    tier.removals.enable()
    keys = [BlockKey(bytes([i])) for i in range(5)]
    tier.submit_store(TransferJob(job_id=1, keys=keys, slot_ids=np.arange(5, dtype=np.int32)))
    tier.drain()
    assert [r.job_id for r in tier.get_finished_jobs()] == [1]
    assert tier.removals.take() == keys[:2]
    assert tier.stats.evictions == 2
