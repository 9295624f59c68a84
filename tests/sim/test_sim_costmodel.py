"""Cost model: linear load-vs-recompute decisions, config parsing, bench reports."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import load_config
from kvtier.costmodel import CostModel, TierCost, measure_prefill
from kvtier.errors import ConfigError


def _model(prefill: float = 1e-4, bw: float = 1e9, lat: float = 1e-3, block: int = 1 << 20) -> CostModel:
    return CostModel(prefill, 512, block, {"fs0": TierCost("fs0", bw, lat)})


def test_defaults_from_empty_config() -> None:
    cm = CostModel.from_config(load_config({"block_bytes": 4096}), tier_media={"fs0": "STORAGE"})
    assert cm.block_bytes == 4096
    assert cm.tier("primary").source == "default"
    assert cm.tier("fs0").source == "default"
    # Default figures make a local disk worth loading from for one small block.
    assert cm.should_load("fs0", 1)


def test_min_blocks_matches_brute_force() -> None:
    cm = _model(prefill=1e-5, bw=1e9, lat=5e-3)
    n = cm.min_blocks_to_load("fs0")
    assert n is not None
    assert cm.load_seconds("fs0", n) < cm.recompute_seconds(n)
    assert n == 2
    assert cm.load_seconds("fs0", n - 1) >= cm.recompute_seconds(n - 1)


def test_tier_slower_than_recompute_is_never_loaded() -> None:
    # 1 MiB per block at 1 MB/s is ~1 s per block; prefill is 512 * 1e-4 = 51 ms per block.
    cm = _model(bw=1e6, lat=0.0)
    assert cm.min_blocks_to_load("fs0") is None
    assert not cm.should_load("fs0", 10_000)
    assert cm.saving_seconds("fs0", 3) == 0.0


@settings(max_examples=100, deadline=None)
@given(
    prefill=st.floats(1e-7, 1e-2),
    bw=st.floats(1e6, 1e11),
    lat=st.floats(0.0, 1e-1),
    n=st.integers(1, 5000),
)
def test_should_load_agrees_with_direct_comparison(prefill: float, bw: float, lat: float, n: int) -> None:
    cm = _model(prefill, bw, lat)
    direct = cm.load_seconds("fs0", n) < cm.recompute_seconds(n)
    # Floating point at the exact break-even point may round either way; away from it they agree.
    gap = abs(cm.load_seconds("fs0", n) - cm.recompute_seconds(n))
    if gap > 1e-9 * max(1.0, cm.recompute_seconds(n)):
        assert cm.should_load("fs0", n) == direct
    assert cm.saving_seconds("fs0", n) >= 0.0


def test_config_keys_and_sizes() -> None:
    cfg = load_config(
        {
            "block_bytes": 4096,
            "cost_model": {
                "prefill_tokens_per_second": 20000,
                "tokens_per_block": 256,
                "kv_bytes_per_token": "128KiB",
                "tiers": {"fs0": {"load_bandwidth": "2GB", "load_latency": 0.0002}},
            },
        }
    )
    cm = CostModel.from_config(cfg)
    assert math.isclose(cm.prefill_seconds_per_token, 5e-5)
    assert cm.block_bytes == 256 * 128 * 1024
    assert cm.tier("fs0").load_bandwidth == 2e9
    assert cm.tier("fs0").source == "config"
    assert cm.as_dict()["tiers"]["fs0"]["min_blocks_to_load"] == cm.min_blocks_to_load("fs0")


@pytest.mark.parametrize(
    ("cost", "key"),
    [
        ({"prefil_seconds_per_token": 1}, "cost_model.prefil_seconds_per_token"),
        ({"prefill_seconds_per_token": -1}, "cost_model.prefill_seconds_per_token"),
        ({"tiers": {"fs0": {"load_bandwidth": "fast"}}}, "cost_model.tiers.fs0.load_bandwidth"),
        ({"tiers": {"fs0": {"latency": 1}}}, "cost_model.tiers.fs0.latency"),
        ({"bench_file": "/nonexistent/bench.json"}, "cost_model.bench_file"),
    ],
)
def test_bad_config_names_the_key(cost: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        CostModel.from_config(load_config({"cost_model": cost}))
    assert str(info.value).startswith(key)


def test_bench_file_feeds_tier_speeds(tmp_path: Path) -> None:
    report = {"tiers": [{"name": "fs0", "load_bytes_per_s": 3e9, "load_latency_s": 1e-4}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(report))
    cm = CostModel.from_config(load_config({"cost_model": {"bench_file": str(path)}}))
    assert cm.tier("fs0").load_bandwidth == 3e9
    assert cm.tier("fs0").source == "bench"
    # Config beats bench for the same tier.
    cfg = load_config({"cost_model": {"bench_file": str(path), "tiers": {"fs0": {"load_latency": 0.5}}}})
    cm2 = CostModel.from_config(cfg)
    assert cm2.tier("fs0").load_bandwidth == 3e9 and cm2.tier("fs0").load_latency == 0.5


def test_measure_prefill_times_a_callable() -> None:
    calls: list[int] = []

    def fake_prefill(n: int) -> None:
        calls.append(n)
        sum(range(n * 10))

    per_token = measure_prefill(fake_prefill, num_tokens=1000, repeats=2)
    assert calls == [1000, 1000, 1000]
    assert 0 < per_token < 1e-3


@settings(max_examples=100, deadline=None)
@given(
    loads=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 512)), max_size=30),
    prefill=st.floats(1e-7, 1e-3),
    lat=st.floats(0.0, 1e-2),
)
def test_total_saving_is_the_sum_of_single_savings(
    loads: list[tuple[int, int]], prefill: float, lat: float
) -> None:
    cm = _model(prefill=prefill, bw=2e9, lat=lat)
    n = [a for a, _ in loads]
    toks = [a * b for a, b in loads]
    expected = sum(cm.saving_seconds("fs0", a, t) for a, t in zip(n, toks, strict=True))
    assert cm.total_saving_seconds("fs0", n, toks) == pytest.approx(expected, rel=1e-9, abs=1e-12)
