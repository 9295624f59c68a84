"""Worker threads for the fs tier: a priority queue (loads before stores) and a rate-limited logger."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

__all__ = ["PRIO_LOAD", "PRIO_MAINT", "PRIO_STORE", "IoPool", "RateLimitedLog"]

PRIO_LOAD = 0
PRIO_STORE = 1
PRIO_MAINT = 2
_STOP = 99


class IoPool:
    """``threads`` workers taking tasks lowest priority number first, FIFO within a priority.

    A load submitted while stores are queued runs before them (the engine is waiting on promotions;
    stores only free primary slots). Tasks must not raise; any exception is logged and swallowed so
    a worker never dies. :meth:`wait_idle` blocks until every submitted task has finished.
    """

    def __init__(self, threads: int, name: str, log: logging.Logger) -> None:
        self._q: queue.PriorityQueue[tuple[int, int, Callable[[], None] | None]] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._log = log
        self._cv = threading.Condition()
        self._outstanding = 0
        self._threads = [
            threading.Thread(target=self._run, name=f"kvtier-fs-{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def submit(self, prio: int, fn: Callable[[], None]) -> None:
        with self._cv:
            self._outstanding += 1
        self._q.put((prio, next(self._seq), fn))

    @property
    def outstanding(self) -> int:
        return self._outstanding

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: self._outstanding == 0, timeout)

    def _run(self) -> None:
        while True:
            _, _, fn = self._q.get()
            if fn is None:
                return
            try:
                fn()
            except Exception:  # a worker must survive anything a task does
                self._log.exception("kvtier fs: unexpected error in an I/O task")
            finally:
                with self._cv:
                    self._outstanding -= 1
                    if self._outstanding == 0:
                        self._cv.notify_all()

    def stop(self) -> None:
        for _ in self._threads:
            self._q.put((_STOP, next(self._seq), None))
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=10)


class RateLimitedLog:
    """At most one line per ``reason`` every ``interval`` seconds; the next line says how many were
    suppressed. A full or failing disk must not flood the log (one failure per block otherwise)."""

    def __init__(self, log: logging.Logger, interval: float) -> None:
        self._log = log
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, reason: str, msg: str) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(reason)
            if last is not None and now - last < self._interval:
                self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
                return
            self._last[reason] = now
            n = self._suppressed.pop(reason, 0)
        suffix = f" ({n} similar suppressed)" if n else ""
        self._log.warning("%s%s", msg, suffix)
