"""One snapshot of the engine's counters: what :meth:`kvtier.Engine.stats` returns.

Built from the components the facade composes (never the facade itself), under the engine's lock:
the engine counters, ``primary`` (slot counts, timed pins, timed copies, ``backing``), ``tiers``
(each tier's ``get_stats()`` plus the engine's totals of it, :class:`~kvtier.engine.jobs.TierIo`,
and ``promotions_skipped_cost``: keys found there that the cost gate did not load), the job book's
counters and ``latency`` (:meth:`~kvtier.engine.latency.Latency.snapshot`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtier.engine.admission import Admission
from kvtier.engine.jobs import JobBook
from kvtier.engine.latency import Latency
from kvtier.engine.movers import KVMover
from kvtier.engine.timedpins import TimedPins
from kvtier.primary import PrimaryTier
from kvtier.tiers.base import SecondaryTier

__all__ = ["engine_stats"]


def engine_stats(
    counters: dict[str, int],
    primary: PrimaryTier,
    timed_pins: TimedPins,
    mover: KVMover,
    admission: Admission,
    jobs: JobBook,
    tiers: Sequence[SecondaryTier],
    latency: Latency,
) -> dict[str, Any]:
    """The engine's stats (see the module docstring); call it with the engine's lock held."""
    out: dict[str, Any] = dict(counters)
    # Timed pins first: the ones that have run out are released before the slots are counted.
    out["primary"] = timed_pins.stats() | primary.counts() | mover.primary_io()
    out["primary"]["backing"] = primary.backing
    skipped = admission.skipped_cost
    out["tiers"] = {
        tier.name: jobs.tier_stats(t) | {"promotions_skipped_cost": skipped[t]}
        for t, tier in enumerate(tiers)
    }
    out.update(jobs.counters())
    out["latency"] = latency.snapshot()
    return out
