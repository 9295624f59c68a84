"""What the engine's components share: one :class:`Parts` the facade builds and hands to each.

The job book, the write policies, admission, the KV mover and the stats snapshot all work on the
same primary tier, secondary tiers, counters, lock, clock and event callback. The facade builds these
once and passes them as one value, so a component's constructor names only what is its own (the
mover's slot protocol, admission's cost model) and a new shared part is added in one place.
Components read the parts; none replaces one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.engine.latency import Latency
from kvtier.engine.residency import Residency
from kvtier.keys import BlockKey
from kvtier.primary import PrimaryTier
from kvtier.tiers.base import SecondaryTier
from kvtier.transfer.pool import JobIds

__all__ = ["Emit", "Parts"]

#: ``emit(kind, keys, tier)``: record an :class:`~kvtier.engine.types.EngineEvent`.
Emit = Callable[[str, Sequence[BlockKey], "str | None"], None]


@dataclass(frozen=True, slots=True, eq=False)
class Parts:
    """The shared parts of one engine (built by :class:`~kvtier.engine.facade.Engine`).

    Attributes:
        primary: the slots, states and pins.
        tiers: the secondary tiers, by index.
        counters: the engine's counters by name (components add to them).
        lock: the engine's lock (every component runs under it, or takes it when it says so).
        clock: monotonic seconds (virtual in simulation), stamped on jobs and events.
        emit: records ``stored``/``promoted``/``*_failed``/``evicted`` events.
        residency: which primary blocks the tiers hold.
        latency: the engine's histograms.
        ids: a fresh job id per call (tier jobs and transfer-pool jobs share it: ids never collide).
        max_inflight: the job budget (``max_inflight_jobs``), for tier jobs and the transfer pool.
    """

    primary: PrimaryTier
    tiers: Sequence[SecondaryTier]
    counters: dict[str, int]
    lock: threading.Lock
    clock: Callable[[], float]
    emit: Emit
    residency: Residency
    latency: Latency
    ids: JobIds
    max_inflight: int
