"""Fleet simulation: N engine instances behind a router, with per-instance and shared tiers.

``simulate_fleet(trace, config, FleetSpec(instances=N, router=...))`` replays a trace through N
simulate-mode engines (the real :class:`kvtier.engine.Engine`, ``primary_backing: none``, one virtual
clock) and a router that sends each request to one instance. Each instance runs exactly the per-request
step of ``kvtier replay --simulate`` (:func:`kvtier.sim.replay_loops.simulate_step`), so a fleet of one
instance is the single-engine simulation, decision for decision (tests/sim/test_sim_fleet.py).

Tiers:

* **per instance** — the primary tier and every secondary tier not listed as shared: each instance
  builds its own model through the tier's simulation hook (:func:`kvtier.sim.simtier.sim_tiers`);
* **shared** — the tiers named in ``FleetSpec.shared`` (default: the remote types ``redis``, ``obj``,
  ``mooncake``): one model built once through the tier's simulation hook, whose contents (its policy)
  every instance's tier object reads and writes; each instance keeps its own counters, so hits and
  bytes are reported per instance;
* **p2p** — a ``p2p`` tier in the config is not modelled by its hook here (the hook pools the peers'
  primary capacity for a single engine): the fleet knows the peers. After an instance's own lookup, the
  blocks right after its leading run of hits that another instance holds in its primary tier are
  counted as p2p hits (loaded from the peer at the cost model's ``p2p`` speed, then stored locally as
  the engine stores any miss).

Routers (``FleetSpec.router``):

* ``round_robin`` — request ``i`` to instance ``i mod N``;
* ``session`` — sticky by conversation: the root of the ``chat_id`` chain when the trace has one, else
  the request's first two block ids (a shared system prompt rarely fills two blocks); no load bound;
* ``prefix`` — longest cached prefix with bounded load, as llm-d's and Dynamo's KV-aware routers do:
  the router keeps an index of which instance holds which block in its primary tier, fed by the
  engines' own ``stored``/``promoted``/``evicted`` events (KV events), and sends a request to the
  instance holding its longest leading run, among instances whose load (requests routed so far) stays
  within ``(1 + imbalance)`` times the mean — consistent hashing with bounded loads (Mirrokni,
  Thorup, Zadimoghaddam, SODA 2018). The session's home instance (as the ``session`` router picks
  it) wins unless another holds ``margin`` (2) more blocks; other ties go to the least loaded.

Reported per fleet (:class:`FleetReport`): hit ratios per tier and per instance, shared-tier (and
p2p) traffic as bytes per second, mean and p99 over fixed windows (1 s by default) of the trace
clock, load imbalance (max / mean requests and computed tokens per instance), prefill seconds saved
(cost model) and requests per instance.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any

import numpy as np

from kvtier.config import KvtierConfig
from kvtier.costmodel import CostModel, TierCost
from kvtier.errors import ConfigError
from kvtier.keys import BlockKey
from kvtier.sim.prepared import PreparedTrace
from kvtier.sim.report import ReplayReport

__all__ = ["DEFAULT_SHARED_TYPES", "ROUTERS", "FleetReport", "FleetSpec", "fleet_tables", "simulate_fleet"]

ROUTERS = ("round_robin", "session", "prefix")
#: Tier types shared by every instance unless ``FleetSpec.shared`` says otherwise.
DEFAULT_SHARED_TYPES = frozenset({"redis", "obj", "mooncake"})
#: p2p speed when the config's cost model does not name a ``p2p`` tier: a peer's host RAM over 25 GbE.
DEFAULT_P2P = TierCost("p2p", 2.5e9, 200e-6, 2.5e9, 200e-6, source="default")


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """A fleet: how many instances, which router, which tiers are shared.

    Attributes:
        instances: engine instances (>= 1).
        router: one of :data:`ROUTERS`.
        shared: names of the config's secondary tiers shared by all instances; ``None``: those of the
            types in :data:`DEFAULT_SHARED_TYPES`.
        imbalance: ``prefix`` router's load bound: an instance takes a request only while its load
            stays <= ``(1 + imbalance)`` x the mean (>= 0).
        window_seconds: width of the windows that traffic percentiles are taken over (> 0).
        p2p: instances load from each other's primary tiers; ``None``: when the config has a ``p2p``
            tier.
        margin: ``prefix`` router: blocks of cached prefix another instance must hold beyond the
            session's home instance to take its request (>= 0).
    """

    instances: int = 1
    router: str = "prefix"
    shared: tuple[str, ...] | None = None
    imbalance: float = 0.25
    window_seconds: float = 1.0
    p2p: bool | None = None
    margin: int = 2

    def check(self) -> None:
        if not isinstance(self.instances, int) or self.instances < 1 or self.instances > 1024:
            raise ConfigError("--instances", f"expected 1..1024 instances, got {self.instances!r}")
        if self.router not in ROUTERS:
            raise ConfigError("--router", f"unknown router {self.router!r}; choose from {', '.join(ROUTERS)}")
        if not (np.isfinite(self.imbalance) and 0 <= self.imbalance <= 100):
            raise ConfigError("--imbalance", f"expected a finite ratio in [0, 100], got {self.imbalance!r}")
        if not isinstance(self.margin, int) or self.margin < 0:
            raise ConfigError("margin", f"expected blocks >= 0, got {self.margin!r}")
        if not (np.isfinite(self.window_seconds) and self.window_seconds > 0):
            raise ConfigError("window_seconds", f"expected seconds > 0, got {self.window_seconds!r}")


@dataclass
class FleetReport:
    """What a fleet simulation measured (see the module docstring)."""

    trace: str
    router: str
    shared_tiers: list[str]
    p2p: bool
    block_refs: int
    tokens: int
    computed_tokens: list[int]
    #: Each instance's replay report (its ``requests``: how many the router sent it).
    per_instance: list[ReplayReport]
    traffic: dict[str, dict[str, float]]
    saved_seconds: float
    prefill_seconds: float
    trace_seconds: float
    #: Blocks loaded from a peer's primary tier (counted in the instances' prefix hits too).
    p2p_hits: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def instances(self) -> int:
        return len(self.per_instance)

    @property
    def requests(self) -> list[int]:
        """Requests routed to each instance."""
        return [r.requests for r in self.per_instance]

    @property
    def tier_hits(self) -> dict[str, int]:
        """Hits per tier summed over the instances (and ``p2p`` with peers), in tier order."""
        out: dict[str, int] = {}
        for rep in self.per_instance:
            for t in rep.tiers:
                out[t.name] = out.get(t.name, 0) + t.hits
        if self.p2p:
            out["p2p"] = self.p2p_hits
        return out

    @property
    def block_hits(self) -> int:
        return sum(r.block_hits for r in self.per_instance) + self.p2p_hits

    @property
    def prefix_hits(self) -> int:
        return sum(r.prefix_hits for r in self.per_instance)

    @property
    def hit_ratio(self) -> dict[str, float]:
        refs = max(self.block_refs, 1)
        return {"block": self.block_hits / refs, "prefix": self.prefix_hits / refs}

    @property
    def imbalance(self) -> dict[str, float]:
        """max / mean of requests and of computed (missed) tokens per instance (1.0 = even)."""

        def ratio(xs: Sequence[int]) -> float:
            mean = sum(xs) / len(xs)
            return max(xs) / mean if mean > 0 else 1.0

        return {"requests": ratio(self.requests), "computed_tokens": ratio(self.computed_tokens)}

    def to_json(self) -> dict[str, Any]:
        refs = max(self.block_refs, 1)
        return {
            "trace": self.trace,
            "instances": self.instances,
            "router": self.router,
            "shared_tiers": self.shared_tiers,
            "p2p": self.p2p,
            "block_refs": self.block_refs,
            "hit_ratio": self.hit_ratio,
            "tier_hit_ratio": {k: v / refs for k, v in self.tier_hits.items()},
            "imbalance": self.imbalance,
            "traffic_bytes_per_second": self.traffic,
            "prefill_seconds": self.prefill_seconds,
            "saved_seconds": self.saved_seconds,
            "saved_fraction": self.saved_seconds / self.prefill_seconds if self.prefill_seconds else 0.0,
            "trace_seconds": self.trace_seconds,
            "per_instance": [
                {
                    "instance": i,
                    "requests": self.requests[i],
                    "block_refs": r.block_refs,
                    "hit_ratio": r.hit_ratio,
                    "tiers": {
                        t.name: {"hits": t.hits, "hit_ratio": t.hits / max(r.block_refs, 1)} for t in r.tiers
                    },
                    "saved_seconds": float(r.cost.get("saved_seconds", 0.0)),
                }
                for i, r in enumerate(self.per_instance)
            ],
            "notes": list(self.notes),
        }


def _session_of(trace: PreparedTrace, requests: Sequence[Any] | None) -> list[bytes]:
    """A stable session key per request (see the ``session`` router)."""
    out: list[bytes] = []
    root: dict[int, int] = {}
    for i, keys in enumerate(trace.keys):
        r = requests[i] if requests is not None else None
        chat = getattr(r, "chat_id", None)
        if chat is not None:
            parent = getattr(r, "parent_chat_id", None)
            top = root.get(parent, parent) if parent is not None else chat
            root[chat] = top
            out.append(b"chat:%d" % top)
        else:
            out.append(b"".join(bytes(k) for k in keys[:2]))
    return out


class _KvIndex:
    """Which instances hold which block in their primary tier, from the engines' events (KV events)."""

    def __init__(self) -> None:
        self.holders: dict[BlockKey, int] = {}

    def listener(self, i: int) -> Any:
        bit = 1 << i
        holders = self.holders

        def on_event(ev: Any) -> None:
            if (ev.kind == "stored" and ev.tier is None) or ev.kind == "promoted":
                for k in ev.keys:
                    holders[k] = holders.get(k, 0) | bit
            elif ev.kind in ("evicted", "reset"):
                for k in ev.keys:
                    m = holders.get(k, 0) & ~bit
                    if m:
                        holders[k] = m
                    else:
                        holders.pop(k, None)

        return on_event

    def prefix_lengths(self, keys: Sequence[BlockKey], n: int) -> list[int]:
        """Per instance, the length of the leading run of ``keys`` it holds."""
        out = [0] * n
        cur = (1 << n) - 1
        get = self.holders.get
        depth = 0
        for k in keys:
            nxt = cur & get(k, 0)
            if nxt != cur:
                gone = cur & ~nxt
                while gone:
                    low = gone & -gone
                    out[low.bit_length() - 1] = depth
                    gone ^= low
            cur = nxt
            if not cur:
                return out
            depth += 1
        while cur:
            low = cur & -cur
            out[low.bit_length() - 1] = depth
            cur ^= low
        return out

    def peer_run(self, keys: Sequence[BlockKey], start: int, me: int) -> int:
        """How many blocks from ``keys[start]`` on some other instance holds (a run, in order)."""
        mask = ~(1 << me)
        get = self.holders.get
        k = 0
        for key in keys[start:]:
            if not get(key, 0) & mask:
                break
            k += 1
        return k


