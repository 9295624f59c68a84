"""``plan_fleet()``: compare fleet designs for N instances on a trace and recommend one.

The question one level above :func:`kvtier.plan.plan`: N engine instances behind a router, each with
host RAM, maybe one shared store (``redis`` on the menu) or instance-to-instance p2p. Every design is
simulated with :func:`kvtier.sim.fleet.simulate_fleet` (the real engine per instance, the router,
shared tiers through their simulation hook) and priced with the menu:

* **storage cost** per month = N x (the per-instance RAM) + the shared store, each at its menu price
  per GiB-month (:func:`kvtier.plan.economics.storage_cost`); p2p reads the peers' RAM already paid
  for (its speed: the menu's ``p2p`` kind when given, else 2.5 GB/s and 200 us);
* **GPU value** per month = prefill seconds saved / trace seconds x GPU price x 730 h (as for one
  engine: :mod:`kvtier.plan.economics`);
* **net saving** = value - cost. The recommendation is the design with the largest net saving.

Designs (:func:`designs`): local RAM only with each router (round-robin, session affinity,
prefix-aware), RAM + a shared store (round-robin and prefix-aware) and RAM + p2p (round-robin and
prefix-aware). RAM per instance defaults to the trace's unique blocks / N x 5 % (``ram_share``) —
the fleet holds as much as one engine with 5 % would — and the shared store to 25 % of the unique
blocks (``shared_share``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtier.errors import ConfigError
from kvtier.plan.economics import GIB, storage_cost
from kvtier.plan.menu import HOURS_PER_MONTH, Menu, TierKind
from kvtier.plan.stack import Stack, stack_config
from kvtier.sim.fleet import DEFAULT_P2P, FleetReport, FleetSpec
from kvtier.sim.prepared import PreparedTrace
from kvtier.sim.trace import TraceRequest

__all__ = ["FleetDesign", "FleetPlan", "FleetPoint", "designs", "plan_fleet"]


@dataclass(frozen=True, slots=True)
class FleetDesign:
    """One fleet to simulate: RAM per instance, an optional shared store, p2p, the router."""

    label: str
    router: str
    ram_blocks: int
    shared_blocks: int = 0
    p2p: bool = False


@dataclass
class FleetPoint:
    """A simulated design with its money figures."""

    design: FleetDesign
    report: FleetReport
    storage_cost: float
    gpu_value: float
    net_saving: float
    saved_gpu_seconds_per_hour: float

    def to_json(self) -> dict[str, Any]:
        d = self.design
        return {
            "design": d.label,
            "router": d.router,
            "ram_blocks_per_instance": d.ram_blocks,
            "shared_blocks": d.shared_blocks,
            "p2p": d.p2p,
            "storage_cost_per_month": self.storage_cost,
            "gpu_value_per_month": self.gpu_value,
            "net_saving_per_month": self.net_saving,
            "gpu_seconds_saved_per_hour": self.saved_gpu_seconds_per_hour,
            **self.report.to_json(),
        }


@dataclass
class FleetPlan:
    """What :func:`plan_fleet` found; ``recommendation`` is the best point by net saving."""

    trace: str
    instances: int
    block_bytes: int
    unique_blocks: int
    trace_seconds: float
    points: list[FleetPoint]
    recommendation: FleetPoint
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The ``kvtier plan --instances N --json`` object: the plain fields as they are, the
        recommendation by its label and the points as ``designs``."""
        plain = ("trace", "instances", "block_bytes", "unique_blocks", "trace_seconds")
        return {
            **{name: getattr(self, name) for name in plain},
            "recommendation": self.recommendation.design.label,
            "designs": [p.to_json() for p in self.points],
            "notes": list(self.notes),
            "timings": self.timings,
        }


def designs(unique_blocks: int, instances: int, ram_share: float, shared_share: float) -> list[FleetDesign]:
    """The designs compared (module docstring), sized from the trace's unique blocks."""
    ram = max(1, int(unique_blocks * ram_share / instances))
    shared = max(1, int(unique_blocks * shared_share))
    out = [
        FleetDesign(f"local RAM, {r.replace('_', '-')}", r, ram) for r in ("round_robin", "session", "prefix")
    ]
    out += [
        FleetDesign(f"RAM + shared store, {r.replace('_', '-')}", r, ram, shared_blocks=shared)
        for r in ("round_robin", "prefix")
    ]
    out += [
        FleetDesign(f"RAM + p2p, {r.replace('_', '-')}", r, ram, p2p=True) for r in ("round_robin", "prefix")
    ]
    return out


