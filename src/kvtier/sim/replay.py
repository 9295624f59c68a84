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
from kvtier.keys import BlockInfo, BlockKey, KeyNamespace, LookupResult
from kvtier.metrics import tier_counters
from kvtier.sim.payload import PayloadFactory
from kvtier.sim.report import ReplayReport, TierReport, percentiles
from kvtier.sim.trace import TraceRequest, flatten

__all__ = ["PreparedTrace", "ProgressFn", "prepare_trace", "replay"]

#: ``progress(requests_done, requests_total)``; called every few hundred requests and at the end.
ProgressFn = Callable[[int, int], None]
#: ``hook(engine, requests_done, exporter)``: called at the same points with the live engine and the
#: metrics exporter (``None`` without a metrics port), for tests and live inspection.
HookFn = Callable[[Any, int, Any], None]

_CODE = {LookupResult.MISS: 0, LookupResult.HIT: 1, LookupResult.HIT_PENDING: 2, LookupResult.RETRY: 3}
_PROGRESS_EVERY = 256
#: Real mode never lets more store jobs than this be in flight (see ``replay``).
_MAX_INFLIGHT_JOBS = 8


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
            _run_simulate(engine, trace, report, cm, now, progress, inner, RequestContext)
        else:
            _run_real(engine, trace, report, cm, config, progress, inner, RequestContext, sync)
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


class _Cost:
    """Accumulates the projected prefill saving of prefix hits, per request and tier."""

    def __init__(self, cm: CostModel, tier_names: list[str]) -> None:
        self.cm = cm
        self.names = tier_names
        self.saved = 0.0
        self.by_tier: dict[str, float] = {n: 0.0 for n in ["primary", *tier_names]}
        self.skippable = 0

    def add(self, primary_blocks: int, primary_tokens: int, pending: Sequence[tuple[str, int, int]]) -> None:
        if primary_blocks:
            s = self.cm.saving_seconds("primary", primary_blocks, primary_tokens)
            self.saved += s
            self.by_tier["primary"] += s
        for name, n, toks in pending:
            if n:
                if not self.cm.should_load(name, n):
                    self.skippable += n
                s = self.cm.saving_seconds(name, n, toks)
                self.saved += s
                self.by_tier[name] = self.by_tier.get(name, 0.0) + s

    def as_dict(self, total_tokens: int) -> dict[str, Any]:
        prefill = self.cm.recompute_seconds(0, total_tokens)
        return {
            "prefill_seconds": prefill,
            "saved_seconds": self.saved,
            "saved_fraction": self.saved / prefill if prefill > 0 else 0.0,
            "saved_seconds_by_tier": self.by_tier,
            "blocks_slower_than_recompute": self.skippable,
            "model": self.cm.as_dict(),
        }


def _codes(rep: Any) -> bytes:
    """Per-key outcome codes of a lookup report (0 MISS, 1 HIT, 2 HIT_PENDING, 3 RETRY)."""
    codes = getattr(rep, "codes", None)
    if isinstance(codes, bytes | bytearray):
        return bytes(codes)
    return bytes(_CODE[r] for r in rep.results)


def _prefix_split(codes: bytes, n: int, last: int, tpb: int) -> tuple[int, int, int, int, int]:
    """(prefix length, primary blocks, primary tokens, pending blocks, pending tokens) of the leading run."""
    miss = codes.find(0)
    retry = codes.find(3)
    i = n if miss < 0 else miss
    if 0 <= retry < i:
        i = retry
    prim = codes.count(1, 0, i)
    pend = i - prim
    # Only the request's last block can be partial; it is in the prefix only if every block hit.
    short = tpb - last if i == n else 0
    last_is_pending = i == n and codes[n - 1] == 2
    prim_tok = prim * tpb - (0 if last_is_pending else short)
    pend_tok = pend * tpb - (short if last_is_pending else 0)
    return i, prim, prim_tok, pend, pend_tok