def _pick(lengths: list[int], loads: list[int], home: int, bound: float, routed: int, margin: int) -> int:
    """The ``prefix`` router's choice: longest cached prefix among instances under the load bound.

    The session's home instance counts ``margin`` blocks more than it holds: another instance takes
    the request only when it holds a clearly longer prefix. Without that, a popular shared prefix
    (a system prompt) held longer by one instance pulls every new conversation there until the load
    bound diverts them, scattering conversations (measured on the shipped trace: 4.55 % prefix hits
    with margin 0 vs 5.15 % with 2, 8 instances at 1 %). Remaining ties go to the least loaded.
    """
    cap = bound * (routed + 1) / len(loads)
    low = min(loads)
    best = -1
    best_key: tuple[int, bool, int] = (-1, False, 0)
    for j, (length, load) in enumerate(zip(lengths, loads, strict=True)):
        if load + 1 > cap and load != low:
            continue
        key = (length + margin if j == home else length, j == home, -load)
        if key > best_key:
            best, best_key = j, key
    return best


def _shared_names(config: KvtierConfig, shared: tuple[str, ...] | None) -> tuple[list[str], bool]:
    from kvtier.plugins import tier_contexts

    names = [ctx.name for ctx in tier_contexts(config)]
    types = [tc.type for tc in config.secondary_tiers]
    p2p = "p2p" in types
    if shared is None:
        return [n for n, t in zip(names, types, strict=True) if t in DEFAULT_SHARED_TYPES], p2p
    unknown = [s for s in shared if s not in names]
    if unknown:
        raise ConfigError(
            "--shared-tiers",
            f"no secondary tier named {unknown[0]!r}; the config has {', '.join(names) or 'none'}",
        )
    return list(shared), p2p


