"""One snapshot of the engine's counters: what :meth:`kvtier.Engine.stats` returns.

Built from the components the facade composes (never the facade itself), under the engine's lock:
the engine counters, ``primary`` (slot counts, timed pins, timed copies, ``backing``), ``tiers``
(each tier's ``get_stats()`` plus the engine's totals of it, :class:`~kvtier.engine.jobs.TierIo`,
and ``promotions_skipped_cost``: keys found there that the cost gate did not load), the job book's
counters and ``latency`` (:meth:`~kvtier.engine.latency.Latency.snapshot`).
"""

from __future__ import annotations

from typing import Any

from kvtier.engine.admission import Admission
from kvtier.engine.jobs import JobBook
from kvtier.engine.movers import KVMover
from kvtier.engine.parts import Parts
from kvtier.engine.timedpins import TimedPins

__all__ = ["engine_stats"]


def engine_stats(
    parts: Parts, timed_pins: TimedPins, mover: KVMover, admission: Admission, jobs: JobBook
) -> dict[str, Any]:
    """The engine's stats (see the module doc; the counters, the primary tier, the tiers and the
    latency come from ``parts``); call it with the engine's lock held."""
    primary = parts.primary
    out: dict[str, Any] = dict(parts.counters)
    # Timed pins first: the ones that have run out are released before the slots are counted.
    out["primary"] = timed_pins.stats() | primary.counts() | mover.primary_io()
    out["primary"]["backing"] = primary.backing
    skipped = admission.skipped_cost
    out["tiers"] = {
        tier.name: jobs.tier_stats(t) | {"promotions_skipped_cost": skipped[t]}
        for t, tier in enumerate(parts.tiers)
    }
    out.update(jobs.counters())
    out["latency"] = parts.latency.snapshot()
    return out
