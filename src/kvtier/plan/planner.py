"""``plan()``: a trace and a model in, the cheapest tier stack for the objective out.

The library entry point behind ``kvtier plan`` (docs/plan.md). Steps: prepare the trace once
(:func:`kvtier.sim.prepared.prepare_trace`), compute its one-pass LRU curve
(:mod:`kvtier.plan.curve`), estimate every grid stack, simulate the ones that matter through the
engine in parallel and refine (:mod:`kvtier.plan.search`), then answer: the best simulated stack for
the objective, the Pareto front of the simulated stacks, and the config of the answer (for
``kvtier replay --simulate --config``, which reproduces its hit ratios exactly).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtier.errors import ConfigError
from kvtier.plan.curve import LruCurve, lru_curve, stack_distances
from kvtier.plan.menu import Menu
from kvtier.plan.points import PlanContext, Point
from kvtier.plan.search import DEFAULT_GRID, Objective, pareto_front, search, staging_blocks
from kvtier.plan.stack import max_blocks
from kvtier.sim.prepared import PreparedTrace
from kvtier.sim.trace import TraceRequest

__all__ = ["DEFAULT_KINDS_SEARCHED", "PlanResult", "plan"]

#: Kinds searched unless ``kinds`` says otherwise (a kind whose load never beats recompute is dropped).
DEFAULT_KINDS_SEARCHED = ("ram", "nvme", "redis", "s3")


@dataclass
class PlanResult:
    """What :func:`plan` found. ``recommendation`` is a simulated point (``None``: target unreachable)."""

    trace: str
    requests: int
    block_refs: int
    unique_blocks: int
    tokens_per_block: int
    kv_bytes_per_token: int
    trace_seconds: float
    objective: Objective
    menu: Menu
    kinds: list[str]
    estimates: list[Point]
    simulated: list[Point]
    recommendation: Point | None
    config: dict[str, Any] | None
    curve: LruCurve
    infinite: dict[str, float]
    notes: list[str] = field(default_factory=list)
    per_turn: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    model: dict[str, Any] | None = None
    context: PlanContext | None = field(default=None, repr=False)
    #: Per striped kind of the recommendation: the same stack simulated with one drive fenced.
    degraded: dict[str, Point] = field(default_factory=dict)

    @property
    def block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.tokens_per_block

    @property
    def front(self) -> list[Point]:
        return pareto_front(self.simulated)

    def to_json(self) -> dict[str, Any]:
        bb = self.block_bytes
        obj: dict[str, Any] = {"kind": self.objective.kind}
        if self.objective.kind != "pareto":
            obj["value"] = self.objective.value
        return {
            "trace": self.trace,
            "requests": self.requests,
            "block_refs": self.block_refs,
            "unique_blocks": self.unique_blocks,
            "unique_bytes": self.unique_blocks * bb,
            "tokens_per_block": self.tokens_per_block,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "block_bytes": bb,
            "trace_seconds": self.trace_seconds,
            "model": self.model,
            "objective": obj,
            "kinds": list(self.kinds),
            "menu": self.menu.as_dict(),
            "recommendation": self.recommendation.to_json(bb) if self.recommendation else None,
            "config": self.config,
            "pareto_front": [p.to_json(bb) for p in self.front],
            "simulated": [p.to_json(bb) for p in self.simulated],
            "grid_points_estimated": len(self.estimates),
            "infinite": self.infinite,
            "per_turn": self.per_turn,
            "degraded": {
                kind: {"drives": self.menu.kind(kind).drives, "fenced_roots": [0], **p.to_json(bb)}
                for kind, p in self.degraded.items()
            },
            "notes": list(self.notes),
            "timings": self.timings,
        }


def _trace_seconds(requests: Sequence[TraceRequest], given: float | None) -> float:
    if given is not None:
        if not given > 0:
            raise ConfigError("--trace-seconds", f"expected seconds > 0, got {given!r}")
        return float(given)
    span = (max(r.timestamp_ms for r in requests) - min(r.timestamp_ms for r in requests)) / 1000.0
    if span <= 0:
        raise ConfigError(
            "--trace-seconds", "the trace's timestamps span no time; give the traffic's duration"
        )
    return span


def _per_turn(requests: Sequence[TraceRequest], distances: np.ndarray, capacity: int) -> list[dict[str, Any]]:
    """Flat-LRU hit ratio per conversation turn at ``capacity`` blocks (traces with ``turn``)."""
    turns = [r.turn for r in requests]
    if all(t is None for t in turns):
        return []
    per_ref = np.repeat(np.array([t if t is not None else 0 for t in turns], dtype=np.int64),
                        [len(r.blocks) for r in requests])  # fmt: skip
    hit = (distances >= 0) & (distances < capacity)
    out = []
    for t in np.unique(per_ref):
        sel = per_ref == t
        out.append(
            {
                "turn": int(t) if t else None,
                "requests": sum(1 for x in turns if (x or 0) == t),
                "block_refs": int(sel.sum()),
                "hit_ratio": float(hit[sel].mean()),
            }
        )
    return out


def plan(
    requests: Sequence[TraceRequest],
    *,
    kv_bytes_per_token: int,
    tokens_per_block: int = 512,
    menu: Menu | None = None,
    kinds: Sequence[str] = DEFAULT_KINDS_SEARCHED,
    target_hit: float | None = None,
    budget: float | None = None,
    name: str = "trace",
    policy: str = "lru",
    write_policy: str = "write_through",
    trace_seconds: float | None = None,
    simulations: int = 6,
    refine: int = 3,
    jobs: int | None = None,
    grid: Mapping[str, Sequence[float]] = DEFAULT_GRID,
    model: Mapping[str, Any] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> PlanResult:
    """Find the cheapest stack of ``kinds`` for the trace (``target_hit``, ``budget`` or neither).

    ``kv_bytes_per_token`` (from :func:`kvtier.plan.model.kv_from_config` or given) times
    ``tokens_per_block`` is the block size every tier stores. Raises :class:`ConfigError` naming the
    option on bad input.
    """
    t0 = time.perf_counter()
    objective = Objective.make(target_hit, budget)
    menu = menu or Menu()
    kinds = _checked_kinds(requests, kv_bytes_per_token, tokens_per_block, menu, kinds)
    seconds = _trace_seconds(requests, trace_seconds)
    notes: list[str] = []
    kept = _worth_loading(kinds, menu, kv_bytes_per_token * tokens_per_block, tokens_per_block, notes)
    trace = _prepare(requests, kv_bytes_per_token, tokens_per_block, name)
    t1 = time.perf_counter()
    distances = stack_distances(trace.flat)
    curve = lru_curve(trace.flat, distances)
    t2 = time.perf_counter()
    ctx = PlanContext(trace, curve, menu, tuple(kept), kv_bytes_per_token, tokens_per_block, seconds, policy,
                      write_policy)  # fmt: skip
    estimates, simulated = search(
        ctx, objective, simulations=simulations, refine=refine, jobs=jobs, grid=grid, progress=progress
    )
    t3 = time.perf_counter()
    rec = _recommend(ctx, objective, simulated, notes)
    result = PlanResult(
        trace=name,
        requests=trace.requests,
        block_refs=trace.block_refs,
        unique_blocks=trace.unique_blocks,
        tokens_per_block=tokens_per_block,
        kv_bytes_per_token=kv_bytes_per_token,
        trace_seconds=seconds,
        objective=objective,
        menu=menu,
        kinds=list(kept),
        estimates=estimates,
        simulated=simulated,
        recommendation=rec,
        config=ctx.config(rec.stack) if rec else None,
        curve=curve,
        infinite=trace.infinite(),
        notes=notes,
        model=dict(model) if model is not None else None,
        context=ctx,
    )
    if rec is not None:
        _recommendation_details(result, rec, requests, distances)
    result.timings = {
        "prepare_seconds": t1 - t0,
        "curve_seconds": t2 - t1,
        "search_seconds": t3 - t2,
        "degraded_simulations": float(len(result.degraded)),
        "simulations": float(len(simulated)),
        "total_seconds": time.perf_counter() - t0,
    }
    return result


def _prepare(
    requests: Sequence[TraceRequest], kv_bytes_per_token: int, tokens_per_block: int, name: str
) -> PreparedTrace:
    """The trace keyed once, as an engine with blocks of this size would key it."""
    from kvtier.config import load_config
    from kvtier.keys import KeyNamespace
    from kvtier.sim.prepared import prepare_trace

    config = load_config({"block_bytes": kv_bytes_per_token * tokens_per_block})
    ns = KeyNamespace.from_config(config, block_size=tokens_per_block)
    return prepare_trace(requests, ns, name=name, tokens_per_block=tokens_per_block)


def _recommendation_details(
    result: PlanResult, rec: Point, requests: Sequence[TraceRequest], distances: np.ndarray
) -> None:
    """The recommended stack's hit ratio per conversation turn (at its largest tier) and, per
    striped kind, the same stack with one drive failed."""
    assert result.context is not None
    largest = max(b for _, b in rec.stack.sizes)
    result.per_turn = _per_turn(requests, distances, largest)
    result.degraded = _degraded(result.context, rec)


def _checked_kinds(
    requests: Sequence[TraceRequest], kv_bytes_per_token: int, tokens_per_block: int, menu: Menu,
    kinds: Sequence[str],
) -> list[str]:  # fmt: skip
    """The tier kinds asked for, checked (a stack starts with ram; every kind is on the menu), after
    the trace and block-size inputs are; :class:`ConfigError` naming the option otherwise."""
    if not requests:
        raise ConfigError("trace", "no requests to plan for")
    if kv_bytes_per_token < 1:
        raise ConfigError("--kv-bytes-per-token", f"must be >= 1, got {kv_bytes_per_token}")
    if tokens_per_block < 1:
        raise ConfigError("--block-tokens", f"must be >= 1, got {tokens_per_block}")
    out = [k.strip() for k in kinds if k.strip()]
    if not out or out[0] != "ram":
        raise ConfigError("--tiers", f"the stack starts with ram (the primary tier); got {','.join(out)!r}")
    for k in out:
        kind = menu.kind(k)
        if kind.drive_bytes is not None and max_blocks(k, menu, kv_bytes_per_token * tokens_per_block) == 0:
            raise ConfigError(
                f"menu.tiers.{k}.drive_bytes",
                f"a {k} drive of {kind.drive_bytes:,} bytes holds no block of "
                f"{kv_bytes_per_token * tokens_per_block:,} bytes; give a larger drive size",
            )
    return out


def _degraded(ctx: PlanContext, rec: Point) -> dict[str, Point]:
    """``rec`` simulated once per striped kind with that kind's first drive fenced (the tier's
    ``simulate_fenced``): what the stack still hits while one disk is out."""
    from kvtier.plan.points import simulate

    return {
        kind: simulate(ctx, rec.stack, fenced=kind)
        for kind in rec.stack.kinds
        if kind != "ram" and min(ctx.menu.kind(kind).drives, rec.stack.blocks(kind)) > 1
    }


def _worth_loading(
    kinds: list[str], menu: Menu, block_bytes: int, tokens_per_block: int, notes: list[str]
) -> list[str]:
    """The kinds whose block loads beat recomputing the block on the GPU; a note for each left out."""
    recompute = tokens_per_block * menu.gpu.prefill_seconds_per_token
    kept = []
    for k in kinds:
        load = menu.kind(k).load_seconds(block_bytes)
        if k != "ram" and load >= recompute:
            notes.append(
                f"{k} left out: loading a block ({load * 1e3:.1f} ms) is not faster than recomputing it "
                f"({recompute * 1e3:.1f} ms at {menu.gpu.prefill_tokens_per_second:,.0f} tokens/s)"
            )
            continue
        kept.append(k)
    return kept


def _recommend(
    ctx: PlanContext, objective: Objective, simulated: list[Point], notes: list[str]
) -> Point | None:
    """The best simulated stack if it meets the objective (else ``None`` and a note saying how close
    it came), and the note on the RAM floor every stack has."""
    best = sorted(simulated, key=objective.key)[0]
    rec = best if objective.feasible(best) else None
    if rec is None:
        notes.append(
            f"target {100 * objective.value:.2f}% not reached: the best simulated stack hits "
            f"{100 * best.block_hit:.2f}% (infinite cache: {100 * ctx.trace.infinite()['block']:.2f}%)"
        )
    notes.append(
        f"RAM is never below {staging_blocks(ctx):,} blocks: the longest request must fit to be stored"
    )
    return rec
