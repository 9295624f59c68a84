"""The engine's event log: what happened to blocks, for ``poll``/``events`` readers and subscribers.

Owns the bounded event queue (newest 65,536 kept), the running count of events emitted (so ``poll``
can return "what is new since I started"), the subscriber list and the outbox of events waiting to
be delivered to subscribers. Components record events through :meth:`EventLog.emit` (passed to
them as a plain callback); the facade delivers the outbox with :meth:`EventLog.dispatch` *after*
releasing its lock, because a subscriber may call back into the engine.

:meth:`emit` runs under the engine's lock; :meth:`dispatch`, :meth:`take_all` and
:meth:`subscribe` take it themselves.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence

from kvtier.engine.types import EngineEvent
from kvtier.keys import BlockKey

__all__ = ["EVENT_QUEUE", "EventLog"]

log = logging.getLogger("kvtier.engine")

#: Events kept for ``poll``/``events`` readers; older ones are dropped first.
EVENT_QUEUE = 65536


class EventLog:
    """Bounded queue of :class:`EngineEvent` plus delivery to subscribers.

    Args:
        clock: stamps each event (the engine's clock; virtual in simulation).
        lock: the engine's lock (taken by :meth:`dispatch`, :meth:`take_all`, :meth:`subscribe`).

    Attributes:
        outbox: events not yet delivered to subscribers; non-empty only when someone subscribed.
            The facade checks it (one attribute test per call) before calling :meth:`dispatch`.
        emitted: events emitted since construction (never decreases).
    """

    __slots__ = ("_clock", "_lock", "_queue", "_subscribers", "emitted", "outbox")

    def __init__(self, clock: Callable[[], float], lock: threading.Lock) -> None:
        self._clock = clock
        self._lock = lock
        self._queue: deque[EngineEvent] = deque(maxlen=EVENT_QUEUE)
        self._subscribers: list[Callable[[EngineEvent], None]] = []
        self.outbox: list[EngineEvent] = []
        self.emitted = 0

    def emit(self, kind: str, keys: Sequence[BlockKey], tier: str | None = None) -> None:
        """Record one event (lock held)."""
        ev = EngineEvent(kind, tuple(keys), tier, self._clock())
        self._queue.append(ev)
        self.emitted += 1
        if self._subscribers:
            self.outbox.append(ev)

    def since(self, mark: int) -> list[EngineEvent]:
        """Events emitted after ``emitted`` was ``mark``, oldest first, as far as the queue still holds
        them (lock held). Reads from the right end: O(new events), not O(queue)."""
        k = min(self.emitted - mark, len(self._queue))
        q = self._queue
        return [q[-i] for i in range(k, 0, -1)]

    def take_all(self) -> list[EngineEvent]:
        """Every queued event, emptying the queue (takes the lock)."""
        with self._lock:
            out = list(self._queue)
            self._queue.clear()
        return out

    def subscribe(self, callback: Callable[[EngineEvent], None]) -> None:
        """Deliver every future event to ``callback`` (takes the lock)."""
        with self._lock:
            self._subscribers.append(callback)

    def dispatch(self) -> None:
        """Deliver the outbox to subscribers, outside the lock (callbacks may call the engine).

        A failing subscriber is logged and skipped: a broken metrics hook must not break inference.
        """
        with self._lock:
            out, self.outbox = self.outbox, []
        for ev in out:
            for cb in list(self._subscribers):  # a callback may subscribe another
                try:
                    cb(ev)
                except Exception:
                    log.exception("kvtier: event subscriber failed")
