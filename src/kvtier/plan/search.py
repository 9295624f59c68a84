"""The search: a grid of sizes per tier, pruned by the one-pass curve, simulated, then refined.

1. **Grid.** Per kind, sizes as shares of the trace's unique blocks (:data:`DEFAULT_GRID`); RAM never
   below the *staging minimum* (the longest request's blocks: the primary tier must hold a request
   to store it); a kind with a drive size on the menu never above what its drives hold. A stack
   is kept only if every secondary tier is larger than every faster tier in it: with write-through
   every tier holds what an LRU cache of its size would, so a tier no larger than one above it
   would hit (almost) nothing.
2. **Prune.** Every grid stack is estimated from the curve (:func:`kvtier.plan.points.estimate`);
   only the few that matter for the objective are simulated: the cheapest that (nearly) reach a
   ``target`` hit ratio, the best net savings within a ``budget``, or points spread along the
   estimated Pareto front of cost against saving (plus the best estimated net saving).
3. **Simulate** those through the engine, in parallel.
4. **Refine** around the best simulated stack: every size x0.5, x0.7, x0.85, x1.2, x1.4, x2 and
   each secondary tier removed; the estimates (corrected by the mean error the simulations showed)
   pick the best few, which are simulated. The answer is always a simulated stack.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.plan.points import PlanContext, Point, estimate, simulate_many
from kvtier.plan.stack import Stack

__all__ = ["DEFAULT_GRID", "Objective", "pareto_front", "search", "staging_blocks"]

#: Sizes tried per kind, as percentages of the trace's unique blocks (0 = kind absent).
DEFAULT_GRID: Mapping[str, tuple[float, ...]] = {
    "ram": (0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0),
    "nvme": (0.0, 2.0, 5.0, 10.0, 20.0, 35.0, 50.0, 75.0, 100.0),
    "redis": (0.0, 2.0, 5.0, 10.0, 25.0, 50.0),
    "s3": (0.0, 10.0, 25.0, 50.0, 100.0),
}
_REFINE_FACTORS = (0.5, 0.7, 0.85, 1.2, 1.4, 2.0)
#: Estimates within this many points of a target hit ratio are simulated (the curve is approximate).
_TARGET_SLACK = 0.02


@dataclass(frozen=True, slots=True)
class Objective:
    """What the answer optimises: ``target`` hit ratio (cheapest stack reaching it), ``budget``
    (largest net saving with storage cost within it), or neither (``pareto``: largest net saving,
    with the whole front reported)."""

    kind: str
    value: float = 0.0

    @classmethod
    def make(cls, target_hit: float | None, budget: float | None) -> Objective:
        if target_hit is not None and budget is not None:
            raise ConfigError("--budget", "give --target-hit or --budget, not both")
        if target_hit is not None:
            if not 0.0 < target_hit < 1.0:
                raise ConfigError(
                    "--target-hit", f"expected a hit ratio between 0% and 100%, got {target_hit!r}"
                )
            return cls("target", target_hit)
        if budget is not None:
            if budget < 0:
                raise ConfigError("--budget", f"expected dollars per month >= 0, got {budget!r}")
            return cls("budget", budget)
        return cls("pareto")

    def feasible(self, p: Point, slack: float = 0.0) -> bool:
        if self.kind == "target":
            return p.block_hit >= self.value - slack
        if self.kind == "budget":
            return p.econ.storage_cost <= self.value + 1e-9
        return True

    def key(self, p: Point, slack: float = 0.0) -> tuple[bool, float, float]:
        """Sort key, best first: feasible points, then cheapest (target) or largest net saving."""
        if self.kind == "target":
            return (not self.feasible(p, slack), p.econ.storage_cost, -p.block_hit)
        return (not self.feasible(p, slack), -p.econ.net_saving, p.econ.storage_cost)


def staging_blocks(ctx: PlanContext) -> int:
    """Smallest RAM tier: the longest request's blocks (a store needs that many primary slots)."""
    return max((len(k) for k in ctx.trace.keys), default=1) or 1


def _valid(sizes: Sequence[tuple[str, int]]) -> bool:
    largest = 0
    for kind, blocks in sizes:
        if blocks <= 0:
            continue
        if kind != "ram" and blocks <= largest:
            return False
        largest = max(largest, blocks)
    return True


def grid_stacks(ctx: PlanContext, grid: Mapping[str, Sequence[float]] = DEFAULT_GRID) -> list[Stack]:
    """Every valid stack of the grid over ``ctx.kinds``."""
    u = ctx.trace.unique_blocks
    floor = staging_blocks(ctx)
    axes: list[list[int]] = []
    for kind in ctx.kinds:
        pcts = grid.get(kind, DEFAULT_GRID.get(kind, (0.0, 10.0, 50.0)))
        cap = ctx.max_blocks(kind)
        if kind == "ram":
            sizes = sorted({max(floor, int(p * u / 100)) for p in pcts})
        else:
            # Sizes past what the kind's drives hold are tried at that bound instead.
            wanted = {int(p * u / 100) for p in pcts}
            sizes = sorted({b if cap is None else min(cap, b) for b in wanted} | {0})
        axes.append(sizes)
    out = []
    for combo in itertools.product(*axes):
        stack_sizes = tuple(zip(ctx.kinds, combo, strict=True))
        if _valid(stack_sizes):
            out.append(Stack(stack_sizes))
    return out


