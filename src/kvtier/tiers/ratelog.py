"""A rate-limited warning logger for tiers: a failing medium must not flood the log.

A dead disk or an unreachable server fails every block of every job; one line per block would bury
everything else. :class:`RateLimitedLog` prints at most one line per *reason* every ``interval``
seconds and says, on the next line it prints, how many it held back.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """At most one line per ``reason`` every ``interval`` seconds; the next line says how many were
    suppressed. Thread-safe (workers of one tier share it)."""

    def __init__(self, log: logging.Logger, interval: float) -> None:
        self.log = log
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, reason: str, msg: str, *, exc_info: bool = False) -> None:
        """Log ``msg`` unless a line of the same ``reason`` was logged less than ``interval`` s ago;
        ``exc_info`` adds the traceback of the exception being handled (unexpected errors)."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(reason)
            if last is not None and now - last < self._interval:
                self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
                return
            self._last[reason] = now
            n = self._suppressed.pop(reason, 0)
        suffix = f" ({n} similar suppressed)" if n else ""
        self.log.warning("%s%s", msg, suffix, exc_info=exc_info)
