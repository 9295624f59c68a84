"""The one worker pool: priority then FIFO, bounded in flight, tasks never kill a worker, idle/stop;
and the rate-limited tier log."""

from __future__ import annotations

import logging
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.errors import MisuseError
from kvtier.tiers.ratelog import RateLimitedLog
from kvtier.transfer.workers import Priority, WorkerPool

log = logging.getLogger("kvtier.test.workers")


def test_loads_run_before_queued_stores_before_maintenance() -> None:
    pool = WorkerPool(1, name="prio", logger=log)
    gate = threading.Event()
    order: list[str] = []
    try:
        pool.submit(Priority.STORE, gate.wait)  # occupies the only worker
        pool.submit(Priority.MAINTENANCE, lambda: order.append("maint"))
        for i in range(3):
            pool.submit(Priority.STORE, lambda i=i: order.append(f"store{i}"))
        pool.submit(Priority.LOAD, lambda: order.append("load"))
        gate.set()
        assert pool.wait_idle(10)
        assert order == ["load", "store0", "store1", "store2", "maint"]
    finally:
        pool.stop()


def test_a_long_task_steps_aside_only_for_more_urgent_work() -> None:
    """``step_aside`` requeues the continuation behind a waiting load (it then runs after every
    task queued before it at its priority), and refuses when nothing more urgent waits, when
    only equal or less urgent work waits, and once the pool is stopping."""
    pool = WorkerPool(1, name="aside", logger=log)
    gate, running = threading.Event(), threading.Event()
    order: list[str] = []
    answers: list[bool] = []

    def long_store() -> None:
        running.set()
        gate.wait()
        answers.append(pool.step_aside(Priority.STORE, lambda: order.append("store-rest")))

    try:
        pool.submit(Priority.STORE, long_store)
        assert running.wait(10)  # on the worker before anything else is queued
        pool.submit(Priority.STORE, lambda: order.append("store-next"))
        pool.submit(Priority.MAINTENANCE, lambda: order.append("maint"))
        pool.submit(Priority.LOAD, lambda: order.append("load"))
        gate.set()
        assert pool.wait_idle(10)
        assert answers == [True]
        assert order == ["load", "store-next", "store-rest", "maint"]
        # Nothing more urgent waits (a store and a maintenance task are not): carry on.
        hold, held = threading.Event(), threading.Event()
        pool.submit(Priority.STORE, lambda: (held.set(), hold.wait()))
        assert held.wait(10)
        pool.submit(Priority.STORE, lambda: None)
        pool.submit(Priority.MAINTENANCE, lambda: None)
        assert pool.step_aside(Priority.STORE, lambda: order.append("never")) is False
        hold.set()
        assert pool.wait_idle(10)
    finally:
        pool.stop()
    assert "never" not in order


def test_a_task_does_not_step_aside_once_the_pool_is_stopping() -> None:
    """While the pool stops, queued tasks still run but a running one keeps its thread: a
    continuation queued then might never run."""
    pool = WorkerPool(1, name="aside-stop", logger=log)
    gate, running = threading.Event(), threading.Event()
    answers: list[bool] = []
    ran: list[str] = []

    def long_store() -> None:
        running.set()
        gate.wait()
        pool.stop(timeout=0)  # a task may stop its own pool; the load below is still queued
        answers.append(pool.step_aside(Priority.STORE, lambda: ran.append("continuation")))

    pool.submit(Priority.STORE, long_store)
    assert running.wait(10)
    pool.submit(Priority.LOAD, lambda: ran.append("load"))
    gate.set()
    pool.stop(timeout=10)
    assert answers == [False]
    assert ran == ["load"]  # the queued load ran before the pool ended; no continuation


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(list(Priority)), min_size=1, max_size=30))
def test_one_worker_runs_any_queue_in_priority_then_fifo_order(prios: list[Priority]) -> None:
    pool = WorkerPool(1, name="order", logger=log)
    gate = threading.Event()
    ran: list[int] = []
    try:
        pool.submit(Priority.LOAD, gate.wait)
        for i, p in enumerate(prios):
            pool.submit(p, lambda i=i: ran.append(i))
        gate.set()
        assert pool.wait_idle(10)
        assert ran == sorted(range(len(prios)), key=lambda i: (prios[i], i))
    finally:
        pool.stop()


