"""TransferPool: ids, loads before stores, bounded in-flight work, polling, partial success."""

from __future__ import annotations

import threading

import pytest

from kvtier.errors import MisuseError
from kvtier.keys import BlockKey
from kvtier.transfer.pool import LOAD, STORE, JobIds, TransferPool


def test_job_ids_are_unique_and_increasing_across_threads() -> None:
    ids = JobIds()
    out: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        got = [ids() for _ in range(1000)]
        with lock:
            out.extend(got)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 4000 and min(out) == 1


def test_loads_run_before_queued_stores_and_every_job_is_reported_once() -> None:
    gate = threading.Event()
    order: list[str] = []
    pool = TransferPool(workers=1, max_inflight=10)
    try:
        first = pool.submit(lambda: gate.wait(10) and None, kind=STORE)  # occupies the only worker
        ids = {}
        for name, kind in (("s1", STORE), ("s2", STORE), ("l1", LOAD), ("l2", LOAD)):
            ids[name] = pool.submit(lambda name=name: order.append(name), kind=kind)  # type: ignore[misc]
        gate.set()
        assert pool.drain(timeout=10)
        assert order == ["l1", "l2", "s1", "s2"]
        results = pool.poll()
        assert sorted(r.job_id for r in results) == sorted([first, *ids.values()])  # type: ignore[type-var]
        assert all(r.success for r in results)
        assert pool.poll() == []
    finally:
        pool.shutdown()


def test_bounded_in_flight_submission_never_blocks() -> None:
    gate = threading.Event()
    pool = TransferPool(workers=1, max_inflight=2)
    try:
        assert pool.submit(lambda: gate.wait(10) and None) is not None
        assert pool.submit(lambda: None) is not None
        assert pool.submit(lambda: None) is None  # full: back-pressure, no blocking
        assert pool.inflight == 2
        gate.set()
        pool.drain(timeout=10)
        assert pool.submit(lambda: None) is not None
    finally:
        pool.shutdown()


def test_partial_success_and_failures_are_results_not_exceptions() -> None:
    keys = [BlockKey(b"a"), BlockKey(b"b"), BlockKey(b"c")]
    pool = TransferPool(workers=2)
    try:
        j1 = pool.submit(lambda: keys[:2], keys=keys, nbytes=300)
        j2 = pool.submit(lambda: 1 / 0, keys=keys)  # type: ignore[return-value,arg-type]
        j3 = pool.submit(lambda: keys, keys=keys, nbytes=300)
        pool.drain(timeout=10)
        by_id = {r.job_id: r for r in pool.poll()}
        assert not by_id[j1].success and by_id[j1].successful_keys == frozenset(keys[:2])  # type: ignore[index]
        assert by_id[j1].nbytes == 200  # type: ignore[index]
        assert not by_id[j2].success and "ZeroDivisionError" in (by_id[j2].error or "")  # type: ignore[index]
        assert by_id[j3].success  # type: ignore[index]
    finally:
        pool.shutdown()
    pool.shutdown()  # idempotent
    with pytest.raises(MisuseError):
        pool.submit(lambda: None)
