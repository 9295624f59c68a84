"""Replay a request trace through the real :class:`kvtier.engine.Engine`.

Two modes, one engine, one policy implementation:

* **real** — the configured stack (primary tier in RAM + secondary tiers) moves real bytes: each block
  gets a deterministic synthetic payload (:mod:`kvtier.sim.payload`), misses are stored, hits are
  loaded (secondary hits are promoted first) and every loaded block is verified against its payload;
* **simulate** — the same engine with ``primary_backing: "none"`` (metadata only) on a virtual
  clock driven by the trace timestamps: slots, pins, eviction, promotions and policies run exactly as
  in real mode, no byte is moved; secondary tiers are metadata-only models
  (:mod:`kvtier.sim.simtier`).

Per request the driver does what an inference engine does (the "engine" semantics, documented in
docs/replay.md): ``lookup`` every block of the request (hits touch the policy in key order), finish
the promotions and load the hits, then store the blocks that missed (in key order). On the
conversation trace with LRU at 1,827 blocks this gives 5.2458 % block hits (README reference: 5.25 %;
a flat one-block-at-a-time simulator gets 5.23 % because it can evict a request's later blocks while
storing its earlier ones).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from kvtier.config import KvtierConfig
from kvtier.costmodel import CostModel
from kvtier.metrics import tier_counters
from kvtier.sim.prepared import PreparedTrace, prepare_trace
from kvtier.sim.report import ReplayReport, TierReport

__all__ = ["PreparedTrace", "ProgressFn", "prepare_trace", "replay"]

#: ``progress(requests_done, requests_total)``; called every few hundred requests and at the end.
ProgressFn = Callable[[int, int], None]
#: ``hook(engine, requests_done, exporter)``: called at the same points with the live engine and the
#: metrics exporter (``None`` without a metrics port), for tests and live inspection.
HookFn = Callable[[Any, int, Any], None]


def _tier_types(config: KvtierConfig, engine: Any, simulate: bool) -> dict[str, str]:
    out = {"primary": f"primary/{config.primary_backing}"}
    for i, tier in enumerate(getattr(engine, "tiers", [])):
        cfg_type = config.secondary_tiers[i].type if i < len(config.secondary_tiers) else type(tier).__name__
        out[tier.name] = f"{cfg_type}/simulated" if simulate else cfg_type
    return out


def replay(
    trace: PreparedTrace,
    config: KvtierConfig,
    *,
    simulate: bool = False,
    progress: ProgressFn | None = None,
    hook: HookFn | None = None,
    cost_model: CostModel | None = None,
    metrics_port: int | None = None,
    sync: bool = False,
    on_listen: Callable[[str], None] | None = None,
    metrics_linger: float = 0.0,
    fast: bool = True,
) -> ReplayReport:
    """Replay ``trace`` through a fresh engine built from ``config`` and report what happened.

    ``simulate`` replaces ``primary_backing`` by ``"none"`` and drives the engine's clock from the trace
    timestamps. ``metrics_port`` (or ``config.metrics_port``) serves the engine's Prometheus metrics
    on 127.0.0.1 for the duration of the replay and ``metrics_linger`` seconds after it;
    ``on_listen(url)`` is called once it listens (port 0
    picks a free port: this is how a caller learns which). ``hook`` is called with the live engine at every
    progress point and once after the last request, before the engine closes.

    Real mode lets a request's write-through jobs run while the next requests are served (as a
    server would), waits for tier I/O when a request needs a promotion, and drains whenever more
    store jobs are in flight than one per 512 primary slots (at most 8; none for a primary tier under
    512 slots). A block whose store job is in flight stays pinned, and still hits, in the primary
    tier; since those are the newest blocks and few, eviction victims are the same as without
    overlap in practice. ``sync=True`` waits for each request's tier I/O before the next request.
    """
    from kvtier.engine import RequestContext
    from kvtier.metrics import start_exporter
    from kvtier.sim.replay_loops import LoopRun, run_real, run_simulate

    port = metrics_port if metrics_port is not None else config.metrics_port
    # Replay serves the metrics itself (for exactly the replay's duration): the engine must not
    # also bind config.metrics_port.
    config = dataclasses.replace(config, metrics_port=None)
    now = [0.0]
    config, engine = _build_engine(config, simulate, now)
    exporter = None
    try:
        if port is not None:
            exporter = start_exporter(engine, port)
            if on_listen is not None:
                on_listen(exporter.url)
        report = _new_report(trace, "simulate" if simulate else "real", config, int(engine.num_slots))
        cm = cost_model or CostModel.from_config(
            config, tier_media={t.name: t.medium for t in getattr(engine, "tiers", [])}
        )
        t0 = time.perf_counter()
        if simulate and fast and fast_path_refusal(config, trace, hook, port) is None:
            from kvtier.sim.replay_loops import run_fast

            run_fast(trace, report, cm, config, int(engine.num_slots))
            report.engine_seconds = report.elapsed_seconds = time.perf_counter() - t0
            return report
        run = LoopRun(engine, trace, report, cm, RequestContext, progress, _with_exporter(hook, exporter))
        if simulate:
            run_simulate(run, now)
        else:
            run_real(run, config, sync)
        report.engine_seconds = time.perf_counter() - t0
        if hook is not None:
            hook(engine, trace.requests, exporter)
        _fill_tiers(report, engine.stats(), _tier_types(config, engine, simulate))
        report.elapsed_seconds = time.perf_counter() - t0
        if exporter is not None and metrics_linger > 0:
            # Keep the final values up for one scrape interval: a replay shorter than Prometheus's
            # interval would otherwise leave nothing to scrape.
            time.sleep(metrics_linger)
        return report
    finally:
        if exporter is not None:
            exporter.close()
        engine.close()


def _with_exporter(hook: HookFn | None, exporter: Any) -> Callable[[Any, int], None] | None:
    """``hook`` as the loops call it (engine, requests done), with the exporter passed on."""
    if hook is None:
        return None
    user_hook = hook

    def inner(eng: Any, done: int) -> None:
        user_hook(eng, done, exporter)

    return inner


def _build_engine(config: KvtierConfig, simulate: bool, now: list[float]) -> tuple[KvtierConfig, Any]:
    """The replay's engine and the config it runs: ``simulate`` drops the primary backing, runs
    the clock from ``now`` and models the secondary tiers by metadata (:mod:`kvtier.sim.simtier`)."""
    from kvtier.engine import Engine

    if not simulate:
        return config, Engine(config)
    from kvtier.sim.simtier import sim_tiers

    config = dataclasses.replace(config, primary_backing="none")
    # Secondary tiers become metadata-only models (kvtier.sim.simtier): the engine is unchanged.
    return config, Engine(config, clock=lambda: now[0], tiers=sim_tiers(config))


def _new_report(trace: PreparedTrace, mode: str, config: KvtierConfig, capacity_blocks: int) -> ReplayReport:
    """The report before the first request: the trace's figures and the mode's notes."""
    report = ReplayReport(
        trace=trace.name,
        mode=mode,
        policy=config.eviction_policy,
        capacity_blocks=capacity_blocks,
        requests=trace.requests,
        block_refs=trace.block_refs,
        unique_blocks=trace.unique_blocks,
        tokens=trace.tokens,
        infinite=trace.infinite(),
    )
    if mode == "simulate" and config.secondary_tiers:
        report.notes.append(
            "simulate mode models secondary tiers by capacity and policy (kvtier.sim.simtier); "
            "their timing and I/O are not simulated"
        )
    return report


def fast_path_refusal(config: KvtierConfig, trace: PreparedTrace, hook: Any, port: int | None) -> str | None:
    """Why a simulate replay must drive the engine rather than the fast core; ``None`` if it need not."""
    import os

    from kvtier.sim.fastcore import POLICIES

    if os.environ.get("KVTIER_SIM_CORE", "").lower() == "engine":
        return "KVTIER_SIM_CORE=engine"
    if config.secondary_tiers:
        return "secondary tiers"
    if config.eviction_policy not in POLICIES or config.cache_policy_module_path is not None:
        return f"policy {config.eviction_policy!r} has no fast path"
    if config.policy_options:
        return "policy options"
    if config.spec_module_path is not None or config.spec_name != "tiering":
        return "a custom spec"
    if hook is not None or port is not None:
        return "a hook or metrics port needs the live engine"
    if any(t is not None for t in trace.tenants):
        return "tenants"
    return None


def _fill_tiers(report: ReplayReport, stats: Any, types: dict[str, str]) -> None:
    refs = max(report.block_refs, 1)
    report.tiers = []
    # TierReport's counters are the integer fields it shares with tier_counters (the metrics'
    # per-tier view), read by name.
    counted = [f.name for f in dataclasses.fields(TierReport) if f.type == "int"]
    for name, c in tier_counters(stats).items():
        hits = int(c["hits"])
        counts = {key: int(c[key]) for key in counted}
        report.tiers.append(TierReport(name, types.get(name, "?"), hit_ratio=hits / refs, **counts))
