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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtier.config import KvtierConfig
from kvtier.costmodel import CostModel
from kvtier.keys import BlockInfo, BlockKey, KeyNamespace
from kvtier.metrics import tier_counters
from kvtier.sim.report import ReplayReport, TierReport
from kvtier.sim.trace import TraceRequest, flatten

__all__ = ["PreparedTrace", "ProgressFn", "prepare_trace", "replay"]

#: ``progress(requests_done, requests_total)``; called every few hundred requests and at the end.
ProgressFn = Callable[[int, int], None]
#: ``hook(engine, requests_done, exporter)``: called at the same points with the live engine and the
#: metrics exporter (``None`` without a metrics port), for tests and live inspection.
HookFn = Callable[[Any, int, Any], None]


@dataclass(frozen=True, slots=True)
class PreparedTrace:
    """A trace turned into engine keys once, so every replay of a sweep reuses the work.

    Attributes:
        name: label for reports (file name).
        keys: per request, its block keys in prefix order.
        infos: per request, a :class:`BlockInfo` per block (parent, depth, tenant) for prefix-aware and
            per-tenant policies.
        last_tokens: per request, tokens in its last block (``tokens_per_block`` when unknown).
        timestamps: per request, arrival time in seconds (the simulate clock).
        tenants: per request, its tenant or ``None``.
        flat: every block id of every request, in order (the flat sequence OPT and libCacheSim see).
        tokens_per_block: tokens per full block (512 in the Mooncake traces).
        ceiling: infinite-cache hit ratios and the unique block count, computed once by
            :func:`prepare_trace`.
    """

    name: str
    keys: list[list[BlockKey]]
    infos: list[list[BlockInfo]]
    last_tokens: list[int]
    timestamps: list[float]
    tenants: list[str | None]
    flat: np.ndarray
    tokens_per_block: int
    ceiling: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def requests(self) -> int:
        return len(self.keys)

    @property
    def block_refs(self) -> int:
        return int(self.flat.size)

    @property
    def unique_blocks(self) -> int:
        if "unique_blocks" in self.ceiling:
            return int(self.ceiling["unique_blocks"])
        return int(np.unique(self.flat).size)

    @property
    def tokens(self) -> int:
        tpb = self.tokens_per_block
        return sum(
            (len(k) - 1) * tpb + last for k, last in zip(self.keys, self.last_tokens, strict=True) if k
        )

    def infinite(self) -> dict[str, float]:
        """Hit ratios of an unbounded cache (every re-reference hits): ``block`` and ``token``."""
        if "block" in self.ceiling:
            return {"block": self.ceiling["block"], "token": self.ceiling["token"]}
        seen: set[BlockKey] = set()
        hits = tok_hits = tokens = 0
        tpb = self.tokens_per_block
        for keys, last in zip(self.keys, self.last_tokens, strict=True):
            n = len(keys)
            for j, k in enumerate(keys):
                t = last if j == n - 1 else tpb
                tokens += t
                if k in seen:
                    hits += 1
                    tok_hits += t
                else:
                    seen.add(k)
        refs = max(self.block_refs, 1)
        return {"block": hits / refs, "token": tok_hits / max(tokens, 1)}


