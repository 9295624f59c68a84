"""Pins with a deadline: blocks an orchestrator asked to keep for a while (vLLM's ``kv_hints``).

A timed pin is one ordinary pin (:meth:`~kvtier.primary.PrimaryTier.pin`) on a READY block, held by
this component until its deadline passes. The primary tier never offers a pinned block to the
eviction policy as a victim (it is in ``protected``), so every policy -- ``prefix`` included --
keeps it without knowing why; when the deadline passes the pin goes and the policy decides again.

Bounded on purpose: a hint comes from outside (a router, a client through the serving frontend),
so timed pins hold at most ``pin_share`` of the slots (further keys are refused and counted, never
queued) and a TTL must be a finite number of seconds in ``(0, pin_max_ttl_s]``. A key pinned again
keeps the later of its two deadlines, so a pin never shortens another request's pin.

Time is the engine's clock (monotonic seconds, virtual in simulation). Expired pins are released
lazily -- before anything that may evict (:meth:`TimedPins.expire`) and in stats -- so an idle engine
costs nothing. Every method runs under the engine's lock.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from kvtier.errors import MisuseError
from kvtier.keys import BlockKey
from kvtier.primary import PrimaryTier, SlotState

__all__ = ["TimedPins"]

_READY = int(SlotState.READY)
_R = TypeVar("_R")


class TimedPins:
    """Deadline pins on the primary tier's READY blocks.

    Args:
        primary: the primary tier whose slots are pinned.
        share: at most ``floor(share * num_slots)`` blocks hold a timed pin at once (0: none).
        max_ttl_s: the longest TTL accepted, in seconds.
        clock: the engine's clock (monotonic seconds).
    """

    def __init__(
        self, primary: PrimaryTier, share: float, max_ttl_s: float, clock: Callable[[], float]
    ) -> None:
        self._primary = primary
        self._clock = clock
        self.limit = int(share * primary.num_slots)
        self.max_ttl_s = float(max_ttl_s)
        self._deadline: dict[BlockKey, float] = {}
        self._heap: list[tuple[float, BlockKey]] = []
        self.refused = 0  # keys a pin was asked for and not given (limit reached, not READY)

    def __len__(self) -> int:
        return len(self._deadline)

    def __contains__(self, key: object) -> bool:
        return key in self._deadline

    def deadline(self, key: BlockKey) -> float | None:
        """When ``key``'s timed pin ends (engine clock), ``None`` when it has none."""
        return self._deadline.get(key)

    def check_ttl(self, ttl_s: object, where: str = "ttl_s") -> float:
        """``ttl_s`` as a float if it is a finite number of seconds in ``(0, max_ttl_s]``, else a
        one-line :class:`MisuseError` naming ``where``."""
        ok = isinstance(ttl_s, int | float) and not isinstance(ttl_s, bool) and math.isfinite(ttl_s)
        if not ok or not 0.0 < float(ttl_s) <= self.max_ttl_s:  # type: ignore[arg-type]
            raise MisuseError(
                f"{where}: expected a finite number of seconds > 0 and <= {self.max_ttl_s:g} "
                f"(pin_max_ttl_s), got {ttl_s!r}"
            )
        return float(ttl_s)  # type: ignore[arg-type]

    def pin(self, keys: Sequence[BlockKey], ttl_s: float) -> int:
        """Pin each READY key of ``keys`` for ``ttl_s`` seconds; returns how many hold a timed pin now.

        Pins that have run out are released first. A key already pinned keeps the later deadline.
        Keys not READY (absent, being written, being flushed) and keys past the ``pin_share`` limit
        are refused and counted in :attr:`refused`.
        """
        ttl = self.check_ttl(ttl_s)
        now = self._clock()
        self.expire(now)
        until = now + ttl
        primary = self._primary
        deadlines = self._deadline
        held = 0
        for key in keys:
            old = deadlines.get(key)
            if old is not None:
                if until > old:
                    deadlines[key] = until
                    self._push(until, key)
                held += 1
                continue
            slot = primary.index.get(key, -1)
            if slot < 0 or primary.states[slot] != _READY or len(deadlines) >= self.limit:
                self.refused += 1
                continue
            primary.pin([slot])
            deadlines[key] = until
            self._push(until, key)
            held += 1
        return held

    def stats(self) -> dict[str, int]:
        """``timed_pins`` (held now, after releasing those that ran out) and ``timed_pins_refused``."""
        self.expire(self._clock())
        return {"timed_pins": len(self._deadline), "timed_pins_refused": self.refused}

    def expiring(self, reserve: Callable[[list[BlockKey]], _R]) -> Callable[[list[BlockKey]], _R]:
        """``reserve`` (the engine's slot reservation), releasing the pins that have run out first,
        so no reservation ever evicts around an expired pin. Costs one ``len`` while none is held."""
        deadlines, clock = self._deadline, self._clock

        def reserve_unexpired(keys: list[BlockKey]) -> _R:
            if deadlines:
                self.expire(clock())
            return reserve(keys)

        return reserve_unexpired

    def _push(self, until: float, key: BlockKey) -> None:
        heapq.heappush(self._heap, (until, key))
        if len(self._heap) > 4 * len(self._deadline) + 64:
            # Extensions leave stale entries behind; rebuild from the live deadlines.
            self._heap = [(t, k) for k, t in self._deadline.items()]
            heapq.heapify(self._heap)

    def expire(self, now: float) -> list[BlockKey]:
        """Release every timed pin whose deadline is ``<= now``; returns their keys."""
        heap = self._heap
        if not heap or heap[0][0] > now:
            return []
        deadlines = self._deadline
        released: list[BlockKey] = []
        while heap and heap[0][0] <= now:
            until, key = heapq.heappop(heap)
            if deadlines.get(key) != until:
                continue  # extended since (a later heap entry holds it) or already released
            del deadlines[key]
            released.append(key)
        self._unpin(released)
        return released

    def release_all(self) -> list[BlockKey]:
        """Release every timed pin (a reset: what they kept is stale to the caller)."""
        released = list(self._deadline)
        self._deadline.clear()
        self._heap.clear()
        self._unpin(released)
        return released

    def _unpin(self, keys: list[BlockKey]) -> None:
        if not keys:
            return
        slots = self._primary.find(keys)
        if min(slots) < 0:
            raise MisuseError("a block holding a timed pin left the primary tier (pin bookkeeping broken)")
        # A timed pin is only ever taken on a READY block and a pinned block is never a victim, so
        # releasing it never frees a FLUSHING slot.
        self._primary.unpin(slots)
