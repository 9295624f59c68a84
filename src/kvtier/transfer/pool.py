"""Job ids and the engine's transfer pool for slow copies.

:class:`TransferPool` runs job callables on a :class:`~kvtier.transfer.workers.WorkerPool` (loads
before stores, FIFO within each). Submission never blocks: when ``max_inflight`` jobs are queued or
running it returns ``None`` and the caller retries later (back-pressure instead of an unbounded
queue). Results are collected with :meth:`TransferPool.poll`; every submitted job is reported exactly
once, as a :class:`~kvtier.jobs.JobResult`, including jobs whose callable raised.

A job callable returns ``None`` (every key transferred) or the collection of keys it did transfer
(partial success).
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable, Collection, Sequence

from kvtier.errors import MisuseError
from kvtier.jobs import JobResult
from kvtier.keys import BlockKey
from kvtier.transfer.workers import Priority, WorkerPool

__all__ = ["LOAD", "STORE", "JobIds", "TransferPool"]

#: Job kinds of :meth:`TransferPool.submit` (the worker pool's priorities).
LOAD = Priority.LOAD
STORE = Priority.STORE

JobFn = Callable[[], Collection[BlockKey] | None]


class JobIds:
    """Thread-safe increasing job ids, unique per allocator (one per engine)."""

    def __init__(self, start: int = 1) -> None:
        self._next = itertools.count(start)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return next(self._next)


class TransferPool:
    """A bounded pool of ``workers`` threads; loads (``LOAD``) before stores (``STORE``).

    Args:
        workers: threads (2 uses both cores of a small host; copies release the GIL).
        max_inflight: jobs queued or running at most; :meth:`submit` returns ``None`` beyond that.
        ids: job id allocator (shared with the engine so ids are unique across its jobs).
    """

    def __init__(
        self,
        workers: int = 2,
        max_inflight: int = 64,
        *,
        ids: JobIds | None = None,
        name: str = "kvtier-transfer",
    ) -> None:
        if workers < 1 or max_inflight < 1:
            raise ValueError("workers and max_inflight must be >= 1")
        self.max_inflight = max_inflight
        self._ids = ids or JobIds()
        self._lock = threading.Lock()
        self._done: list[JobResult] = []
        self._closed = False
        self._workers = WorkerPool(workers, name=name, max_inflight=max_inflight)

    @property
    def inflight(self) -> int:
        """Jobs queued or running (not yet finished)."""
        return self._workers.outstanding

    def submit(
        self, fn: JobFn, *, kind: int = STORE, keys: Sequence[BlockKey] = (), nbytes: int = 0
    ) -> int | None:
        """Queue ``fn``; returns its job id, or ``None`` when ``max_inflight`` jobs are pending."""
        if self._closed:
            raise MisuseError("TransferPool.submit after shutdown")
        if self._workers.outstanding >= self.max_inflight:
            return None  # checked first so a refused job does not use up an id
        job_id = self._ids()
        task = functools.partial(self._run, job_id, fn, keys, nbytes)
        return job_id if self._workers.submit(kind, task) else None

    def poll(self) -> list[JobResult]:
        """Results finished since the last call (each job exactly once)."""
        with self._lock:
            done, self._done = self._done, []
            return done

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no job is queued or running; ``False`` on timeout. Results stay for :meth:`poll`."""
        return self._workers.wait_idle(timeout)

    def shutdown(self) -> None:
        """Finish queued jobs, stop the threads. Idempotent."""
        self._closed = True
        self._workers.stop()

    def _run(self, job_id: int, fn: JobFn, keys: Sequence[BlockKey], nbytes: int) -> None:
        t0 = time.perf_counter()
        result = _result(job_id, fn, keys, nbytes, t0)
        with self._lock:
            self._done.append(result)


def _result(job_id: int, fn: JobFn, keys: Sequence[BlockKey], nbytes: int, t0: float) -> JobResult:
    try:
        moved = fn()
    except Exception as exc:  # a failed copy is a failed job, never a crashed worker
        return JobResult(job_id, False, None, 0, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - t0
    if moved is None:
        return JobResult(job_id, True, None, nbytes, seconds)
    ok = frozenset(moved)
    total = len(set(keys))
    per_key = nbytes // total if total else 0
    return JobResult(job_id, len(ok) >= total, ok, per_key * len(ok), seconds)
