"""The cost arithmetic on a hand-computed case, and the menu overrides it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.plan.economics import economics
from kvtier.plan.menu import Menu, load_menu, menu_from_mapping
from kvtier.plan.stack import Stack, stack_config


def test_hand_computed_stack() -> None:
    # Blocks of 64 MiB (512 tokens x 128 KiB). RAM: 16 blocks = 1 GiB exactly (row stride = block).
    # NVMe: 160 block files of 64 MiB + a 4 KiB header = 10 GiB + 640 KiB.
    menu = load_menu(None)  # defaults: ram $4/GiB-month, nvme $0.10, GPU $2.50/hour
    block = 512 * 131072
    stack = Stack((("ram", 16), ("nvme", 160)))
    # The replay saved 360 s of prefill over a 2-hour trace: 180 GPU-seconds per hour of traffic,
    # i.e. 5 % of a GPU: 0.05 x $2.50 x 730 h = $91.25 a month.
    e = economics(stack, menu, block_bytes=block, saved_seconds=360.0, trace_seconds=7200.0)
    assert e.bytes_by_tier == {"ram": 1 << 30, "nvme": 160 * (block + 4096)}
    assert e.cost_by_tier["ram"] == pytest.approx(4.00)
    nvme_gib = 10 + 640 / (1024 * 1024)  # 640 KiB of headers
    assert e.cost_by_tier["nvme"] == pytest.approx(0.10 * nvme_gib)
    assert e.storage_cost == pytest.approx(4.00 + 1.0000610351)
    assert e.saved_gpu_seconds_per_hour == pytest.approx(180.0)
    assert e.gpu_value == pytest.approx(91.25)
    assert e.net_saving == pytest.approx(91.25 - 5.0000610351)


def test_config_of_a_stack_carries_sizes_and_speeds() -> None:
    cfg = stack_config(Stack((("ram", 16), ("nvme", 160), ("s3", 0))), Menu(), block_bytes=1 << 26,
                       tokens_per_block=512, kv_bytes_per_token=131072)  # fmt: skip
    assert cfg["cpu_bytes_to_use"] == 16 << 26
    (tier,) = cfg["secondary_tiers"]
    assert (tier["type"], tier["name"], tier["max_bytes"]) == ("fs", "nvme", 160 * ((1 << 26) + 4096))
    assert cfg["cost_model"]["tiers"]["nvme"] == {"load_bandwidth": 5e9, "load_latency": 100e-6}
    assert cfg["cost_model"]["prefill_seconds_per_token"] == pytest.approx(1e-4)


def test_menu_file_overrides_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "menu.json"
    f.write_text(json.dumps({"gpu": {"price_per_hour": 4}, "tiers": {"nvme": {"load_bandwidth": "6GB"}}}))
    m = load_menu(f)
    assert m.kind("nvme").load_bandwidth == 6e9 and m.kind("nvme").source == "menu"
    assert m.gpu.price_per_hour == 4 and m.gpu.prefill_tokens_per_second == 10_000
    assert m.kind("ram").source == "default"
    f.write_text(json.dumps({"tiers": {"tape": {}}}))
    with pytest.raises(ConfigError, match=r"menu.json.tiers.tape.*unknown tier kind"):
        load_menu(f)
    f.write_text(json.dumps({"tiers": {"nvme": {"speed": 1}}}))
    with pytest.raises(ConfigError, match=r"tiers.nvme.speed.*valid keys are: price_per_gib_month"):
        load_menu(f)
    f.write_text(json.dumps({"gpu": {"prefill_tokens_per_second": 0}}))
    with pytest.raises(ConfigError, match=r"prefill_tokens_per_second.*> 0"):
        load_menu(f)
    y = tmp_path / "menu.yaml"
    y.write_text("tiers:\n  s3:\n    price_per_gib_month: 0.02\n")
    assert load_menu(y).kind("s3").price_per_gib_month == 0.02


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, True])
@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("nvme", "load_bandwidth"),
        ("nvme", "load_latency"),
        ("nvme", "price_per_gib_month"),
        ("gpu", "prefill_tokens_per_second"),
        ("gpu", "price_per_hour"),
    ],
)
def test_menu_figures_refuse_nan_infinity_and_negatives(section: str, key: str, value: float) -> None:
    # NaN passed the menu's old hand-written check (NaN < 0 is false) and poisoned every cost.
    raw = {"gpu": {key: value}} if section == "gpu" else {"tiers": {section: {key: value}}}
    with pytest.raises(ConfigError, match=rf"menu\.(tiers\.)?{section}\.{key}: expected a finite number"):
        menu_from_mapping(raw)
