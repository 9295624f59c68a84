"""The fs tier's I/O pool: loads overtake queued stores; a failing task never kills a worker."""

from __future__ import annotations

import logging
import threading

import pytest

from kvtier.tiers.fs_pool import PRIO_LOAD, PRIO_STORE, IoPool, RateLimitedLog

log = logging.getLogger("kvtier.tiers.fs.test")


def test_loads_run_before_queued_stores() -> None:
    pool = IoPool(1, "prio", log)
    gate = threading.Event()
    order: list[str] = []
    try:
        pool.submit(PRIO_STORE, gate.wait)  # occupies the only worker
        for i in range(5):
            pool.submit(PRIO_STORE, lambda i=i: order.append(f"store{i}"))
        pool.submit(PRIO_LOAD, lambda: order.append("load"))
        gate.set()
        assert pool.wait_idle(10)
        assert order == ["load", "store0", "store1", "store2", "store3", "store4"]
    finally:
        pool.stop()


def test_a_raising_task_is_logged_and_the_worker_survives(caplog: pytest.LogCaptureFixture) -> None:
    pool = IoPool(1, "err", log)
    done = threading.Event()
    try:

        def boom() -> None:
            raise RuntimeError("boom")

        pool.submit(PRIO_STORE, boom)
        pool.submit(PRIO_STORE, done.set)
        assert pool.wait_idle(10)
        assert done.is_set()
        assert any("unexpected error" in r.getMessage() for r in caplog.records)
    finally:
        pool.stop()


def test_rate_limited_log_suppresses_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    rl = RateLimitedLog(log, interval=3600)
    for _ in range(50):
        rl.warning("enospc", "disk full")
    rl.warning("other", "something else")
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["disk full", "something else"]
