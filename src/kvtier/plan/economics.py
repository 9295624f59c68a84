"""Money: what a stack costs per month and what its hits save in GPU prefill time.

The arithmetic, for a stack replayed over a trace that spans ``T`` seconds:

* **storage cost** per month = sum over tiers of ``provisioned bytes / 2**30 * price per GiB-month``
  (provisioned bytes: :func:`kvtier.plan.stack.tier_bytes`; an ``fs`` tier's block files carry a
  4 KiB header each);
* **prefill seconds saved** ``S`` over the trace = the replay's ``cost.saved_seconds``: for every
  request's leading run of hits, per tier, the prefill time of those tokens minus the time to load
  the blocks (latency + bytes / bandwidth), never negative;
* **GPU seconds saved per hour of traffic** = ``S * 3600 / T``;
* **GPU value** per month = ``S / T`` GPUs kept busy less x ``price per GPU-hour`` x 730 hours;
* **net saving** per month = GPU value - storage cost.

The traffic is the trace's own rate, repeated for a month. Everything is linear, so a trace sampled
at 1/k of a fleet's rate gives 1/k of the fleet's GPU value at the same capacities (the hit ratios,
however, depend on the rate: replay a trace of the fleet's real rate for those).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvtier.plan.menu import HOURS_PER_MONTH, Menu
from kvtier.plan.stack import Stack, tier_bytes

__all__ = ["GIB", "Economics", "economics", "storage_cost"]

GIB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class Economics:
    """The money figures of one stack (dollars per month unless said otherwise)."""

    storage_cost: float
    cost_by_tier: dict[str, float]
    bytes_by_tier: dict[str, int]
    saved_seconds: float
    trace_seconds: float
    saved_gpu_seconds_per_hour: float
    gpu_value: float
    net_saving: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def storage_cost(
    stack: Stack, menu: Menu, block_bytes: int
) -> tuple[float, dict[str, float], dict[str, int]]:
    """(total $/month, $/month per kind, provisioned bytes per kind) of ``stack``."""
    by_cost: dict[str, float] = {}
    by_bytes: dict[str, int] = {}
    for kind, blocks in stack.sizes:
        if blocks <= 0:
            continue
        nbytes = tier_bytes(kind, blocks, block_bytes)
        by_bytes[kind] = nbytes
        by_cost[kind] = nbytes / GIB * menu.kind(kind).price_per_gib_month
    return sum(by_cost.values()), by_cost, by_bytes


def economics(
    stack: Stack, menu: Menu, *, block_bytes: int, saved_seconds: float, trace_seconds: float
) -> Economics:
    """The :class:`Economics` of ``stack`` whose replay saved ``saved_seconds`` over ``trace_seconds``."""
    cost, by_cost, by_bytes = storage_cost(stack, menu, block_bytes)
    span = max(trace_seconds, 1e-9)
    per_hour = saved_seconds * 3600.0 / span
    value = saved_seconds / span * menu.gpu.price_per_hour * HOURS_PER_MONTH
    return Economics(cost, by_cost, by_bytes, saved_seconds, trace_seconds, per_hour, value, value - cost)
