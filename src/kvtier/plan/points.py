"""Evaluating one candidate stack: estimated from the one-pass curve, or simulated through the engine.

:class:`PlanContext` holds what every evaluation needs (the prepared trace, its LRU curve, the menu,
the block geometry). :func:`simulate` is exactly ``kvtier replay --simulate --config C`` on the
config :func:`kvtier.plan.stack.stack_config` writes for the stack: the same
:func:`kvtier.sim.replay.replay` call, so its hit ratios are the ones that command prints.
:func:`simulate_many` runs several in parallel, one process per core
(:func:`kvtier.sim.parallel.fork_map`: the children share the prepared trace copy-on-write).

:func:`estimate` is the cheap stand-in used to prune the grid: with write-through every tier of a
stack holds (about) the blocks an LRU cache of its size would, so a tier's hits are those of an LRU
cache of its size minus those of the largest faster tier, read off the curve; each hit saves one
block's prefill time minus one block's load time from that tier.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtier.plan.curve import LruCurve
from kvtier.plan.economics import GIB, Economics, economics
from kvtier.plan.menu import Menu
from kvtier.plan.stack import TIER_TYPES, Stack, max_blocks, stack_config
from kvtier.sim.parallel import fork_map
from kvtier.sim.prepared import PreparedTrace

__all__ = ["PlanContext", "Point", "estimate", "simulate", "simulate_many"]


@dataclass(frozen=True)
class PlanContext:
    """Everything an evaluation needs; built once per plan."""

    trace: PreparedTrace
    curve: LruCurve
    menu: Menu
    kinds: tuple[str, ...]
    kv_bytes_per_token: int
    tokens_per_block: int
    trace_seconds: float
    policy: str = "lru"
    write_policy: str = "write_through"

    @property
    def block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.tokens_per_block

    def config(self, stack: Stack, fenced: str | None = None) -> dict[str, Any]:
        """The kvtier config mapping of ``stack`` (what ``--write-config`` writes); ``fenced``: the
        striped kind whose first drive is modelled as failed."""
        return stack_config(
            stack,
            self.menu,
            block_bytes=self.block_bytes,
            tokens_per_block=self.tokens_per_block,
            kv_bytes_per_token=self.kv_bytes_per_token,
            policy=self.policy,
            write_policy=self.write_policy,
            fenced=fenced,
        )

    def max_blocks(self, kind: str) -> int | None:
        """Most blocks of ``kind`` its drives hold (``None``: no drive size on the menu)."""
        return max_blocks(kind, self.menu, self.block_bytes)

    def block_saving(self, kind: str) -> float:
        """Prefill seconds one hit from ``kind`` saves when loaded alone (>= 0)."""
        k = self.menu.kind(kind)
        recompute = self.tokens_per_block * self.menu.gpu.prefill_seconds_per_token
        return max(0.0, recompute - k.load_seconds(self.block_bytes))


@dataclass
class Point:
    """One evaluated stack.

    Attributes:
        stack: sizes per kind.
        source: ``"simulated"`` (through the engine) or ``"estimated"`` (one-pass curve).
        hit_ratio: ``block``, ``prefix``, ``token``, ``prefix_token`` (estimates give ``block`` only).
        tier_hits: hits per kind (``ram`` = the primary tier).
        econ: the money figures.
        refs: block references of the trace (hit ratios' denominator).
    """

    stack: Stack
    source: str
    hit_ratio: dict[str, float]
    tier_hits: dict[str, int]
    econ: Economics
    refs: int
    saved_by_tier: dict[str, float] = field(default_factory=dict)

    @property
    def block_hit(self) -> float:
        return self.hit_ratio["block"]

    def to_json(self, block_bytes: int) -> dict[str, Any]:
        tiers = []
        for kind, blocks in self.stack.sizes:
            if blocks <= 0:
                continue
            nbytes = self.econ.bytes_by_tier.get(kind, 0)
            tiers.append(
                {
                    "kind": kind,
                    "type": "primary" if kind == "ram" else str(TIER_TYPES[kind]["type"]),
                    "blocks": blocks,
                    "bytes": nbytes,
                    "gib": nbytes / GIB,
                    "kv_bytes": blocks * block_bytes,
                    "hits": self.tier_hits.get(kind, 0),
                    "hit_ratio": self.tier_hits.get(kind, 0) / max(self.refs, 1),
                    "cost_per_month": self.econ.cost_by_tier.get(kind, 0.0),
                    "saved_seconds": self.saved_by_tier.get(kind),
                }
            )
        return {
            "source": self.source,
            "label": self.stack.label(),
            "hit_ratio": dict(self.hit_ratio),
            "tiers": tiers,
            "storage_cost_per_month": self.econ.storage_cost,
            "prefill_seconds_saved": self.econ.saved_seconds,
            "gpu_seconds_saved_per_hour": self.econ.saved_gpu_seconds_per_hour,
            "gpu_value_per_month": self.econ.gpu_value,
            "net_saving_per_month": self.econ.net_saving,
        }


def estimate(ctx: PlanContext, stack: Stack) -> Point:
    """The curve's estimate of ``stack`` (see the module docstring)."""
    hits: dict[str, int] = {}
    saved = 0.0
    above = 0
    for kind, blocks in stack.sizes:
        if blocks <= 0:
            continue
        h = max(0, ctx.curve.hits(blocks) - ctx.curve.hits(above))
        hits[kind] = h
        saved += h * ctx.block_saving(kind)
        above = max(above, blocks)
    refs = ctx.curve.refs
    econ = economics(
        stack, ctx.menu, block_bytes=ctx.block_bytes, saved_seconds=saved, trace_seconds=ctx.trace_seconds
    )
    return Point(stack, "estimated", {"block": sum(hits.values()) / max(refs, 1)}, hits, econ, refs)


def simulate(ctx: PlanContext, stack: Stack, fenced: str | None = None) -> Point:
    """``stack`` replayed through the engine in simulate mode (``kvtier replay --simulate``);
    ``fenced``: the striped kind whose first drive is modelled as failed."""
    from kvtier.config import load_config
    from kvtier.sim.replay import replay

    report = replay(ctx.trace, load_config(ctx.config(stack, fenced)), simulate=True)
    hits = {("ram" if t.name == "primary" else t.name): t.hits for t in report.tiers}
    by_tier = {
        ("ram" if k == "primary" else k): float(v) for k, v in report.cost["saved_seconds_by_tier"].items()
    }
    econ = economics(
        stack,
        ctx.menu,
        block_bytes=ctx.block_bytes,
        saved_seconds=float(report.cost["saved_seconds"]),
        trace_seconds=ctx.trace_seconds,
    )
    return Point(stack, "simulated", dict(report.hit_ratio), hits, econ, report.block_refs, by_tier)


def _simulate_sizes(ctx: PlanContext, sizes: tuple[tuple[str, int], ...]) -> Point:
    return simulate(ctx, Stack(sizes))


def simulate_many(
    ctx: PlanContext,
    stacks: Sequence[Stack],
    *,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Point]:
    """:func:`simulate` every stack, ``jobs`` at a time (default: one per core); results in order."""
    return fork_map(_simulate_sizes, ctx, [s.sizes for s in stacks], jobs=jobs, progress=progress)