def pareto_front(points: Iterable[Point]) -> list[Point]:
    """Points no other point beats on both storage cost (lower) and GPU value (higher), by cost."""
    front: list[Point] = []
    for p in sorted(points, key=lambda x: (x.econ.storage_cost, -x.econ.gpu_value)):
        if not front or p.econ.gpu_value > front[-1].econ.gpu_value + 1e-12:
            front.append(p)
    return front


def _spread(front: Sequence[Point], k: int) -> list[Point]:
    """``k`` points evenly spread over ``front`` (its ends included when ``k`` >= 2)."""
    if k <= 0:
        return []
    if len(front) <= k:
        return list(front)
    if k == 1:
        return [front[len(front) // 2]]
    step = (len(front) - 1) / (k - 1)
    return [front[round(i * step)] for i in range(k)]


def _initial(estimates: Sequence[Point], objective: Objective, k: int) -> list[Point]:
    if objective.kind == "pareto":
        best = sorted(estimates, key=objective.key)[: max(1, k // 3)]
        front = pareto_front(estimates)
        # The front's expensive end costs more than it saves: spread over the part that pays.
        paying = [p for p in front if p.econ.net_saving > 0] or front
        chosen = best + _spread(paying, k - len(best))
    else:
        ranked = sorted(estimates, key=lambda p: objective.key(p, _TARGET_SLACK))
        chosen = ranked[:k]
    seen: set[Stack] = set()
    out = []
    for p in chosen:
        if p.stack not in seen:
            seen.add(p.stack)
            out.append(p)
    return out


def _neighbours(ctx: PlanContext, stack: Stack) -> list[Stack]:
    floor = staging_blocks(ctx)
    u = ctx.trace.unique_blocks
    out: set[Stack] = set()
    sizes = list(stack.sizes)
    for i, (kind, blocks) in enumerate(sizes):
        options = [int(blocks * f) for f in _REFINE_FACTORS] if blocks else [max(1, u // 50)]
        if kind != "ram" and blocks:
            options.append(0)
        for b in options:
            cap = ctx.max_blocks(kind)
            b = max(floor, b) if kind == "ram" else min(b, u, u if cap is None else cap)
            trial = tuple([*sizes[:i], (kind, b), *sizes[i + 1 :]])
            if trial != stack.sizes and _valid(trial):
                out.add(Stack(trial))
    return sorted(out, key=lambda s: s.sizes)


def _corrected(ctx: PlanContext, stack: Stack, bias: float, gain: float) -> Point:
    p = estimate(ctx, stack)
    p.hit_ratio = {"block": p.block_hit + bias}
    value = p.econ.gpu_value * gain
    p.econ = dataclasses.replace(p.econ, gpu_value=value, net_saving=value - p.econ.storage_cost)
    return p


def search(
    ctx: PlanContext,
    objective: Objective,
    *,
    simulations: int = 6,
    refine: int = 3,
    jobs: int | None = None,
    grid: Mapping[str, Sequence[float]] = DEFAULT_GRID,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[list[Point], list[Point]]:
    """(grid estimates, simulated points) for ``objective``; the best simulated point is the answer."""
    estimates = [estimate(ctx, s) for s in grid_stacks(ctx, grid)]
    if not estimates:
        raise ConfigError("--tiers", "the grid holds no valid stack; give --tiers with ram first")
    first = _initial(estimates, objective, max(1, simulations))

    def tick(label: str) -> Callable[[int, int], None]:
        return lambda done, total: progress(label, done, total) if progress is not None else None

    tick("simulating grid")(0, len(first))  # before the first simulation's silence, not after
    simulated = simulate_many(ctx, [p.stack for p in first], jobs=jobs, progress=tick("simulating grid"))
    if refine > 0:
        est_of = {p.stack: p for p in estimates}
        pairs = [(s, est_of.get(s.stack) or estimate(ctx, s.stack)) for s in simulated]
        bias = sum(s.block_hit - e.block_hit for s, e in pairs) / len(pairs)
        values = [(s.econ.gpu_value, e.econ.gpu_value) for s, e in pairs if e.econ.gpu_value > 0]
        gain = sum(a for a, _ in values) / sum(b for _, b in values) if values else 1.0
        best = sorted(simulated, key=objective.key)[0]
        done = {p.stack for p in simulated}
        cands = [_corrected(ctx, s, bias, gain) for s in _neighbours(ctx, best.stack) if s not in done]
        cands.sort(key=objective.key)
        more = simulate_many(ctx, [p.stack for p in cands[:refine]], jobs=jobs, progress=tick("refining"))
        simulated.extend(more)
    return estimates, simulated
