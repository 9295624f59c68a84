"""Back-pressure for tier stores: the :class:`StoreGate` an :class:`~kvtier.tiers.async_tier.AsyncTier`
consults before it queues a store job.

A store is never urgent (the block is still in the primary tier), so a tier that cannot keep up or
whose medium is full should *drop* stores early rather than queue bytes it cannot take: a dropped
store is a failed job, counted in ``stats.dropped_stores``, and the engine simply keeps the block in
RAM (or evicts it). Two signals feed the gate:

* **Pauses** -- a tier that learns its medium is full (``ENOSPC``, a server's out-of-memory reply, a
  throttling response) calls :meth:`StoreGate.pause`; every store is dropped until it expires.
* **Latency** -- the base reports each finished store job's bytes and seconds to
  :meth:`StoreGate.observe`. The default gate only keeps the last figure (``seconds_per_mib``);
  a throttling gate (an EMA of the latency per MiB against a budget) overrides :meth:`observe` and
  :meth:`admit` and is passed to the tier's constructor -- nothing else changes.

Thread model: :meth:`admit` runs on the engine thread inside ``submit_store`` and must not block;
:meth:`pause` and :meth:`observe` run on worker threads. The default gate needs no lock (each
method writes one float, which the interpreter does atomically); a gate with more state locks it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["StoreGate"]

_MIB = float(1 << 20)


class StoreGate:
    """Accept or drop store jobs; pausable; fed with store latency (see the module doc).

    Args:
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._paused_until = 0.0
        self._pause_reason = ""
        #: Seconds per MiB of the last store job that moved bytes (``None`` before the first).
        self.seconds_per_mib: float | None = None

    def admit(self, nbytes: int) -> str | None:
        """``None`` to queue a store job of ``nbytes`` payload bytes, else the reason it is dropped
        (becomes the failed job's ``error``). Engine thread; non-blocking."""
        if self._clock() < self._paused_until:
            return self._pause_reason
        return None

    def pause(self, seconds: float, reason: str) -> None:
        """Drop every store for the next ``seconds`` (extends, never shortens, a running pause)."""
        until = self._clock() + seconds
        if until > self._paused_until:
            self._pause_reason = reason
            self._paused_until = until

    @property
    def paused(self) -> bool:
        return self._clock() < self._paused_until

    def observe(self, nbytes: int, seconds: float) -> None:
        """A store job finished after ``seconds`` having written ``nbytes`` (worker thread)."""
        if nbytes > 0:
            self.seconds_per_mib = seconds * _MIB / nbytes