def test_one_job_at_a_time_stays_on_the_worker_that_went_idle_last() -> None:
    """A stack of idle workers, not a queue: sequential tasks keep running on one (warm) thread,
    while tasks that overlap still spread over the workers."""
    pool = WorkerPool(3, name="lifo", logger=log)
    ran: list[str] = []
    try:
        for _ in range(12):
            pool.submit(Priority.STORE, lambda: ran.append(threading.current_thread().name))
            assert pool.wait_idle(10)
        assert len(set(ran)) == 1, ran
        gate, started = threading.Event(), threading.Semaphore(0)

        def hold() -> None:
            ran.append(threading.current_thread().name)
            started.release()
            gate.wait()

        ran.clear()
        for _ in range(3):
            pool.submit(Priority.STORE, hold)
        for _ in range(3):
            assert started.acquire(timeout=10)  # all three run at once: one per worker
        gate.set()
        assert pool.wait_idle(10)
        assert len(set(ran)) == 3
    finally:
        pool.stop()


def test_a_raising_task_is_logged_and_the_worker_survives(caplog: pytest.LogCaptureFixture) -> None:
    pool = WorkerPool(1, name="err", logger=log)
    done = threading.Event()
    try:

        def boom() -> None:
            raise RuntimeError("boom")

        pool.submit(Priority.STORE, boom)
        pool.submit(Priority.STORE, done.set)
        assert pool.wait_idle(10)
        assert done.is_set()
        assert any("unexpected error" in r.getMessage() and r.exc_info for r in caplog.records)
    finally:
        pool.stop()


def test_bounded_in_flight_refuses_without_blocking() -> None:
    gate = threading.Event()
    pool = WorkerPool(1, name="bound", max_inflight=2, logger=log)
    try:
        assert pool.submit(Priority.STORE, gate.wait)
        assert pool.submit(Priority.STORE, lambda: None)
        assert not pool.submit(Priority.LOAD, lambda: None)  # full: refused, even a load
        assert pool.outstanding == 2
        gate.set()
        assert pool.wait_idle(10)
        assert pool.outstanding == 0 and pool.submit(Priority.LOAD, lambda: None)
    finally:
        pool.stop()


def test_wait_idle_times_out_and_stop_runs_what_is_queued() -> None:
    gate = threading.Event()
    ran: list[int] = []
    pool = WorkerPool(2, name="stop", logger=log)
    pool.submit(Priority.STORE, gate.wait)
    pool.submit(Priority.STORE, gate.wait)
    pool.submit(Priority.STORE, lambda: ran.append(1))
    assert not pool.wait_idle(0.05)
    gate.set()
    pool.stop(timeout=10)
    assert ran == [1] and pool.outstanding == 0
    pool.stop()  # idempotent
    with pytest.raises(MisuseError, match="after stop"):
        pool.submit(Priority.LOAD, lambda: None)


def test_a_task_may_stop_its_own_pool() -> None:
    pool = WorkerPool(1, name="self-stop", logger=log)
    done = threading.Event()

    def stop_from_inside() -> None:
        pool.stop(timeout=1)
        done.set()

    pool.submit(Priority.MAINTENANCE, stop_from_inside)
    assert done.wait(10)


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="threads"):
        WorkerPool(0)
    with pytest.raises(ValueError, match="max_inflight"):
        WorkerPool(1, max_inflight=0)


def test_rate_limited_log_suppresses_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    rl = RateLimitedLog(log, interval=3600)
    for _ in range(50):
        rl.warning("enospc", "disk full")
    rl.warning("other", "something else")
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["disk full", "something else"]


def test_rate_limited_log_says_how_many_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    rl = RateLimitedLog(log, interval=0.0)  # every line passes; the counter only appears after drops
    rl.warning("r", "first")
    rl._interval = 3600
    rl.warning("r", "dropped")
    rl._interval = 0.0
    rl.warning("r", "again")
    assert [r.getMessage() for r in caplog.records] == ["first", "again (1 similar suppressed)"]
