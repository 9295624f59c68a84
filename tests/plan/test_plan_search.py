"""The planner's answer: a simulated stack whose hit ratios ``replay --simulate`` reproduces exactly,
right for each objective, on a prefix of the shipped trace (whole-trace runs: tests/cli)."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.config import load_config
from kvtier.errors import ConfigError
from kvtier.keys import KeyNamespace
from kvtier.plan import PlanResult, plan
from kvtier.plan.economics import Economics
from kvtier.plan.points import Point
from kvtier.plan.search import Objective, pareto_front
from kvtier.plan.stack import Stack
from kvtier.sim.defaults import shipped_trace
from kvtier.sim.prepared import prepare_trace
from kvtier.sim.replay import replay
from kvtier.sim.trace import TraceRequest, read_trace

KV = 131072  # Llama-3-8B, bf16


@functools.cache
def _requests(limit: int = 1500) -> tuple[TraceRequest, ...]:
    with shipped_trace() as p:
        return tuple(read_trace(p, limit=limit))


@functools.cache
def _plan(target: float | None = None, budget: float | None = None, jobs: int = 2) -> PlanResult:
    return plan(list(_requests()), kv_bytes_per_token=KV, target_hit=target, budget=budget, jobs=jobs,
                simulations=4, refine=2)  # fmt: skip


def _replayed(result: PlanResult) -> object:
    assert result.config is not None
    cfg = load_config(result.config)
    ns = KeyNamespace.from_config(cfg, block_size=512)
    return replay(prepare_trace(list(_requests()), ns, name="t"), cfg, simulate=True)


def test_recommendation_equals_replay_simulate_exactly() -> None:
    r = _plan()
    rec = r.recommendation
    assert rec is not None and rec.source == "simulated"
    rep = _replayed(r)
    assert rec.hit_ratio == rep.hit_ratio  # type: ignore[attr-defined]
    tiers = {("ram" if t.name == "primary" else t.name): t.hits for t in rep.tiers}  # type: ignore[attr-defined]
    assert rec.tier_hits == tiers
    assert rec.econ.saved_seconds == rep.cost["saved_seconds"]  # type: ignore[attr-defined]
    # The answer maximises net saving among the simulated stacks and sits on their Pareto front.
    assert rec.econ.net_saving == max(p.econ.net_saving for p in r.simulated)
    assert rec.stack in {p.stack for p in pareto_front(r.simulated)}


def test_parallel_and_serial_runs_agree() -> None:
    a, b = _plan(jobs=2), _plan(jobs=1)
    assert [(p.stack, p.hit_ratio) for p in a.simulated] == [(p.stack, p.hit_ratio) for p in b.simulated]


def test_target_hit_gives_the_cheapest_simulated_stack_reaching_it() -> None:
    r = _plan(target=0.25)
    rec = r.recommendation
    assert rec is not None and rec.block_hit >= 0.25
    reaching = [p for p in r.simulated if p.block_hit >= 0.25]
    assert rec.econ.storage_cost == min(p.econ.storage_cost for p in reaching)
    unreachable = _plan(target=0.99)
    assert unreachable.recommendation is None and unreachable.config is None
    assert any("not reached" in n for n in unreachable.notes)


def test_budget_caps_storage_cost() -> None:
    r = _plan(budget=100.0)
    rec = r.recommendation
    assert rec is not None and rec.econ.storage_cost <= 100.0
    within = [p for p in r.simulated if p.econ.storage_cost <= 100.0]
    assert rec.econ.net_saving == max(p.econ.net_saving for p in within)


def test_tiers_that_never_pay_are_left_out_with_a_note() -> None:
    r = _plan()
    assert "s3" not in r.kinds and any(n.startswith("s3 left out") for n in r.notes)
    # Every stack the search kept has each secondary tier larger than the tiers above it.
    for p in r.estimates:
        sizes = [b for _, b in p.stack.sizes if b > 0]
        assert all(b > max(sizes[:i]) for i, b in enumerate(sizes) if i > 0)


def test_bad_options_are_named() -> None:
    reqs = list(_requests(10))
    with pytest.raises(ConfigError, match=r"--tiers.*starts with ram"):
        plan(reqs, kv_bytes_per_token=KV, kinds=["nvme"])
    with pytest.raises(ConfigError, match=r"--tiers.*unknown tier kind 'tape'"):
        plan(reqs, kv_bytes_per_token=KV, kinds=["ram", "tape"])
    with pytest.raises(ConfigError, match=r"--target-hit"):
        plan(reqs, kv_bytes_per_token=KV, target_hit=1.5)
    with pytest.raises(ConfigError, match=r"not both"):
        plan(reqs, kv_bytes_per_token=KV, target_hit=0.2, budget=5)
    with pytest.raises(ConfigError, match=r"--trace-seconds"):
        plan([TraceRequest(5.0, (1, 2))], kv_bytes_per_token=KV)


def test_turns_are_reported_for_conversation_traces() -> None:
    reqs = [TraceRequest(1000.0 * i, tuple(range(i % 7 + 3)), input_length=16 * (i % 7 + 3), chat_id=i,
                         turn=1 + i % 3) for i in range(300)]  # fmt: skip
    r = plan(reqs, kv_bytes_per_token=KV, tokens_per_block=16, jobs=1, simulations=2, refine=1)
    assert [t["turn"] for t in r.per_turn] == [1, 2, 3]
    assert sum(t["requests"] for t in r.per_turn) == 300
    assert all(0.0 <= t["hit_ratio"] <= 1.0 for t in r.per_turn)


def _point(cost: float, value: float, hit: float = 0.1) -> Point:
    econ = Economics(cost, {}, {}, 0.0, 1.0, 0.0, value, value - cost)
    return Point(Stack((("ram", int(cost * 1000) + 1),)), "simulated", {"block": hit}, {}, econ, 1)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=30))
def test_pareto_front_is_exactly_the_undominated_points(pairs: list[tuple[int, int]]) -> None:
    points = [_point(float(c), float(v)) for c, v in pairs]
    front = pareto_front(points)
    front_pairs = {(p.econ.storage_cost, p.econ.gpu_value) for p in front}
    for p in points:
        c, v = p.econ.storage_cost, p.econ.gpu_value
        dominated = any((q.econ.storage_cost <= c and q.econ.gpu_value > v) or
                        (q.econ.storage_cost < c and q.econ.gpu_value >= v) for q in points)  # fmt: skip
        assert ((c, v) in front_pairs) == (not dominated)
    costs = [p.econ.storage_cost for p in front]
    assert costs == sorted(costs)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50), st.floats(0, 1)), min_size=1, max_size=20),
       st.floats(0.01, 0.99))  # fmt: skip
def test_objective_picks_the_cheapest_reaching_the_target(
    rows: list[tuple[int, int, float]], target: float
) -> None:
    points = [_point(float(c), float(v), h) for c, v, h in rows]
    obj = Objective.make(target, None)
    best = sorted(points, key=obj.key)[0]
    reaching = [p for p in points if p.block_hit >= target]
    if reaching:
        assert obj.feasible(best) and best.econ.storage_cost == min(p.econ.storage_cost for p in reaching)
    else:
        assert not obj.feasible(best)