def simulate_fleet(
    trace: PreparedTrace,
    config: KvtierConfig,
    spec: FleetSpec,
    *,
    requests: Sequence[Any] | None = None,
    cost_model: CostModel | None = None,
) -> FleetReport:
    """Replay ``trace`` through ``spec.instances`` simulate engines built from ``config``.

    ``requests`` (the :class:`~kvtier.sim.trace.TraceRequest` list the trace was prepared from) lets
    the ``session`` router use conversation ids. Raises :class:`ConfigError` on a bad spec.
    """
    from kvtier.engine import Engine, RequestContext
    from kvtier.sim.simtier import sim_tiers

    spec.check()
    n = spec.instances
    shared, p2p = _shared_names(config, spec.shared)
    p2p = p2p if spec.p2p is None else spec.p2p
    # The p2p tier is modelled from the peers' primaries (module docstring), not by its hook.
    kept = tuple(tc for tc in config.secondary_tiers if tc.type != "p2p")
    config = dataclasses.replace(config, primary_backing="none", metrics_port=None, secondary_tiers=kept)
    from kvtier.plugins import tier_contexts

    tier_names = [ctx.name for ctx in tier_contexts(config)]
    is_shared = [name in shared for name in tier_names]
    shared_factories = sim_tiers(config)  # built once: their policies are the shared contents
    now = [0.0]
    engines: list[Any] = []
    index = _KvIndex()
    try:
        for i in range(n):
            own = sim_tiers(config)
            facs = [s if sh else o for s, o, sh in zip(shared_factories, own, is_shared, strict=True)]
            eng = Engine(config, clock=lambda: now[0], tiers=facs)
            eng.subscribe(index.listener(i))
            engines.append(eng)
        media = {t.name: t.medium for t in engines[0].tiers}
        cm = cost_model or CostModel.from_config(config, tier_media=media)
        p2p_cost = cm.tiers.get("p2p", DEFAULT_P2P)
        run = _FleetRun(trace, spec, engines, index, cm, p2p_cost if p2p else None, shared, config, requests)
        for r, (keys, infos, last, ts, tenant) in enumerate(
            zip(trace.keys, trace.infos, trace.last_tokens, trace.timestamps, trace.tenants, strict=True)
        ):
            if keys:
                now[0] = ts
                run.serve(run.route(r, keys), keys, infos, last, ts, RequestContext, tenant)
        return run.finish()
    finally:
        for eng in engines:
            eng.close()