def prepare_trace(
    requests: Sequence[TraceRequest],
    namespace: KeyNamespace,
    *,
    name: str = "trace",
    tokens_per_block: int = 512,
) -> PreparedTrace:
    """Map each request's block ids to engine keys (``namespace.trace_keys``) and prefix infos.

    Each distinct id is hashed once; a block's ``BlockInfo`` names its predecessor in the request as
    parent and its position as depth (the same for every request sharing the prefix, since ids chain).
    """
    ids = flatten(requests)
    uniq = np.unique(ids)
    key_of = dict(zip(uniq.tolist(), namespace.trace_keys(uniq.tolist()), strict=True))
    info_of: dict[tuple[int, str | None], BlockInfo] = {}
    keys: list[list[BlockKey]] = []
    infos: list[list[BlockInfo]] = []
    last_tokens: list[int] = []
    timestamps: list[float] = []
    tenants: list[str | None] = []
    for r in requests:
        rk = [key_of[b] for b in r.blocks]
        ri: list[BlockInfo] = []
        parent: BlockKey | None = None
        for depth, (b, k) in enumerate(zip(r.blocks, rk, strict=True)):
            info = info_of.get((b, r.tenant))
            if info is None:
                info = BlockInfo(parent=parent, depth=depth, tenant=r.tenant)
                info_of[(b, r.tenant)] = info
            ri.append(info)
            parent = k
        keys.append(rk)
        infos.append(ri)
        last = tokens_per_block
        if r.input_length is not None and r.blocks:
            rest = r.input_length - (len(r.blocks) - 1) * tokens_per_block
            if 0 < rest <= tokens_per_block:
                last = rest
        last_tokens.append(last)
        timestamps.append(r.timestamp_ms / 1000.0)
        tenants.append(r.tenant)
    prepared = PreparedTrace(name, keys, infos, last_tokens, timestamps, tenants, ids, tokens_per_block)
    prepared.ceiling.update(prepared.infinite())
    prepared.ceiling["unique_blocks"] = float(uniq.size)
    return prepared


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
) -> ReplayReport:
    """Replay ``trace`` through a fresh engine built from ``config`` and report what happened.

    ``simulate`` replaces ``primary_backing`` by ``"none"`` and drives the engine's clock from the trace
    timestamps. ``metrics_port`` (or ``config.metrics_port``) serves the engine's Prometheus metrics
    on 127.0.0.1 for the duration of the replay. ``hook`` is called with the live engine at every
    progress point and once after the last request, before the engine closes.

    Real mode lets a request's write-through jobs run while the next requests are served (as a
    server would), waits for tier I/O when a request needs a promotion, and drains whenever more
    store jobs are in flight than one per 512 primary slots (at most 8; none for a primary tier under
    512 slots). A block whose store job is in flight stays pinned, and still hits, in the primary
    tier; since those are the newest blocks and few, eviction victims are the same as without
    overlap in practice. ``sync=True`` waits for each request's tier I/O before the next request.
    """
    from kvtier.engine import Engine, RequestContext
    from kvtier.metrics import start_exporter
    from kvtier.sim.replay_loops import run_real, run_simulate

    mode = "simulate" if simulate else "real"
    now = [0.0]
    port = metrics_port if metrics_port is not None else config.metrics_port
    # Replay serves the metrics itself (for exactly the replay's duration): the engine must not
    # also bind config.metrics_port.
    config = dataclasses.replace(config, metrics_port=None)
    if simulate:
        from kvtier.sim.simtier import sim_tiers

        config = dataclasses.replace(config, primary_backing="none")
        # Secondary tiers become metadata-only models (kvtier.sim.simtier): the engine is unchanged.
        engine = Engine(config, clock=lambda: now[0], tiers=sim_tiers(config))
    else:
        engine = Engine(config)
    exporter = None
    try:
        if port is not None:
            exporter = start_exporter(engine, port)
        report = ReplayReport(
            trace=trace.name,
            mode=mode,
            policy=config.eviction_policy,
            capacity_blocks=int(engine.num_slots),
            requests=trace.requests,
            block_refs=trace.block_refs,
            unique_blocks=trace.unique_blocks,
            tokens=trace.tokens,
            infinite=trace.infinite(),
        )
        if simulate and config.secondary_tiers:
            report.notes.append(
                "simulate mode models secondary tiers by capacity and policy (kvtier.sim.simtier); "
                "their timing and I/O are not simulated"
            )
        cm = cost_model or CostModel.from_config(
            config, tier_media={t.name: t.medium for t in getattr(engine, "tiers", [])}
        )
        inner: Callable[[Any, int], None] | None = None
        if hook is not None:
            user_hook = hook

            def inner(eng: Any, done: int) -> None:
                user_hook(eng, done, exporter)

        t0 = time.perf_counter()
        if simulate:
            run_simulate(engine, trace, report, cm, now, progress, inner, RequestContext)
        else:
            run_real(engine, trace, report, cm, config, progress, inner, RequestContext, sync)
        report.engine_seconds = time.perf_counter() - t0
        if hook is not None:
            hook(engine, trace.requests, exporter)
        _fill_tiers(report, engine.stats(), _tier_types(config, engine, simulate))
        report.elapsed_seconds = time.perf_counter() - t0
        return report
    finally:
        if exporter is not None:
            exporter.close()
        engine.close()


def _fill_tiers(report: ReplayReport, stats: Any, types: dict[str, str]) -> None:
    refs = max(report.block_refs, 1)
    report.tiers = []
    for name, c in tier_counters(stats).items():
        hits = int(c["hits"])
        report.tiers.append(
            TierReport(
                name=name,
                type=types.get(name, "?"),
                hits=hits,
                hit_ratio=hits / refs,
                lookups=int(c["lookups"]),
                bytes_read=int(c["bytes_read"]),
                bytes_written=int(c["bytes_written"]),
                evictions=int(c["evictions"]),
                corrupt=int(c["corrupt"]),
                dropped_stores=int(c["dropped_stores"]),
                failed_jobs=int(c["failed_jobs"]),
            )
        )
