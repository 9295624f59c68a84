"""Fleet simulation (kvtier.sim.fleet): N real simulate-mode engines behind a router.

* one instance is the single-engine simulation, decision for decision (with and without a tier);
* prefix-aware routing gives more hits than round-robin on the shipped trace;
* a shared tier's contents are shared (a block one instance stored is a hit on another), p2p hits
  are blocks a peer holds, and the router's KV index (fed by the engines' events) always equals what
  the instances' primary tiers hold;
* the prefix router keeps its load bound; bad specs are one-line errors naming the option.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import load_config
from kvtier.errors import ConfigError
from kvtier.keys import KeyNamespace
from kvtier.sim.defaults import shipped_trace
from kvtier.sim.fleet import FleetSpec, simulate_fleet
from kvtier.sim.prepared import PreparedTrace, prepare_trace
from kvtier.sim.replay import replay
from kvtier.sim.sweep import capacity_config
from kvtier.sim.trace import TraceRequest, read_trace

SIM = load_config({"block_bytes": 4096, "primary_backing": "none"})
NS = KeyNamespace.from_config(SIM, block_size=512)


@cache
def _shipped(limit: int | None = None) -> tuple[list[TraceRequest], PreparedTrace]:
    with shipped_trace() as path:
        reqs = read_trace(path, limit=limit)
    return reqs, prepare_trace(reqs, NS, name=path.name)


def _with_fs(tmp: Path, blocks: int, fs_blocks: int, name: str = "fs0") -> object:
    return load_config(
        {
            "block_bytes": 4096,
            "primary_backing": "none",
            "cpu_bytes_to_use": blocks * 4096,
            "secondary_tiers": [
                {"type": "fs", "name": name, "root_dir": str(tmp / name), "max_bytes": fs_blocks * 8192}
            ],
        }
    )


@pytest.mark.parametrize("policy", ["lru", "sieve", "arc"])
def test_one_instance_equals_single_engine_primary_only(policy: str) -> None:
    reqs, trace = _shipped(3000)
    cfg = capacity_config(SIM, 700, policy)
    single = replay(trace, cfg, simulate=True)
    fleet = simulate_fleet(trace, cfg, FleetSpec(instances=1), requests=reqs)
    inst = fleet.per_instance[0]
    assert (inst.block_hits, inst.prefix_hits, inst.token_hits, inst.prefix_token_hits) == (
        single.block_hits, single.prefix_hits, single.token_hits, single.prefix_token_hits,
    )  # fmt: skip
    assert inst.tiers[0].evictions == single.tiers[0].evictions
    assert inst.tiers[0].hits == single.tiers[0].hits
    assert fleet.block_hits == single.block_hits and fleet.prefix_hits == single.prefix_hits
    # Same cost model, summed per request here and vectorised there: equal up to rounding.
    assert fleet.saved_seconds == pytest.approx(single.cost["saved_seconds"], rel=1e-12)


def test_one_instance_equals_single_engine_with_a_tier(tmp_path: Path) -> None:
    _, trace = _shipped(2000)
    cfg = _with_fs(tmp_path, 200, 2000)
    single = replay(trace, cfg, simulate=True)
    fleet = simulate_fleet(trace, cfg, FleetSpec(instances=1, shared=()))
    inst = fleet.per_instance[0]
    assert [(t.name, t.hits, t.evictions) for t in inst.tiers] == [
        (t.name, t.hits, t.evictions) for t in single.tiers
    ]
    assert (inst.block_hits, inst.prefix_hits) == (single.block_hits, single.prefix_hits)
    assert fleet.saved_seconds == pytest.approx(single.cost["saved_seconds"], rel=1e-12)


def test_prefix_routing_beats_round_robin_on_the_shipped_trace() -> None:
    reqs, trace = _shipped()
    cfg = capacity_config(SIM, trace.unique_blocks // 100 // 8, "lru")  # the fleet holds 1 %
    rr = simulate_fleet(trace, cfg, FleetSpec(instances=8, router="round_robin"), requests=reqs)
    px = simulate_fleet(trace, cfg, FleetSpec(instances=8, router="prefix"), requests=reqs)
    assert px.block_hits > rr.block_hits and px.prefix_hits > rr.prefix_hits
    assert sum(px.requests) == sum(rr.requests) == trace.requests
    assert px.imbalance["requests"] <= 1.25 + 8 / trace.requests


def _tiny(blocks_per_request: list[tuple[int, ...]]) -> PreparedTrace:
    reqs = [TraceRequest(timestamp_ms=1000.0 * i, blocks=b) for i, b in enumerate(blocks_per_request)]
    return prepare_trace(reqs, NS)


def test_shared_tier_is_shared_and_p2p_reads_peers(tmp_path: Path) -> None:
    trace = _tiny([(1, 2, 3), (1, 2, 3)])
    cfg = _with_fs(tmp_path, 8, 100, name="store")
    shared = simulate_fleet(trace, cfg, FleetSpec(instances=2, router="round_robin", shared=("store",)))
    # Request 2 goes to instance 1, whose primary is empty: all 3 blocks come from the shared store.
    assert shared.per_instance[1].tiers[1].hits == 3 and shared.tier_hits["store"] == 3
    assert shared.traffic["store"]["total_bytes"] > 0
    local = simulate_fleet(trace, cfg, FleetSpec(instances=2, router="round_robin", shared=()))
    assert local.block_hits == 0  # each instance has its own store: nothing to find
    p2p = simulate_fleet(
        trace, capacity_config(SIM, 8), FleetSpec(instances=2, router="round_robin", p2p=True)
    )
    assert p2p.tier_hits["p2p"] == 3 and p2p.prefix_hits == 3
    assert p2p.traffic["p2p"]["total_bytes"] == 3 * p2p.per_instance[0].cost["model"]["block_bytes"]
    pref = simulate_fleet(trace, capacity_config(SIM, 8), FleetSpec(instances=2, router="prefix"))
    assert pref.requests == [2, 0] or pref.requests == [1, 1]
    assert pref.block_hits == (3 if pref.requests == [2, 0] else 0)


requests_st = st.lists(
    st.tuples(st.integers(0, 6), st.integers(1, 8)),  # (conversation, turns so far): chained prefixes
    min_size=1,
    max_size=60,
)


@settings(max_examples=30, deadline=None)
@given(
    convs=requests_st,
    n=st.integers(1, 5),
    cap=st.integers(1, 12),
    imbalance=st.sampled_from([0.0, 0.25, 1.0]),
)
def test_router_index_matches_primaries_and_load_bound_holds(
    convs: list[tuple[int, int]], n: int, cap: int, imbalance: float
) -> None:
    from kvtier.sim import fleet as fleet_mod

    trace = _tiny([tuple(c * 100 + j for j in range(t)) for c, t in convs])
    seen: list[object] = []
    real_finish = fleet_mod._FleetRun.finish

    def spy(run: fleet_mod._FleetRun) -> fleet_mod.FleetReport:
        out = real_finish(run)
        seen.append((run.engines, run.index))
        held: dict[object, int] = {}
        for i, eng in enumerate(run.engines):
            for key in eng.primary.index:
                held[key] = held.get(key, 0) | (1 << i)
        assert held == run.index.holders
        return out

    fleet_mod._FleetRun.finish = spy  # type: ignore[method-assign]
    try:
        rep = simulate_fleet(trace, capacity_config(SIM, cap), FleetSpec(instances=n, imbalance=imbalance))
    finally:
        fleet_mod._FleetRun.finish = real_finish  # type: ignore[method-assign]
    assert seen
    assert sum(rep.requests) == trace.requests
    # Bounded load: no instance ever exceeds (1 + imbalance) x the mean, rounded up by one request.
    assert max(rep.requests) <= (1 + imbalance) * trace.requests / n + 1


@pytest.mark.parametrize(
    ("spec", "option"),
    [
        (FleetSpec(instances=0), "--instances"),
        (FleetSpec(instances=2, router="random"), "--router"),
        (FleetSpec(instances=2, imbalance=float("nan")), "--imbalance"),
        (FleetSpec(instances=2, shared=("nope",)), "--shared-tiers"),
    ],
)
def test_bad_specs_name_the_option(spec: FleetSpec, option: str) -> None:
    with pytest.raises(ConfigError) as err:
        simulate_fleet(_tiny([(1,)]), capacity_config(SIM, 4), spec)
    assert option in str(err.value)


def test_cli_replay_instances_json_and_errors() -> None:
    cmd = [sys.executable, "-m", "kvtier.cli.main", "replay", "--simulate", "--instances", "2", "--router",
           "session", "--capacity", "300", "--limit", "800", "--json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["instances"] == 2 and out["router"] == "session" and len(out["per_instance"]) == 2
    assert sum(p["requests"] for p in out["per_instance"]) == 800
    bad = subprocess.run(
        [*cmd[:4], "--instances", "2"], capture_output=True, text=True, timeout=240, check=False
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--instances" in bad.stderr


def test_traffic_windows_hold_every_byte_even_unsorted(tmp_path: Path) -> None:
    reqs = [
        TraceRequest(timestamp_ms=ms, blocks=b) for ms, b in [(5000.0, (1, 2)), (0.0, (1, 2)), (2500.0, (3,))]
    ]
    trace = prepare_trace(reqs, NS)
    rep = simulate_fleet(trace, _with_fs(tmp_path, 8, 100, name="store"),
                         FleetSpec(instances=2, router="round_robin", shared=("store",)))  # fmt: skip
    t = rep.traffic["store"]
    moved = sum(_bytes(r) for r in rep.per_instance)
    assert t["total_bytes"] == moved > 0
    assert rep.trace_seconds == 5.0
    assert t["peak"] >= t["p99"] >= 0 and t["mean"] == pytest.approx(moved / 6.0)


def _bytes(rep: object) -> int:
    tier = rep.tiers[1]  # type: ignore[attr-defined]
    return int(tier.bytes_read + tier.bytes_written)