def _p2p_kind(menu: Menu) -> TierKind:
    if "p2p" in menu.kinds:
        return menu.kind("p2p")
    return TierKind(
        "p2p",
        0.0,
        DEFAULT_P2P.load_bandwidth,
        DEFAULT_P2P.load_latency,
        "a peer's host RAM over 25 GbE (already paid for)",
    )


@dataclass(frozen=True)
class _Job:
    trace: PreparedTrace
    requests: Sequence[TraceRequest]
    menu: Menu
    instances: int
    kv_bytes_per_token: int
    tokens_per_block: int
    policy: str
    imbalance: float


def _simulate(job: _Job, design: FleetDesign) -> FleetReport:
    from kvtier.config import load_config
    from kvtier.sim.fleet import simulate_fleet

    sizes: list[tuple[str, int]] = [("ram", design.ram_blocks)]
    if design.shared_blocks:
        sizes.append(("redis", design.shared_blocks))
    cfg = stack_config(
        Stack(tuple(sizes)),
        job.menu,
        block_bytes=job.kv_bytes_per_token * job.tokens_per_block,
        tokens_per_block=job.tokens_per_block,
        kv_bytes_per_token=job.kv_bytes_per_token,
        policy=job.policy,
    )
    k = _p2p_kind(job.menu)
    cfg["cost_model"]["tiers"]["p2p"] = {"load_bandwidth": k.load_bandwidth, "load_latency": k.load_latency}
    spec = FleetSpec(
        instances=job.instances,
        router=design.router,
        shared=("redis",) if design.shared_blocks else (),
        imbalance=job.imbalance,
        p2p=design.p2p,
    )
    return simulate_fleet(job.trace, load_config(cfg), spec, requests=job.requests)


