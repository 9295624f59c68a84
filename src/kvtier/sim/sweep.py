"""Capacity planning: replay one trace over capacities x policies, with OPT and the infinite ceiling.

Every point is a simulate-mode :func:`kvtier.sim.replay.replay` through the real engine (metadata only),
so a sweep answers "how much primary memory, which policy" with the same code that serves requests.
Belady/OPT (:mod:`kvtier.sim.opt`) is computed once per capacity on the flat block sequence: the best
hit ratio any admit-on-miss policy could reach; the infinite-cache ceiling is the share of references
that are re-references.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from kvtier.config import KvtierConfig, parse_size
from kvtier.costmodel import CostModel
from kvtier.errors import ConfigError
from kvtier.sim.opt import opt_hit_ratio
from kvtier.sim.replay import PreparedTrace, replay
from kvtier.sim.report import ReplayReport

__all__ = ["Capacity", "SweepResult", "capacity_config", "parse_capacities", "parse_capacity", "sweep"]


@dataclass(frozen=True, slots=True)
class Capacity:
    """A primary-tier capacity: its label as the user wrote it and its size in blocks."""

    label: str
    blocks: int

    def fraction(self, unique_blocks: int) -> float:
        """Capacity as a share of the trace's unique blocks (the x axis of the plot)."""
        return self.blocks / unique_blocks if unique_blocks else 0.0


def parse_capacity(text: str, unique_blocks: int, row_stride: int, *, option: str = "--capacity") -> Capacity:
    """``"1%"`` (of unique blocks, rounded down), ``"1827"`` (blocks) or ``"64MiB"`` (bytes of slots).

    Raises :class:`ConfigError` naming ``option`` on anything else or on a capacity below one block.
    """
    s = text.strip()
    if s.endswith("%"):
        try:
            pct = Fraction(s[:-1].strip())
        except (ValueError, ZeroDivisionError):
            raise ConfigError(option, f"{text!r} is not a percentage such as 1% or 12.5%") from None
        blocks = int(pct * unique_blocks / 100)
    elif s.isdigit():
        blocks = int(s)
    else:
        try:
            blocks = parse_size(s, option) // row_stride
        except ConfigError:
            raise ConfigError(
                option, f"{text!r}: give a percentage (1%), a block count (1827) or a size (64MiB)"
            ) from None
    if blocks < 1:
        raise ConfigError(
            option, f"{text!r} is less than one block ({unique_blocks:,} unique blocks in the trace)"
        )
    return Capacity(s, blocks)


def parse_capacities(text: str, unique_blocks: int, row_stride: int) -> list[Capacity]:
    """Comma-separated :func:`parse_capacity` values, in the order given."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ConfigError("--capacity", "empty; give e.g. 1%,5%,10%,25%")
    return [parse_capacity(p, unique_blocks, row_stride) for p in parts]


def capacity_config(config: KvtierConfig, blocks: int, policy: str | None = None) -> KvtierConfig:
    """``config`` with a primary tier of exactly ``blocks`` slots (and ``policy`` when given)."""
    changes: dict[str, Any] = {"cpu_bytes_to_use": blocks * config.row_stride}
    if policy is not None:
        changes["eviction_policy"] = policy
        changes["cache_policy_module_path"] = None
    return dataclasses.replace(config, **changes)


@dataclass
class SweepResult:
    """Reports of every (capacity, policy) point plus OPT per capacity and the infinite ceiling."""

    trace: str
    capacities: list[Capacity]
    policies: list[str]
    reports: dict[tuple[str, str], ReplayReport] = field(default_factory=dict)
    opt: dict[str, float] = field(default_factory=dict)
    infinite: dict[str, float] = field(default_factory=dict)
    unique_blocks: int = 0

    def to_json(self) -> list[dict[str, Any]]:
        """A list of report objects (one per point, capacity-major), each with ``opt`` {block}."""
        out = []
        for cap in self.capacities:
            for pol in self.policies:
                rep = self.reports[(cap.label, pol)].to_json()
                rep["capacity"] = cap.label
                out.append(rep)
        return out

    def rows(self) -> list[dict[str, Any]]:
        """One row per capacity for :func:`kvtier.sim.report.sweep_tables`."""
        return [
            {
                "capacity": cap.label,
                "capacity_blocks": cap.blocks,
                "policies": {p: self.reports[(cap.label, p)].to_json() for p in self.policies},
                "opt": {"block": self.opt[cap.label]} if cap.label in self.opt else None,
                "infinite": self.infinite,
            }
            for cap in self.capacities
        ]

    def curves(self) -> tuple[dict[str, list[tuple[float, float]]], list[tuple[float, float]]]:
        """(policy -> [(capacity %, block hit ratio)], OPT [(capacity %, ratio)]) for the plot."""
        u = self.unique_blocks
        curves = {
            p: [(100 * c.fraction(u), self.reports[(c.label, p)].hit_ratio["block"]) for c in self.capacities]
            for p in self.policies
        }
        opt = [(100 * c.fraction(u), self.opt[c.label]) for c in self.capacities if c.label in self.opt]
        return curves, opt


def sweep(
    trace: PreparedTrace,
    config: KvtierConfig,
    capacities: Sequence[Capacity],
    policies: Sequence[str],
    *,
    with_opt: bool = True,
    cost_model: CostModel | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> SweepResult:
    """Simulate every (capacity, policy) pair; ``progress(label, done_points, total_points)``."""
    result = SweepResult(trace.name, list(capacities), list(policies), unique_blocks=trace.unique_blocks)
    result.infinite = trace.infinite()
    total = len(capacities) * len(policies) + (len(capacities) if with_opt else 0)
    done = 0
    for cap in capacities:
        if with_opt:
            if progress is not None:
                progress(f"OPT @ {cap.label}", done, total)
            result.opt[cap.label] = opt_hit_ratio(trace.flat, cap.blocks)
            done += 1
        for pol in policies:
            if progress is not None:
                progress(f"{pol} @ {cap.label}", done, total)
            rep = replay(
                trace, capacity_config(config, cap.blocks, pol), simulate=True, cost_model=cost_model
            )
            if with_opt:
                rep.opt = {"block": result.opt[cap.label]}
            result.reports[(cap.label, pol)] = rep
            done += 1
    if progress is not None:
        progress("done", total, total)
    return result
