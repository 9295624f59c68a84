"""A circuit breaker driven by job outcomes, for network tiers.

Why outcomes and not a health call: some backends answer their health check while the thing holding
the data is gone (a store's master is up, its segment holder is dead), so only real reads and writes
tell the truth. The tier reports every operation: :meth:`CircuitBreaker.success` when the server
answered (a miss is an answer), :meth:`CircuitBreaker.failure` when it could not be reached or ran
past its deadline.

States::

    closed --(failures in a row >= threshold)--> open --(reset_after s)--> half-open
    half-open --(the one trial succeeds)--> closed      half-open --(it fails)--> open

While open, :meth:`allow` is ``False``: the tier answers lookups MISS, drops stores and fails loads
at once, without touching the network. The first :meth:`allow` after ``reset_after`` seconds turns
the breaker half-open and returns ``True`` once: that caller's operation (a real job, or the tier's
probe) is the trial; everyone else keeps getting ``False`` until its outcome is reported. A trial
whose outcome never comes (a bug) is given up after ``reset_after`` seconds, so the breaker cannot
stick half-open.

Thread-safe: :meth:`allow` runs on the engine thread, outcomes on worker threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["CircuitBreaker"]

CLOSED, OPEN, HALF_OPEN = 0, 1, 2
_NAMES = ("closed", "open", "half-open")


class CircuitBreaker:
    """Failure counter with open/half-open states (see the module doc).

    Args:
        threshold: consecutive failures that open the breaker (>= 1).
        reset_after: seconds open before a trial is allowed.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(
        self, threshold: int = 3, reset_after: float = 1.0, clock: Callable[[], float] = time.monotonic
    ):
        self.threshold = threshold
        self.reset_after = reset_after
        self._clock = clock
        self._lock = threading.Lock()
        self._state = CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial_at = 0.0
        self.opens = 0
        self.rejected = 0

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` or ``"half-open"``."""
        return _NAMES[self._state]

    @property
    def code(self) -> int:
        """0 closed, 1 open, 2 half-open (for integer stats)."""
        return self._state

    def allow(self) -> bool:
        """Whether an operation may go to the server now (may make this caller the trial)."""
        now = self._clock()
        with self._lock:
            if self._state == CLOSED:
                return True
            if self._state == OPEN and now - self._opened_at >= self.reset_after:
                self._state = HALF_OPEN
                self._trial_at = now
                return True
            if self._state == HALF_OPEN and now - self._trial_at >= self.reset_after:
                self._trial_at = now  # the last trial never reported: try again
                return True
            self.rejected += 1
            return False

    def peek(self) -> bool:
        """Whether the breaker is closed (no state change, nothing counted): for lookups."""
        return self._state == CLOSED

    def due(self) -> bool:
        """Whether an open breaker has waited long enough for a trial (no state change)."""
        with self._lock:
            return self._state == OPEN and self._clock() - self._opened_at >= self.reset_after

    def success(self) -> None:
        """The server answered."""
        with self._lock:
            self._failures = 0
            self._state = CLOSED

    def failure(self) -> None:
        """The server could not be reached, or an operation ran past its deadline."""
        with self._lock:
            self._failures += 1
            if self._state == HALF_OPEN or (self._state == CLOSED and self._failures >= self.threshold):
                self._state = OPEN
                self._opened_at = self._clock()
                self.opens += 1
            elif self._state == OPEN:
                self._opened_at = self._clock()  # still down: wait a full period again