@dataclass
class _FleetRun:
    """One fleet replay in progress: the router's state, each instance's report, costs and counts,
    and the shared tiers' (and p2p) traffic per window of the trace clock."""

    trace: PreparedTrace
    spec: FleetSpec
    engines: list[Any]
    index: _KvIndex
    cm: CostModel
    #: The peers' load speed; ``None``: the fleet does not load from peers.
    p2p: TierCost | None
    shared: list[str]
    config: InitVar[KvtierConfig]
    requests: InitVar[Sequence[Any] | None]

    def __post_init__(self, config: KvtierConfig, requests: Sequence[Any] | None) -> None:
        from kvtier.sim.replay_loops import _Cost

        trace, engines = self.trace, self.engines
        n = len(engines)
        self.tiers = [list(e.tiers) for e in engines]
        self.names = [t.name for t in self.tiers[0]]
        self.shared_idx = [j for j, nm in enumerate(self.names) if nm in self.shared]
        policy, slots = config.eviction_policy, int(engines[0].num_slots)
        self.reports = [ReplayReport(trace.name, "simulate", policy, slots) for _ in engines]
        self.costs = [_Cost(self.cm, self.names) for _ in engines]
        self.loads = [0] * n
        self.computed = [0] * n
        self.p2p_hits = 0
        self.p2p_saved = 0.0
        # Windows span the trace's clock from its earliest to its latest request (a trace need not be
        # sorted; the engines see the timestamps as given).
        self.ts0 = min(trace.timestamps) if trace.timestamps else 0.0
        self.ts1 = max(trace.timestamps) if trace.timestamps else 0.0
        nwin = int((self.ts1 - self.ts0) // self.spec.window_seconds) + 1
        self.traffic = {name: np.zeros(nwin) for name in [*self.shared, *(["p2p"] if self.p2p else [])]}
        self.sessions = _session_of(trace, requests) if self.spec.router != "round_robin" else None
        self.contexts: dict[str | None, Any] = {}
        self.routed = 0

    def route(self, r: int, keys: list[BlockKey]) -> int:
        """The instance request ``r`` goes to (see the routers in the module docstring)."""
        n, spec = len(self.engines), self.spec
        if n == 1:
            i = 0
        elif spec.router == "round_robin":
            i = self.routed % n
        else:
            assert self.sessions is not None
            home = int.from_bytes(hashlib.blake2b(self.sessions[r], digest_size=8).digest(), "little") % n
            if spec.router == "session":
                i = home
            else:
                lengths = self.index.prefix_lengths(keys, n)
                i = _pick(lengths, self.loads, home, 1.0 + spec.imbalance, self.routed, spec.margin)
        self.routed += 1
        self.loads[i] += 1
        return i

    def serve(
        self, i: int, keys: list[BlockKey], infos: Any, last: int, ts: float, ctx_cls: Any, tenant: str | None
    ) -> None:
        """One request on instance ``i``: its own lookup and stores, then p2p hits and traffic."""
        from kvtier.sim.replay_loops import lookup_step, store_step

        tpb = self.trace.tokens_per_block
        eng, tiers, rep = self.engines[i], self.tiers[i], self.reports[i]
        ctx = self.contexts.get(tenant)
        if ctx is None:
            ctx = self.contexts[tenant] = ctx_cls(tenant=tenant)
        before = [tiers[j].stats.bytes_read + tiers[j].stats.bytes_written for j in self.shared_idx]
        codes, hits, plen = lookup_step(eng, tiers, self.names, self.costs[i], rep, keys, last, ctx, tpb)
        nk = len(keys)
        rep.block_refs += nk
        rep.tokens += (nk - 1) * tpb + last
        # Peers are asked before the instance stores its misses (it then holds them too).
        k = self.index.peer_run(keys, plen, i) if self.p2p is not None and plen < nk else 0
        store_step(eng, tiers, keys, infos, codes, hits, plen, ctx)
        w = int((ts - self.ts0) // self.spec.window_seconds)
        if k:
            self._p2p_hits(rep, k, last if plen + k == nk else tpb, w)
        for j, b in zip(self.shared_idx, before, strict=True):
            t = tiers[j]
            self.traffic[self.names[j]][w] += t.stats.bytes_read + t.stats.bytes_written - b
        self.computed[i] += (nk - plen - k) * tpb

    def _p2p_hits(self, rep: ReplayReport, k: int, last: int, w: int) -> None:
        """Count ``k`` blocks loaded from a peer (the last holding ``last`` tokens) in window ``w``."""
        assert self.p2p is not None
        tpb = self.trace.tokens_per_block
        toks = k * tpb - (tpb - last)
        self.p2p_hits += k
        self.p2p_saved += max(
            0.0, self.cm.recompute_seconds(k, toks) - self.p2p.load_seconds(k * self.cm.block_bytes)
        )
        rep.prefix_hits += k
        rep.prefix_token_hits += toks
        self.traffic["p2p"][w] += k * self.cm.block_bytes

    def finish(self) -> FleetReport:
        """Drain every instance and put the fleet's report together."""
        from kvtier.sim.replay import _fill_tiers

        trace, win = self.trace, self.spec.window_seconds
        types = {"primary": "primary/none", **{nm: "simulated" for nm in self.names}}
        for eng, rep, cost, load in zip(self.engines, self.reports, self.costs, self.loads, strict=True):
            eng.drain()
            eng.poll()
            rep.cost = cost.as_dict(rep.tokens)
            _fill_tiers(rep, eng.stats(), types)
            rep.requests = load
        report = FleetReport(
            trace=trace.name,
            router=self.spec.router,
            shared_tiers=list(self.shared),
            p2p=self.p2p is not None,
            block_refs=trace.block_refs,
            tokens=trace.tokens,
            computed_tokens=self.computed,
            per_instance=self.reports,
            traffic={name: _traffic(v, win) for name, v in self.traffic.items()},
            saved_seconds=sum(float(c.saved) for c in self.costs) + self.p2p_saved,
            prefill_seconds=self.cm.recompute_seconds(0, trace.tokens),
            trace_seconds=max(self.ts1 - self.ts0, win),
            p2p_hits=self.p2p_hits,
        )
        if self.p2p is not None:
            report.notes.append(
                "p2p hits: blocks after an instance's leading hits that a peer holds in its primary"
            )
        return report


def _traffic(per_window: np.ndarray, win: float) -> dict[str, float]:
    """Bytes per second of one tier's traffic: mean over the trace, p99 and peak over windows."""
    return {
        "mean": float(per_window.sum() / (len(per_window) * win)),
        "p99": float(np.percentile(per_window / win, 99)),
        "peak": float(per_window.max() / win),
        "total_bytes": float(per_window.sum()),
    }


def fleet_tables(report: FleetReport) -> list[Any]:
    """The fleet report as printable tables (``kvtier replay --simulate --instances N``)."""
    from kvtier.tables import TextTable

    refs = max(report.block_refs, 1)
    head = TextTable("Fleet", ["", ""], show_header=False)
    head.add_row("trace", f"{report.trace}: {report.block_refs:,} block refs")
    head.add_row("instances / router", f"{report.instances} / {report.router}")
    head.add_row("shared tiers", ", ".join(report.shared_tiers) or "none")
    head.add_row("p2p", "yes" if report.p2p else "no")
    hr = report.hit_ratio
    head.add_row("hit ratio block / prefix", f"{100 * hr['block']:.2f}% / {100 * hr['prefix']:.2f}%")
    for name, h in report.tier_hits.items():
        head.add_row(f"  {name} hits", f"{h:,} ({100 * h / refs:.2f}%)")
    imb = report.imbalance
    head.add_row(
        "imbalance requests / tokens", f"{imb['requests']:.3f} / {imb['computed_tokens']:.3f} (max/mean)"
    )
    head.add_row("prefill saved", f"{report.saved_seconds:,.1f} s of {report.prefill_seconds:,.1f} s")
    for name, t in report.traffic.items():
        head.add_row(
            f"{name} traffic mean / p99 / peak",
            f"{t['mean'] / 1e6:,.2f} / {t['p99'] / 1e6:,.2f} / {t['peak'] / 1e6:,.2f} MB/s",
        )
    names = [t.name for t in report.per_instance[0].tiers] if report.per_instance else []
    per = TextTable(
        "Per instance",
        ["#", "requests", "block refs", "prefix hits", *[f"{n} hits" for n in names]],
        right=frozenset({"requests", "block refs"}),
    )
    for i, r in enumerate(report.per_instance):
        cells = [f"{100 * t.hits / max(r.block_refs, 1):.2f}%" for t in r.tiers]
        per.add_row(
            i, f"{report.requests[i]:,}", f"{r.block_refs:,}", f"{100 * r.hit_ratio['prefix']:.2f}%", *cells
        )
    return [head, per]
