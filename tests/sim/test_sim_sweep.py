"""Capacity parsing and sweeps (simulate mode through the engine, OPT, infinite ceiling)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import load_config
from kvtier.errors import ConfigError
from kvtier.keys import KeyNamespace
from kvtier.sim.replay import prepare_trace
from kvtier.sim.sweep import Capacity, capacity_config, parse_capacities, parse_capacity, sweep
from kvtier.sim.trace import TraceRequest

SIM = load_config({"block_bytes": 4096, "primary_backing": "none"})


@pytest.mark.parametrize(
    ("text", "blocks"),
    [("1%", 1827), ("5%", 9139), ("10%", 18279), ("25%", 45697), ("50%", 91395), ("12.5%", 22848),
     ("1827", 1827), ("64MiB", 16384), ("8MB", 1953)],
)  # fmt: skip
def test_capacity_forms_match_the_readme_rounding(text: str, blocks: int) -> None:
    assert parse_capacity(text, 182_790, 4096).blocks == blocks


@pytest.mark.parametrize("text", ["0%", "0", "abc", "1x%", "100B", "-5%"])
def test_bad_capacity_is_config_error_naming_the_option(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_capacity(text, 182_790, 4096)
    assert str(info.value).startswith("--capacity")


def test_parse_capacities_keeps_order() -> None:
    caps = parse_capacities("5%, 1%,100", 1000, 4096)
    assert caps == [Capacity("5%", 50), Capacity("1%", 10), Capacity("100", 100)]
    with pytest.raises(ConfigError):
        parse_capacities(" , ", 1000, 4096)


def test_capacity_config_sets_slots_and_policy() -> None:
    cfg = capacity_config(SIM, 123, "sieve")
    assert cfg.num_primary_slots == 123 and cfg.eviction_policy == "sieve"


def _trace(n: int = 400) -> list[TraceRequest]:
    # Conversations of growing prefixes over a working set larger than the small capacities.
    return [
        TraceRequest(float(i), tuple((i % 37) * 1000 + j for j in range(1 + (i // 37) % 8))) for i in range(n)
    ]


@settings(max_examples=10, deadline=None)
@given(seed_caps=st.lists(st.integers(2, 60), min_size=1, max_size=3, unique=True))
def test_sweep_points_are_bounded_by_opt_and_ceiling(seed_caps: list[int]) -> None:
    trace = prepare_trace(_trace(), KeyNamespace.from_config(SIM, block_size=512))
    caps = [Capacity(str(c), c) for c in seed_caps]
    result = sweep(trace, SIM, caps, ["lru", "sieve"])
    ceiling = result.infinite["block"]
    for cap in caps:
        assert result.opt[cap.label] <= ceiling + 1e-12
        for pol in ("lru", "sieve"):
            rep = result.reports[(cap.label, pol)]
            assert rep.mode == "simulate" and rep.capacity_blocks == cap.blocks
            assert rep.policy == pol
            assert rep.opt == {"block": result.opt[cap.label]}
            assert rep.hit_ratio["block"] <= ceiling + 1e-12
    js = result.to_json()
    assert len(js) == 2 * len(caps) and {p["capacity"] for p in js} == {c.label for c in caps}
    curves, opt = result.curves()
    assert set(curves) == {"lru", "sieve"} and len(opt) == len(caps)


def test_opt_grows_with_capacity_and_reaches_ceiling() -> None:
    trace = prepare_trace(_trace(), KeyNamespace.from_config(SIM, block_size=512))
    caps = [Capacity(str(c), c) for c in (4, 16, 64, 1000)]
    result = sweep(trace, SIM, caps, ["lru"])
    opts = [result.opt[c.label] for c in caps]
    assert opts == sorted(opts)
    assert opts[-1] == pytest.approx(result.infinite["block"])
    lru = [result.reports[(c.label, "lru")].hit_ratio["block"] for c in caps]
    assert lru[-1] == pytest.approx(result.infinite["block"])
