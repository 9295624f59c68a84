"""The per-request loops of :func:`kvtier.sim.replay.replay` (real and simulate) and their tallies.

Kept apart from the orchestration in :mod:`kvtier.sim.replay`. The simulate loops are the hot path of
capacity planning (>= 500,000 block references per second is the target): they count outcomes from
``LookupReport.codes`` (bytes, C-level ``count``/``find``) and, without secondary tiers, defer the
cost model to one vectorised pass at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtier.config import KvtierConfig
from kvtier.costmodel import CostModel
from kvtier.keys import LookupCode, LookupResult
from kvtier.sim.payload import PayloadFactory
from kvtier.sim.report import ReplayReport, percentiles

if TYPE_CHECKING:
    from kvtier.sim.prepared import PreparedTrace

__all__ = ["LoopRun", "lookup_step", "run_fast", "run_real", "run_simulate", "store_step"]

#: ``progress(requests_done, requests_total)``.
ProgressFn = Callable[[int, int], None]

_CODE = {r: int(LookupCode.of(r)) for r in LookupResult}
_PROGRESS_EVERY = 256
#: Real mode never lets more store jobs than this be in flight (see ``replay``).
_MAX_INFLIGHT_JOBS = 8


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


def _requests(
    trace: PreparedTrace, ctx_cls: Any, now: list[float]
) -> Iterator[tuple[int, Any, Any, int, Any]]:
    """``(index, keys, infos, last_tokens, ctx)`` of each non-empty request, in order.

    Advances the virtual clock to the request's timestamp and reuses one context per tenant (the
    simulate loops are hot; a context per request would cost an allocation each)."""
    ctx_of: dict[str | None, Any] = {None: ctx_cls()}
    for i, (keys, infos, last, ts, tenant) in enumerate(
        zip(trace.keys, trace.infos, trace.last_tokens, trace.timestamps, trace.tenants, strict=True)
    ):
        if not keys:
            continue
        now[0] = ts
        ctx = ctx_of.get(tenant)
        if ctx is None:
            ctx = ctx_of[tenant] = ctx_cls(tenant=tenant)
        yield i, keys, infos, last, ctx


def _misses(keys: Any, infos: Any, codes: bytes, hits: int, plen: int) -> tuple[Any, Any]:
    """Keys (and infos) answered MISS or RETRY: a slice when the hits are the leading run."""
    if hits == plen:
        return keys[plen:], infos[plen:]
    idx = [j for j, c in enumerate(codes) if c == 0 or c == 3]
    return [keys[j] for j in idx], [infos[j] for j in idx]


def _tick(
    engine: Any, done: int, total: int, progress: ProgressFn | None, hook: Callable[[Any, int], None] | None
) -> None:
    """Every _PROGRESS_EVERY requests: bound the event queue, report progress, run the hook."""
    if done % _PROGRESS_EVERY == 0:
        engine.events()  # keep the event queue bounded; replay reads stats, not events
        if progress is not None:
            progress(done, total)
        if hook is not None:
            hook(engine, done)


@dataclass
class LoopRun:
    """What each replay loop is given: the engine, the trace, the report it fills, the cost model,
    the request-context class, and what runs every few hundred requests (progress, hook)."""

    engine: Any
    trace: PreparedTrace
    report: ReplayReport
    cm: CostModel
    ctx_cls: Any
    progress: ProgressFn | None = None
    hook: Callable[[Any, int], None] | None = None

    def tick(self, done: int) -> None:
        _tick(self.engine, done, self.trace.requests, self.progress, self.hook)

    def done(self) -> None:
        """After the last request: the whole trace is done."""
        if self.progress is not None:
            self.progress(self.trace.requests, self.trace.requests)


def lookup_step(
    engine: Any,
    tiers: list[Any],
    names: list[str],
    cost: _Cost,
    report: ReplayReport,
    keys: list[Any],
    last: int,
    ctx: Any,
    tpb: int,
) -> tuple[bytes, int, int]:
    """The lookup half of one simulate request: tallies and cost; ``(codes, hits, prefix length)``."""
    n = len(keys)
    before = [t.stats.hits for t in tiers] if tiers else None
    codes = _codes(engine.lookup(keys, ctx))
    hits = _count_hits(report, codes, n, last, tpb)
    plen, prim, prim_tok, pend, pend_tok = _prefix_split(codes, n, last, tpb)
    report.prefix_hits += plen
    report.prefix_token_hits += prim_tok + pend_tok
    if before is not None:
        deltas = [t.stats.hits - b for t, b in zip(tiers, before, strict=True)]
        cost.add(prim, prim_tok, _attribute(pend, pend_tok, deltas, names))
    elif prim:
        cost.add(prim, prim_tok, ())
    return codes, hits, plen


def store_step(
    engine: Any,
    tiers: list[Any],
    keys: list[Any],
    infos: list[Any],
    codes: bytes,
    hits: int,
    plen: int,
    ctx: Any,
) -> None:
    """The store half of one simulate request: finish promotions, store the misses, collect jobs."""
    if tiers and 2 in codes:
        # Finish the promotions before storing the misses, as real mode does (load first).
        engine.poll()
    if hits < len(keys):
        mk, mi = _misses(keys, infos, codes, hits, plen)
        engine.complete_store(engine.prepare_store(mk, ctx, mi))
    if tiers:
        engine.poll()


def run_simulate(run: LoopRun, now: list[float]) -> None:
    """Simulate mode: each request's lookup then its stores (:func:`lookup_step`, :func:`store_step`)."""
    engine, report = run.engine, run.report
    tiers = list(getattr(engine, "tiers", []))
    if not tiers:
        _simulate_primary_only(run, now)
        return
    names = [t.name for t in tiers]
    cost = _Cost(run.cm, names)
    tpb = run.trace.tokens_per_block
    for i, keys, infos, last, ctx in _requests(run.trace, run.ctx_cls, now):
        codes, hits, plen = lookup_step(engine, tiers, names, cost, report, keys, last, ctx, tpb)
        store_step(engine, tiers, keys, infos, codes, hits, plen, ctx)
        run.tick(i + 1)
    engine.drain()
    engine.poll()
    run.done()
    report.cost = cost.as_dict(report.tokens)