def plan_fleet(
    requests: Sequence[TraceRequest],
    *,
    instances: int,
    kv_bytes_per_token: int,
    tokens_per_block: int = 512,
    menu: Menu | None = None,
    name: str = "trace",
    policy: str = "lru",
    trace_seconds: float | None = None,
    ram_share: float = 0.05,
    shared_share: float = 0.25,
    imbalance: float = 0.25,
    jobs: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> FleetPlan:
    """Simulate every design of :func:`designs` for ``instances`` instances and recommend one.

    Raises :class:`ConfigError` naming the option on bad input.
    """
    from kvtier.config import load_config
    from kvtier.keys import KeyNamespace
    from kvtier.plan.planner import _trace_seconds
    from kvtier.sim.parallel import fork_map
    from kvtier.sim.prepared import prepare_trace

    t0 = time.perf_counter()
    if not requests:
        raise ConfigError("trace", "no requests to plan for")
    if not isinstance(instances, int) or not 1 <= instances <= 1024:
        raise ConfigError("--instances", f"expected 1..1024 instances, got {instances!r}")
    for opt, v in (("--ram-share", ram_share), ("--shared-share", shared_share)):
        if not 0 < v <= 1:
            raise ConfigError(opt, f"expected a share in (0, 1], e.g. 5% or 0.05; got {v!r}")
    if kv_bytes_per_token < 1:
        raise ConfigError("--kv-bytes-per-token", f"must be >= 1, got {kv_bytes_per_token}")
    menu = menu or Menu()
    menu.kind("redis")
    seconds = _trace_seconds(requests, trace_seconds)
    block_bytes = kv_bytes_per_token * tokens_per_block
    ns = KeyNamespace.from_config(load_config({"block_bytes": block_bytes}), block_size=tokens_per_block)
    trace = prepare_trace(requests, ns, name=name, tokens_per_block=tokens_per_block)
    t1 = time.perf_counter()
    todo = designs(trace.unique_blocks, instances, ram_share, shared_share)
    job = _Job(trace, requests, menu, instances, kv_bytes_per_token, tokens_per_block, policy, imbalance)

    def tick(done: int, total: int) -> None:
        if progress is not None:
            progress("fleet designs", done, total)

    reports = fork_map(_simulate, job, todo, jobs=jobs, progress=tick)
    t2 = time.perf_counter()
    points = [_price(d, r, menu, instances, block_bytes, seconds) for d, r in zip(todo, reports, strict=True)]
    best = max(points, key=lambda p: (p.net_saving, p.report.hit_ratio["prefix"]))
    plan = FleetPlan(name, instances, block_bytes, trace.unique_blocks, seconds, points, best)
    plan.notes.append(
        f"RAM per instance: {todo[0].ram_blocks:,} blocks ({100 * ram_share:g}% of the unique blocks / "
        f"{instances}); shared store: {int(trace.unique_blocks * shared_share):,} blocks "
        f"({100 * shared_share:g}%); prices and speeds from the menu"
    )
    if best.net_saving < 0:
        plan.notes.append(
            "no design pays for itself at this traffic (GPU value < storage cost): the recommendation "
            "loses least; a fleet serving more requests per second on the same capacity gains more"
        )
    plan.timings = {
        "prepare_seconds": t1 - t0,
        "simulate_seconds": t2 - t1,
        "total_seconds": time.perf_counter() - t0,
    }
    return plan


def _price(
    design: FleetDesign, report: FleetReport, menu: Menu, instances: int, block_bytes: int, seconds: float
) -> FleetPoint:
    local, _, _ = storage_cost(Stack((("ram", design.ram_blocks),)), menu, block_bytes)
    shared = 0.0
    if design.shared_blocks:
        shared, _, _ = storage_cost(Stack((("redis", design.shared_blocks),)), menu, block_bytes)
    cost = instances * local + shared
    span = max(seconds, 1e-9)
    value = report.saved_seconds / span * menu.gpu.price_per_hour * HOURS_PER_MONTH
    return FleetPoint(design, report, cost, value, value - cost, report.saved_seconds * 3600.0 / span)


def render_fleet(plan: FleetPlan, table: Callable[[str, Sequence[str], Sequence[Sequence[Any]]], None],
                 echo: Callable[[str], None] = print) -> None:  # fmt: skip
    """Print the designs compared and the recommendation."""
    echo(
        f"fleet of {plan.instances} instances on {plan.trace}: {plan.unique_blocks:,} unique blocks of "
        f"{plan.block_bytes:,} bytes, {plan.trace_seconds / 3600:.2f} h of traffic"
    )
    rows = []
    for p in plan.points:
        r = p.report
        shared = r.traffic.get("redis") or r.traffic.get("p2p")
        rows.append(
            [
                "*" if p is plan.recommendation else "",
                p.design.label,
                f"{100 * r.hit_ratio['prefix']:.2f}%",
                f"{r.imbalance['requests']:.2f}",
                f"{shared['mean'] / 1e6:,.1f} / {shared['p99'] / 1e6:,.1f}" if shared else "-",
                f"{p.saved_gpu_seconds_per_hour:,.0f}",
                f"${p.storage_cost:,.2f}",
                f"${p.net_saving:,.2f}",
            ]
        )
    table(
        "Fleet designs (simulated)",
        ["", "design", "prefix hits", "imbalance", "shared MB/s mean / p99", "GPU s saved/h", "storage $/mo",
         "net $/mo"],
        rows,
    )  # fmt: skip
    rec = plan.recommendation
    echo(f"recommended: {rec.design.label} (net saving ${rec.net_saving:,.2f}/month)")
    for n in plan.notes:
        echo(f"note: {n}")


def plot_fleet(plan: FleetPlan, path: str) -> None:
    """A bar chart of net saving and prefix hit ratio per design (PNG)."""
    from kvtier.sim.plot import pyplot

    plt = pyplot()
    labels = [p.design.label for p in plan.points]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ys = [p.net_saving for p in plan.points]
    colors = ["tab:orange" if p is plan.recommendation else "tab:blue" for p in plan.points]
    ax.barh(labels, ys, color=colors)
    ax.set_xlabel("net saving, $ per month (GPU value - storage)")
    for y, p in enumerate(plan.points):
        ax.text(0, y, f" {100 * p.report.hit_ratio['prefix']:.1f}% prefix hits", va="center", fontsize=8)
    ax.set_title(f"{plan.trace}: {plan.instances} instances, {plan.block_bytes / GIB * 1024:.0f} MiB blocks")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
