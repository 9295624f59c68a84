"""The one priority worker pool of kvtier: loads before stores before maintenance.

:class:`WorkerPool` runs plain callables (``fn() -> None``) on a fixed set of daemon threads. It is
the thread pool behind the engine's :class:`~kvtier.transfer.pool.TransferPool` and behind every
I/O-doing tier (:class:`~kvtier.tiers.async_tier.AsyncTier`).

Guarantees:
    * **Priority, then FIFO.** A worker always takes the queued task with the lowest
      :class:`Priority` value, and among equal priorities the one submitted first. A load
      (a request waits on it) therefore overtakes every queued store (stores only free primary
      slots), and stores overtake background maintenance. A running task is never pre-empted.
    * **Bounded in flight.** With ``max_inflight`` set, :meth:`WorkerPool.submit` refuses (returns
      ``False``, never blocks) while that many tasks are queued or running; the caller retries
      later (back-pressure instead of an unbounded queue). ``None`` means unbounded (a tier bounds
      its queue by the engine's own in-flight limit).
    * **A task cannot kill a worker.** An exception escaping a task is logged (with its traceback)
      on the pool's logger and swallowed. Tasks that must report failures catch them themselves.
    * **Idle and stop.** :meth:`WorkerPool.wait_idle` blocks until no task is queued or running;
      :meth:`WorkerPool.stop` lets queued tasks finish, then ends the threads (idempotent).
      Submitting after :meth:`WorkerPool.stop` is a :class:`~kvtier.errors.MisuseError`: owners
      check their own "closed" state first and turn late work into failed jobs.

Waking. Submission and the queue are guarded by one lock. Each worker sleeps on a condition of its
own, and a submitted task wakes the worker that went idle *last* (a stack, not a queue): one job
at a time then keeps running on the same thread, whose caches -- and the per-thread state of the
client libraries the tiers call -- are warm. (With first-in-first-out wake-ups two workers took
turns; Mooncake's batched puts ran ~8 % slower from alternating threads than from one.)
:meth:`WorkerPool.wait_idle` callers wait on another condition, so a worker that goes idle wakes
them and never its idle siblings (each needless wake-up is a GIL hand-off in the way of the thread
that was waiting). A task runs without any pool lock held, so a task may submit further tasks (a
follow-up step at another priority).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from enum import IntEnum

from kvtier.errors import MisuseError

__all__ = ["Priority", "WorkerPool"]

log = logging.getLogger("kvtier.transfer.workers")

Task = Callable[[], None]


class Priority(IntEnum):
    """Task priorities, lowest value first."""

    #: Filling primary slots a request is waiting for.
    LOAD = 0
    #: Copying blocks out of the primary tier (frees slots; nobody waits on the bytes).
    STORE = 1
    #: Background upkeep (pre-creating directories, compaction, refreshes).
    MAINTENANCE = 2


class WorkerPool:
    """``threads`` daemon workers over one priority queue (see the module doc for the guarantees).

    Args:
        threads: worker threads (>= 1). Copies and syscalls release the GIL, so a few threads
            overlap I/O even on a small host.
        name: thread-name prefix (``<name>-<i>``), shown in stack dumps and profilers.
        max_inflight: tasks queued or running at most; ``None`` = unbounded.
        logger: where escaped task exceptions are logged (the owner's logger, so a tier's failures
            appear under the tier's name).
    """

    def __init__(
        self,
        threads: int,
        *,
        name: str = "kvtier-worker",
        max_inflight: int | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError(f"WorkerPool needs threads >= 1, got {threads}")
        if max_inflight is not None and max_inflight < 1:
            raise ValueError(f"WorkerPool needs max_inflight >= 1 or None, got {max_inflight}")
        self.name = name
        self.max_inflight = max_inflight
        self._log = logger or log
        self._lock = threading.Lock()
        self._idle_cv = threading.Condition(self._lock)  # wait_idle(): nothing queued or running
        # Idle workers' own conditions, the most recently idle last (see the module doc).
        self._sleeping: list[threading.Condition] = []
        self._queue: list[tuple[int, int, Task]] = []
        self._seq = itertools.count()
        self._running = 0
        self._stopping = False
        self._threads = [
            threading.Thread(
                target=self._work, args=(threading.Condition(self._lock),), name=f"{name}-{i}", daemon=True
            )
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    @property
    def threads(self) -> int:
        return len(self._threads)

    @property
    def outstanding(self) -> int:
        """Tasks queued or running (not finished yet)."""
        with self._lock:
            return len(self._queue) + self._running

    def submit(self, priority: int, fn: Task) -> bool:
        """Queue ``fn`` at ``priority`` (a :class:`Priority`); ``False`` when ``max_inflight`` tasks
        are pending (nothing queued). Never blocks. Raises :class:`MisuseError` after :meth:`stop`."""
        with self._lock:
            if self._stopping:
                raise MisuseError(f"WorkerPool {self.name!r}: submit after stop()")
            if self.max_inflight is not None and len(self._queue) + self._running >= self.max_inflight:
                return False
            heapq.heappush(self._queue, (int(priority), next(self._seq), fn))
            if self._sleeping:
                self._sleeping.pop().notify()  # the hottest idle worker; busy ones loop back to the queue
            return True

    def step_aside(self, priority: int, fn: Task) -> bool:
        """For a long-running task at ``priority``: when a more urgent task (a lower value) is
        queued, queue ``fn`` (the task's continuation) at ``priority`` and return ``True``: the
        caller then ends and the urgent task gets its thread. ``False`` (carry on) otherwise,
        or when the pool is stopping."""
        with self._lock:
            if self._stopping or not self._queue or self._queue[0][0] >= priority:
                return False
            heapq.heappush(self._queue, (int(priority), next(self._seq), fn))
            return True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no task is queued or running; ``False`` if ``timeout`` seconds passed first."""
        with self._idle_cv:
            return self._idle_cv.wait_for(lambda: not self._queue and not self._running, timeout)

    def stop(self, timeout: float | None = None) -> None:
        """Run what is queued, then end the threads; waits up to ``timeout`` s for each. Idempotent.

        Safe to call from a task (the calling worker is not joined).
        """
        with self._lock:
            self._stopping = True
            for wake in self._sleeping:
                wake.notify()
            self._sleeping.clear()
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(timeout)

    def _work(self, wake: threading.Condition) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._stopping:
                    # Only a notify ends this wait, and whoever notifies takes us off the stack.
                    self._sleeping.append(wake)
                    wake.wait()
                if not self._queue:
                    return  # stopping and nothing left
                _, _, fn = heapq.heappop(self._queue)
                self._running += 1
            try:
                fn()
            except Exception:  # a worker must survive anything a task does
                self._log.exception("kvtier %s: unexpected error in a worker task", self.name)
            finally:
                with self._lock:
                    self._running -= 1
                    if not self._queue and not self._running:
                        self._idle_cv.notify_all()
