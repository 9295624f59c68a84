"""Job ids and a small worker pool for slow copies.

:class:`TransferPool` runs callables on a few threads. Submission never blocks: when ``max_inflight``
jobs are queued or running it returns ``None`` and the caller retries later (back-pressure instead of
an unbounded queue). Loads run before stores because a load is on a request's critical path and a
store is not. Results are collected with :meth:`TransferPool.poll`; every submitted job is reported
exactly once, as a :class:`~kvtier.jobs.JobResult`, including jobs whose callable raised.

A job callable returns ``None`` (every key transferred) or the collection of keys it did transfer
(partial success).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from kvtier.errors import MisuseError
from kvtier.jobs import JobResult
from kvtier.keys import BlockKey

__all__ = ["LOAD", "STORE", "JobIds", "TransferPool"]

LOAD = 0
STORE = 1

JobFn = Callable[[], Collection[BlockKey] | None]


class JobIds:
    """Thread-safe increasing job ids, unique per allocator (one per engine)."""

    def __init__(self, start: int = 1) -> None:
        self._next = itertools.count(start)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return next(self._next)


@dataclass(order=True)
class _Queued:
    priority: int
    seq: int
    job_id: int = field(compare=False)
    fn: JobFn = field(compare=False)
    keys: Sequence[BlockKey] = field(compare=False)
    nbytes: int = field(compare=False)


class TransferPool:
    """A bounded pool of ``workers`` threads; loads (priority 0) before stores (priority 1).

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
        self._cv = threading.Condition()
        self._queue: list[_Queued] = []
        self._seq = itertools.count()
        self._running = 0
        self._done: list[JobResult] = []
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    @property
    def inflight(self) -> int:
        """Jobs queued or running (not yet finished)."""
        with self._cv:
            return len(self._queue) + self._running

    def submit(
        self, fn: JobFn, *, kind: int = STORE, keys: Sequence[BlockKey] = (), nbytes: int = 0
    ) -> int | None:
        """Queue ``fn``; returns its job id, or ``None`` when ``max_inflight`` jobs are pending."""
        with self._cv:
            if self._closed:
                raise MisuseError("TransferPool.submit after shutdown")
            if len(self._queue) + self._running >= self.max_inflight:
                return None
            job_id = self._ids()
            heapq.heappush(self._queue, _Queued(kind, next(self._seq), job_id, fn, keys, nbytes))
            self._cv.notify()
            return job_id

    def poll(self) -> list[JobResult]:
        """Results finished since the last call (each job exactly once)."""
        with self._cv:
            done, self._done = self._done, []
            return done

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no job is queued or running; ``False`` on timeout. Results stay for :meth:`poll`."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and not self._running, timeout)

    def shutdown(self) -> None:
        """Finish queued jobs, stop the threads. Idempotent."""
        self.drain()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for t in self._threads:
            t.join()

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                item = heapq.heappop(self._queue)
                self._running += 1
            t0 = time.perf_counter()
            result = self._run(item, t0)
            with self._cv:
                self._running -= 1
                self._done.append(result)
                self._cv.notify_all()

    @staticmethod
    def _run(item: _Queued, t0: float) -> JobResult:
        try:
            moved = item.fn()
        except Exception as exc:  # a failed copy is a failed job, never a crashed worker
            return JobResult(
                item.job_id, False, None, 0, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"
            )
        seconds = time.perf_counter() - t0
        if moved is None:
            return JobResult(item.job_id, True, None, item.nbytes, seconds)
        ok = frozenset(moved)
        total = len(set(item.keys))
        per_key = item.nbytes // total if total else 0
        return JobResult(item.job_id, len(ok) >= total, ok, per_key * len(ok), seconds)