def _attribute(pend: int, pend_tok: int, deltas: list[int], names: list[str]) -> list[tuple[str, int, int]]:
    """Split a request's pending prefix hits over the tiers that answered them, in tier order."""
    if not pend:
        return []
    out: list[tuple[str, int, int]] = []
    left, left_tok = pend, pend_tok
    for name, d in zip(names, deltas, strict=True):
        take = min(d, left)
        if take:
            toks = left_tok if take == left else take * (pend_tok // pend)
            out.append((name, take, toks))
            left -= take
            left_tok -= toks
    if left and names:
        out.append((names[0], left, left_tok))
    return out


def _count_hits(report: ReplayReport, codes: bytes, n: int, last: int, tpb: int) -> int:
    hits = codes.count(1) + codes.count(2)
    report.block_hits += hits
    if hits:
        last_hit = codes[n - 1] == 1 or codes[n - 1] == 2
        report.token_hits += hits * tpb - ((tpb - last) if last_hit else 0)
    return hits


def _run_simulate(
    engine: Any,
    trace: PreparedTrace,
    report: ReplayReport,
    cm: CostModel,
    now: list[float],
    progress: ProgressFn | None,
    hook: Callable[[Any, int], None] | None,
    ctx_cls: Any,
) -> None:
    tpb = trace.tokens_per_block
    tiers = list(getattr(engine, "tiers", []))
    names = [t.name for t in tiers]
    cost = _Cost(cm, names)
    lookup = engine.lookup
    prepare_store = engine.prepare_store
    complete_store = engine.complete_store
    total = trace.requests
    no_ctx = ctx_cls()
    ctx_of: dict[str | None, Any] = {None: no_ctx}
    for i, (keys, infos, last, ts, tenant) in enumerate(
        zip(trace.keys, trace.infos, trace.last_tokens, trace.timestamps, trace.tenants, strict=True)
    ):
        n = len(keys)
        if not n:
            continue
        now[0] = ts
        ctx = ctx_of.get(tenant)
        if ctx is None:
            ctx = ctx_of[tenant] = ctx_cls(tenant=tenant)
        before = [t.stats.hits for t in tiers] if tiers else None
        codes = _codes(lookup(keys, ctx))
        hits = _count_hits(report, codes, n, last, tpb)
        plen, prim, prim_tok, pend, pend_tok = _prefix_split(codes, n, last, tpb)
        report.prefix_hits += plen
        report.prefix_token_hits += prim_tok + pend_tok
        if before is not None:
            deltas = [t.stats.hits - b for t, b in zip(tiers, before, strict=True)]
            cost.add(prim, prim_tok, _attribute(pend, pend_tok, deltas, names))
        elif prim:
            cost.add(prim, prim_tok, ())
        if tiers and 2 in codes:
            # Finish the promotions before storing the misses, as real mode does (load first).
            engine.poll()
        if hits < n:
            if hits == plen:
                # Hits form the leading run (the usual case with chained prefix ids): slice.
                mk, mi = keys[plen:], infos[plen:]
            else:
                idx = [j for j, c in enumerate(codes) if c == 0 or c == 3]
                mk = [keys[j] for j in idx]
                mi = [infos[j] for j in idx]
            complete_store(prepare_store(mk, ctx, mi))
        if tiers:
            engine.poll()
        if (i + 1) % _PROGRESS_EVERY == 0:
            engine.events()  # keep the event queue bounded; replay reads stats, not events
            if progress is not None:
                progress(i + 1, total)
            if hook is not None:
                hook(engine, i + 1)
    if tiers:
        engine.drain()
        engine.poll()
    if progress is not None:
        progress(total, total)
    report.cost = cost.as_dict(report.tokens)


def _run_real(
    engine: Any,
    trace: PreparedTrace,
    report: ReplayReport,
    cm: CostModel,
    config: KvtierConfig,
    progress: ProgressFn | None,
    hook: Callable[[Any, int], None] | None,
    ctx_cls: Any,
    sync: bool,
) -> None:
    from kvtier.errors import MisuseError

    tpb = trace.tokens_per_block
    tiers = list(getattr(engine, "tiers", []))
    names = [t.name for t in tiers]
    cost = _Cost(cm, names)
    payload = PayloadFactory(config.block_bytes)
    total = trace.requests
    lat_lookup: list[float] = []
    lat_load: list[float] = []
    lat_store: list[float] = []
    # Load latency by the slowest tier a request's hits came from (promotions wait for that tier).
    lat_by_tier: dict[str, list[float]] = {n: [] for n in ["primary", *names]}
    clock = time.perf_counter
    max_n = max((len(k) for k in trace.keys), default=0)
    # Store jobs allowed in flight: about one per 512 primary slots (at most 8), so the slots they
    # pin stay a small share of the primary tier and never force a store to be dropped.
    overlap = min(_MAX_INFLIGHT_JOBS, engine.num_slots // 512)
    buf = np.empty((max(max_n, 1), config.block_bytes), dtype=np.uint8)
    for i, (keys, infos, last, tenant) in enumerate(
        zip(trace.keys, trace.infos, trace.last_tokens, trace.tenants, strict=True)
    ):
        n = len(keys)
        if not n:
            continue
        ctx = ctx_cls(request_id=str(i), tenant=tenant)
        before = [t.stats.hits for t in tiers]
        t0 = clock()
        rep = engine.lookup(keys, ctx)
        t1 = clock()
        lat_lookup.append(t1 - t0)
        codes = _codes(rep)
        _count_hits(report, codes, n, last, tpb)
        plen, prim, prim_tok, pend, pend_tok = _prefix_split(codes, n, last, tpb)
        report.prefix_hits += plen
        report.prefix_token_hits += prim_tok + pend_tok
        deltas = [t.stats.hits - b for t, b in zip(tiers, before, strict=True)]
        cost.add(prim, prim_tok, _attribute(pend, pend_tok, deltas, names))

        hit_idx = [j for j, c in enumerate(codes) if c == 1 or c == 2]
        recompute: list[int] = []
        if hit_idx:
            t2 = clock()
            if rep.pending:
                # Promotions are jobs: wait for them so the blocks are READY to load.
                engine.drain()
                engine.poll()
            hit_keys = [keys[j] for j in hit_idx]
            try:
                copied = engine.load_blocks(hit_keys, buf[: len(hit_keys)], ctx)
            except MisuseError:
                # A promotion failed (tier error); the engine already counted it. Degrade to misses.
                copied = 0
            # load_blocks copies the leading run it can read; a failed promotion (tier error,
            # corrupt file) ends it. Verify what was copied, recompute (store) the rest.
            report.failed_loads += len(hit_keys) - copied
            if copied:
                report.verify_mismatches += len(payload.mismatches(hit_keys[:copied], buf[:copied]))
                report.verified_blocks += copied
            recompute = hit_idx[copied:]
            dt = clock() - t2
            lat_load.append(dt)
            src = "primary"
            if rep.pending:
                answered = [nm for nm, d in zip(names, deltas, strict=True) if d]
                src = answered[-1] if answered else "primary"
            lat_by_tier[src].append(dt)
        if len(hit_idx) < n or recompute:
            hit_set = set(hit_idx)
            # Blocks whose load failed are recomputed too (resident ones are skipped by the engine).
            idx = [j for j in range(n) if j not in hit_set] + recompute
            mk = [keys[j] for j in idx]
            t3 = clock()
            # Same BlockInfo (parent, depth, tenant) as simulate mode: prefix-aware policies use it.
            engine.store_blocks(mk, payload.make(mk), ctx, [infos[j] for j in idx])
            lat_store.append(clock() - t3)
        # Bounded overlap: tier writes (write-through stores, and after-hits stores started by the
        # lookup) run while the next requests are served, but never more than a few requests'
        # worth, so slots pinned by them cannot crowd out stores.
        if sync or engine.inflight_jobs > overlap:
            engine.drain()
        engine.poll()
        if (i + 1) % _PROGRESS_EVERY == 0:
            engine.events()
            if progress is not None:
                progress(i + 1, total)
            if hook is not None:
                hook(engine, i + 1)
    engine.drain()
    engine.poll()
    if progress is not None:
        progress(total, total)
    report.latency = {
        "lookup": percentiles(lat_lookup),
        "load": percentiles(lat_load),
        "store": percentiles(lat_store),
    }
    for name, samples in lat_by_tier.items():
        if samples:
            report.latency[f"load[{name}]"] = percentiles(samples)
    report.cost = cost.as_dict(report.tokens)
