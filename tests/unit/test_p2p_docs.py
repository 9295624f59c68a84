"""docs/p2p.md stays in step with the code: its config validates, its tables name real options."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import numpy as np

from kvtier.config import load_config
from kvtier.tiers.p2p import P2PTier
from kvtier.tiers.p2p import protocol as P
from kvtier.tiers.p2p.service import _SERVE_KEYS

DOC = (Path(__file__).parents[2] / "docs" / "p2p.md").read_text(encoding="utf-8")


def test_the_example_config_loads() -> None:
    block = re.search(r"```json\n(.*?)```", DOC, re.S)
    assert block is not None
    cfg = load_config(json.loads(block.group(1)))
    assert cfg.secondary_tiers[0].type == "p2p"


def test_the_simulation_example_is_a_bounded_pool_of_seven_peers() -> None:
    from kvtier.sim.simtier import sim_tiers

    section = DOC.split("## Simulation")[1]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block is not None
    cfg = load_config(json.loads(block.group(1)))
    (factory,) = sim_tiers(cfg)
    tier = factory(memoryview(np.zeros((8, 0), dtype=np.uint8)))
    assert tier.config_info()["max_blocks"] == 7 * cfg.num_primary_slots


def test_every_documented_option_is_a_constructor_argument_and_back() -> None:
    tables = [part.split("\n\n")[0] for part in re.split(r"\| key \| default \| meaning[^|]*\|", DOC)[1:]]
    rows = [r for table in tables for r in table.splitlines()[2:]]
    documented = set(re.findall(r"`([a-z_]+)`", "\n".join(r.split("|")[1] for r in rows)))
    params = set(inspect.signature(P2PTier).parameters) - {"primary_kv_view", "context"}
    assert documented <= params
    assert params - documented <= {"log_interval"}  # shared by every tier, documented with AsyncTier


def test_serve_keys_and_frame_types_are_all_documented() -> None:
    for key in _SERVE_KEYS:
        assert f"`{key}`" in DOC, key
    for ftype in P.FrameType:
        assert f"| {int(ftype)} {ftype.name} |" in DOC, ftype.name
    assert f"| 0 | 4 | magic `{P.MAGIC.decode()}` |" in DOC