def _simulate_primary_only(run: LoopRun, now: list[float]) -> None:
    """:func:`run_simulate` for a stack without secondary tiers: the sweep hot path.

    Same calls and tallies, fewer Python operations per request: counters are locals, every hit is a
    primary hit, and the cost model runs once over all requests at the end.
    """
    engine, trace, report = run.engine, run.trace, run.report
    tpb = trace.tokens_per_block
    tick = run.tick
    lookup = engine.lookup
    prepare_store = engine.prepare_store
    complete_store = engine.complete_store
    # Engine.access = lookup + store the misses, one call and one lock (no RETRY without tiers, so
    # "the misses" are exactly what this loop would store).
    access = getattr(engine, "access", None)
    block_hits = token_hits = prefix_hits = prefix_tokens = 0
    cost_n: list[int] = []
    cost_t: list[int] = []
    for i, keys, infos, last, ctx in _requests(trace, run.ctx_cls, now):
        n = len(keys)
        codes = access(keys, ctx, infos).codes if access is not None else lookup(keys, ctx).codes
        if not isinstance(codes, bytes):
            codes = bytes(codes)
        hits = codes.count(1) + codes.count(2)
        plen = 0
        if hits:
            block_hits += hits
            lc = codes[n - 1]
            token_hits += hits * tpb - ((tpb - last) if lc == 1 or lc == 2 else 0)
            if hits == n:
                plen = n
            else:
                m, r = codes.find(0), codes.find(3)
                plen = r if m < 0 else (m if r < 0 else min(m, r))
            if plen:
                ptok = plen * tpb - ((tpb - last) if plen == n else 0)
                prefix_hits += plen
                prefix_tokens += ptok
                cost_n.append(plen)
                cost_t.append(ptok)
        if hits < n and access is None:
            mk, mi = _misses(keys, infos, codes, hits, plen)
            complete_store(prepare_store(mk, ctx, mi))
        tick(i + 1)
    run.done()
    report.block_hits += block_hits
    report.token_hits += token_hits
    report.prefix_hits += prefix_hits
    report.prefix_token_hits += prefix_tokens
    _primary_saving(report, run.cm, cost_n, cost_t)


def _primary_saving(report: ReplayReport, cm: CostModel, blocks: list[int], tokens: list[int]) -> None:
    """``report.cost`` of a primary-only stack: every request's prefix hit (``blocks``, ``tokens``)
    was a primary hit, so the cost model runs once over all of them."""
    cost = _Cost(cm, [])
    saved = cm.total_saving_seconds("primary", blocks, tokens)
    cost.saved += saved
    cost.by_tier["primary"] += saved
    report.cost = cost.as_dict(report.tokens)


