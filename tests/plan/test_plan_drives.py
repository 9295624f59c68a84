"""``kvtier plan`` with several NVMe drives: the planned fs tier is striped (``root_dirs``, one root
per drive), the drive size bounds the sizes searched, and the recommendation is also simulated with
one drive fenced. Everything runs through the striped tier's own simulation hook (the same
``replay --simulate`` a user runs on the written config), on a prefix of the shipped trace."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.config import load_config
from kvtier.errors import ConfigError
from kvtier.keys import KeyNamespace
from kvtier.plan import PlanResult, plan
from kvtier.plan.menu import Menu, menu_from_mapping
from kvtier.plan.stack import Stack, stack_config, tier_bytes
from kvtier.sim.defaults import shipped_trace
from kvtier.sim.prepared import prepare_trace
from kvtier.sim.replay import replay
from kvtier.sim.report import ReplayReport
from kvtier.sim.trace import TraceRequest, read_trace

KV = 131072  # Llama-3-8B, bf16: 64 MiB blocks of 512 tokens
BLOCK = KV * 512
GIB = 1 << 30


@functools.cache
def _requests(limit: int = 1000) -> tuple[TraceRequest, ...]:
    with shipped_trace() as p:
        return tuple(read_trace(p, limit=limit))


def _menu(drives: int, drive_bytes: str | None = None) -> Menu:
    return Menu().with_drives("nvme", drives, drive_bytes, where=("drives", "drive_bytes"))


@functools.cache
def _plan(drives: int, drive_bytes: str | None = None) -> PlanResult:
    menu = _menu(drives, drive_bytes)
    return plan(list(_requests()), kv_bytes_per_token=KV, kinds=("ram", "nvme"), menu=menu, simulations=3,
                refine=1, jobs=2)  # fmt: skip


def _replay(config: dict[str, object]) -> ReplayReport:
    cfg = load_config(config)
    ns = KeyNamespace.from_config(cfg, block_size=512)
    return replay(prepare_trace(list(_requests()), ns, name="t"), cfg, simulate=True)


@given(blocks=st.integers(1, 10_000), drives=st.integers(1, 64))
def test_roots_hold_exactly_the_stack_s_blocks(blocks: int, drives: int) -> None:
    cfg = stack_config(Stack((("ram", 4), ("nvme", blocks))), _menu(drives), block_bytes=BLOCK,
                       tokens_per_block=512, kv_bytes_per_token=KV)  # fmt: skip
    (tier,) = cfg["secondary_tiers"]
    if min(drives, blocks) == 1:
        assert "root_dirs" not in tier and tier["max_bytes"] == tier_bytes("nvme", blocks, BLOCK)
        return
    roots = tier["root_dirs"]
    assert "max_bytes" not in tier and len(roots) == min(drives, blocks)
    shares = [r["max_bytes"] // tier_bytes("nvme", 1, BLOCK) for r in roots]
    assert sum(shares) == blocks and max(shares) - min(shares) <= 1
    assert all(r["max_bytes"] % tier_bytes("nvme", 1, BLOCK) == 0 for r in roots)
    assert len({r["path"] for r in roots}) == len(roots)


def test_striped_recommendation_replays_exactly_and_matches_one_root() -> None:
    striped, single = _plan(4), _plan(1)
    rec = striped.recommendation
    assert rec is not None and striped.config is not None
    tier = striped.config["secondary_tiers"][0]
    assert len(tier["root_dirs"]) == 4 and "simulate_fenced" not in tier
    rep = _replay(striped.config)
    assert rec.hit_ratio == rep.hit_ratio
    assert rec.tier_hits == {("ram" if t.name == "primary" else t.name): t.hits for t in rep.tiers}
    # One LRU over the same capacity either way: striping changes the layout, not the hits.
    assert single.recommendation is not None
    assert rec.stack == single.recommendation.stack and rec.hit_ratio == single.recommendation.hit_ratio
    assert single.degraded == {}


def test_one_drive_fenced_is_simulated_and_loses_a_share() -> None:
    r = _plan(4)
    rec = r.recommendation
    assert rec is not None and r.config is not None
    down = r.degraded["nvme"]
    assert down.tier_hits.get("nvme", 0) < rec.tier_hits["nvme"]
    assert down.hit_ratio["block"] < rec.hit_ratio["block"]
    assert down.econ.storage_cost == rec.econ.storage_cost  # the failed drive is still paid for
    fenced = json.loads(json.dumps(r.config))
    fenced["secondary_tiers"][0]["simulate_fenced"] = [0]
    assert _replay(fenced).hit_ratio == down.hit_ratio
    out = r.to_json()["degraded"]["nvme"]
    assert out["drives"] == 4 and out["fenced_roots"] == [0] and out["hit_ratio"] == down.hit_ratio


def test_drive_size_bounds_every_stack_searched() -> None:
    r = _plan(2, "100GiB")
    cap = 2 * (100 * GIB // tier_bytes("nvme", 1, BLOCK))
    assert r.estimates and r.simulated
    assert all(p.stack.blocks("nvme") <= cap for p in [*r.estimates, *r.simulated])
    assert any(p.stack.blocks("nvme") == cap for p in r.estimates)  # the bound itself is tried


def test_bad_drive_figures_are_named(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match="drives"):
        _menu(0)
    with pytest.raises(ConfigError, match="drives"):
        menu_from_mapping({"tiers": {"nvme": {"drives": "four"}}})
    with pytest.raises(ConfigError, match=r"menu\.tiers\.nvme\.drive_bytes"):
        menu_from_mapping({"tiers": {"nvme": {"drive_bytes": "lots"}}})
    with pytest.raises(ConfigError, match="primary tier"):
        Menu().with_drives("ram", 2, where=("--x", "--y"))
    with pytest.raises(ConfigError, match="holds no block"):
        plan(list(_requests(50)), kv_bytes_per_token=KV, kinds=("ram", "nvme"), menu=_menu(2, "1MiB"))
    m = menu_from_mapping({"tiers": {"nvme": {"drives": 8, "drive_bytes": "3.5TiB"}}})
    nvme = m.kind("nvme")
    assert (nvme.drives, nvme.drive_bytes, nvme.source) == (8, 3.5 * 2**40, "menu")


def test_cli_flags_reach_the_config_and_errors_are_one_line(tmp_path: object) -> None:
    import pathlib

    out = pathlib.Path(str(tmp_path)) / "stack.json"
    cmd = [sys.executable, "-m", "kvtier", "plan", "--limit", "300", "--simulations", "1", "--refine", "0",
           "--tiers", "ram,nvme", "--no-progress", "--json"]  # fmt: skip
    done = subprocess.run([*cmd, "--nvme-drives", "3", "--write-config", str(out)], capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert len(json.loads(out.read_text())["secondary_tiers"][0]["root_dirs"]) == 3
    assert doc["menu"]["tiers"]["nvme"]["drives"] == 3 and "nvme" in doc["degraded"]
    bad = subprocess.run([*cmd, "--nvme-drives", "0"], capture_output=True, text=True, timeout=120,
                         check=False)  # fmt: skip
    assert bad.returncode == 2 and "--nvme-drives" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