def _load_hits(
    engine: Any, rep: Any, hit_keys: list[Any], hit_idx: list[int], buf: Any, ctx: Any,
    report: ReplayReport, payload: PayloadFactory,
) -> list[int]:  # fmt: skip
    """Load a request's hits (after its promotions finished) and verify the bytes; returns the
    indexes whose load failed, to recompute. ``load_blocks`` copies the leading run it can read; a
    failed promotion (tier error, corrupt file) ends it."""
    from kvtier.errors import MisuseError

    if rep.pending:
        # Promotions are jobs: wait for them so the blocks are READY to load.
        engine.drain()
        engine.poll()
    try:
        copied = engine.load_blocks(hit_keys, buf[: len(hit_keys)], ctx)
    except MisuseError:
        # A promotion failed (tier error); the engine already counted it. Degrade to misses.
        copied = 0
    report.failed_loads += len(hit_keys) - copied
    if copied:
        report.verify_mismatches += len(payload.mismatches(hit_keys[:copied], buf[:copied]))
        report.verified_blocks += copied
    return hit_idx[copied:]


def run_fast(
    trace: PreparedTrace, report: ReplayReport, cm: CostModel, config: KvtierConfig, slots: int
) -> None:
    """:func:`_simulate_primary_only` on the fast core (:mod:`kvtier.sim.fastcore`): same tallies.

    The per-request outcomes come back as arrays; hits, token hits, prefix hits and the cost model
    are vectorised passes over them. The primary tier's counters are filled as the engine's would be.
    """
    from kvtier.sim.fastcore import simulate_ids
    from kvtier.sim.report import TierReport

    ids, offsets, nuniq = trace.dense_ids()
    res = simulate_ids(config.eviction_policy, ids, offsets, nuniq, slots)
    tpb = trace.tokens_per_block
    n = np.diff(offsets)
    short = tpb - np.asarray(trace.last_tokens, dtype=np.int64)
    hits = res.hits.astype(np.int64)
    plen = res.prefix.astype(np.int64)
    report.block_hits += int(hits.sum())
    report.token_hits += int((hits * tpb - np.where(res.last_hit, short, 0)).sum())
    ptok = plen * tpb - np.where((plen == n) & (n > 0), short, 0)
    report.prefix_hits += int(plen.sum())
    report.prefix_token_hits += int(ptok.sum())
    some = plen > 0
    _primary_saving(report, cm, plen[some].tolist(), ptok[some].tolist())
    report.tiers = [
        TierReport(
            name="primary",
            type=f"primary/{config.primary_backing}",
            hits=report.block_hits,
            hit_ratio=report.block_hits / max(report.block_refs, 1),
            lookups=int(n.sum()),
            evictions=res.evictions,
            dropped_stores=res.dropped,
        )
    ]
    report.notes.append(f"simulated on the fast core ({res.core}): the engine's decisions on dense ids")


def run_real(run: LoopRun, config: KvtierConfig, sync: bool) -> None:
    """Real mode: each request's lookup, the loads of its hits (verified) and the stores of its
    misses move real bytes; tier writes overlap the next requests within a bound."""
    engine = run.engine
    real = _RealRequests(run, config.block_bytes)
    # Store jobs allowed in flight: about one per 512 primary slots (at most 8), so the slots they
    # pin stay a small share of the primary tier and never force a store to be dropped.
    overlap = min(_MAX_INFLIGHT_JOBS, engine.num_slots // 512)
    trace = run.trace
    for i, (keys, infos, last, tenant) in enumerate(
        zip(trace.keys, trace.infos, trace.last_tokens, trace.tenants, strict=True)
    ):
        if not keys:
            continue
        real.serve(keys, infos, last, run.ctx_cls(request_id=str(i), tenant=tenant))
        # Bounded overlap: tier writes (write-through stores, and after-hits stores started by the
        # lookup) run while the next requests are served, but never more than a few requests'
        # worth, so slots pinned by them cannot crowd out stores.
        if sync or engine.inflight_jobs > overlap:
            engine.drain()
        engine.poll()
        run.tick(i + 1)
    engine.drain()
    engine.poll()
    run.done()
    run.report.latency = _latency(real.lat_lookup, real.lat_load, real.lat_store, real.lat_by_tier)
    run.report.cost = real.cost.as_dict(run.report.tokens)


class _RealRequests:
    """Real mode's per-request steps (lookup, load the hits, store the misses) and their latencies."""

    def __init__(self, run: LoopRun, block_bytes: int) -> None:
        self.run = run
        self.engine = run.engine
        self.tiers = list(getattr(run.engine, "tiers", []))
        self.names = [t.name for t in self.tiers]
        self.cost = _Cost(run.cm, self.names)
        self.payload = PayloadFactory(block_bytes)
        self.lat_lookup: list[float] = []
        self.lat_load: list[float] = []
        self.lat_store: list[float] = []
        # Load latency by the slowest tier a request's hits came from (promotions wait for that tier).
        self.lat_by_tier: dict[str, list[float]] = {n: [] for n in ["primary", *self.names]}
        max_n = max((len(k) for k in run.trace.keys), default=0)
        self.buf = np.empty((max(max_n, 1), block_bytes), dtype=np.uint8)

    def serve(self, keys: list[Any], infos: list[Any], last: int, ctx: Any) -> None:
        rep, codes, deltas = self._lookup(keys, last, ctx)
        hit_idx = [j for j, c in enumerate(codes) if c == 1 or c == 2]
        recompute = self._load(keys, hit_idx, rep, deltas, ctx) if hit_idx else []
        if len(hit_idx) < len(keys) or recompute:
            hit_set = set(hit_idx)
            # Blocks whose load failed are recomputed too (resident ones are skipped by the engine).
            self._store(keys, infos, [j for j in range(len(keys)) if j not in hit_set] + recompute, ctx)

    def _lookup(self, keys: list[Any], last: int, ctx: Any) -> tuple[Any, bytes, list[int]]:
        """Look the request up and tally it: ``(lookup report, codes, hits per tier)``."""
        report, tpb, n = self.run.report, self.run.trace.tokens_per_block, len(keys)
        before = [t.stats.hits for t in self.tiers]
        t0 = time.perf_counter()
        rep = self.engine.lookup(keys, ctx)
        self.lat_lookup.append(time.perf_counter() - t0)
        codes = _codes(rep)
        _count_hits(report, codes, n, last, tpb)
        plen, prim, prim_tok, pend, pend_tok = _prefix_split(codes, n, last, tpb)
        report.prefix_hits += plen
        report.prefix_token_hits += prim_tok + pend_tok
        deltas = [t.stats.hits - b for t, b in zip(self.tiers, before, strict=True)]
        self.cost.add(prim, prim_tok, _attribute(pend, pend_tok, deltas, self.names))
        return rep, codes, deltas

    def _load(self, keys: list[Any], hit_idx: list[int], rep: Any, deltas: list[int], ctx: Any) -> list[int]:
        """Load and verify the hits; returns the indexes to recompute (their load failed)."""
        t0 = time.perf_counter()
        hit_keys = [keys[j] for j in hit_idx]
        recompute = _load_hits(
            self.engine, rep, hit_keys, hit_idx, self.buf, ctx, self.run.report, self.payload
        )
        dt = time.perf_counter() - t0
        self.lat_load.append(dt)
        src = "primary"
        if rep.pending:
            answered = [nm for nm, d in zip(self.names, deltas, strict=True) if d]
            src = answered[-1] if answered else "primary"
        self.lat_by_tier[src].append(dt)
        return recompute

    def _store(self, keys: list[Any], infos: list[Any], idx: list[int], ctx: Any) -> None:
        mk = [keys[j] for j in idx]
        t0 = time.perf_counter()
        # Same BlockInfo (parent, depth, tenant) as simulate mode: prefix-aware policies use it.
        self.engine.store_blocks(mk, self.payload.make(mk), ctx, [infos[j] for j in idx])
        self.lat_store.append(time.perf_counter() - t0)


def _latency(
    lookup: list[float], load: list[float], store: list[float], load_by_tier: dict[str, list[float]]
) -> dict[str, dict[str, float]]:
    """Real mode's latency percentiles: per operation, and loads by the tier they waited for."""
    out = {"lookup": percentiles(lookup), "load": percentiles(load), "store": percentiles(store)}
    for name, samples in load_by_tier.items():
        if samples:
            out[f"load[{name}]"] = percentiles(samples)
    return out
