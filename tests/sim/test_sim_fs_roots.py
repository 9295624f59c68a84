"""Simulate mode models a striped fs tier (``root_dirs``) through the tier's simulation hook:
capacity per root, the total shared among roots without their own ``max_bytes``, and roots that
``simulate_fenced`` marks as failed. A model only: nothing is created on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvtier.config import load_config
from kvtier.errors import ConfigError
from kvtier.sim.simtier import sim_tiers

FILE = 4096 + 2048  # header (4 KiB) + payload of one block file


def _max_blocks(tier_entry: dict[str, Any]) -> int | None:
    cfg = load_config({"block_bytes": 2048, "secondary_tiers": [tier_entry]})
    (factory,) = sim_tiers(cfg)
    return factory(memoryview(np.zeros((8, 0), dtype=np.uint8))).config_info()["max_blocks"]  # type: ignore[no-any-return]


def test_each_root_holds_its_own_share_and_a_fenced_root_holds_nothing(tmp_path: Path) -> None:
    roots: list[Any] = [
        {"path": str(tmp_path / "a"), "max_bytes": 10 * FILE},
        {"path": str(tmp_path / "b"), "max_bytes": 20 * FILE + 100},
        str(tmp_path / "c"),
    ]
    entry = {"type": "fs", "root_dirs": roots, "max_bytes": 40 * FILE, "small_block_bytes": 0}
    assert _max_blocks(entry) == 10 + 20 + 9  # c gets the rest of the total: 10 * FILE - 100 bytes
    assert _max_blocks({**entry, "simulate_fenced": [1]}) == 10 + 9
    assert _max_blocks({**entry, "simulate_fenced": [0, 2]}) == 20
    assert _max_blocks({"type": "fs", "root_dirs": roots[:2], "small_block_bytes": 0}) == 30
    assert _max_blocks({"type": "fs", "root_dirs": [str(tmp_path / "x")]}) is None  # unbounded
    assert not any(p.exists() for p in tmp_path.iterdir())


def test_roots_without_their_own_limit_share_the_total_equally_in_the_model(tmp_path: Path) -> None:
    roots = [str(tmp_path / n) for n in "abcd"]
    entry = {"type": "fs", "root_dirs": roots, "max_bytes": 40 * FILE, "small_block_bytes": 0}
    assert _max_blocks(entry) == 40
    assert _max_blocks({**entry, "simulate_fenced": [3]}) == 30  # a failed disk takes its quarter


@pytest.mark.parametrize("fenced", [[3], [-1], "0", [True]])
def test_a_bad_simulate_fenced_is_one_line(tmp_path: Path, fenced: object) -> None:
    entry = {"type": "fs", "root_dirs": [str(tmp_path / "a"), str(tmp_path / "b")], "simulate_fenced": fenced}
    with pytest.raises(ConfigError, match="simulate_fenced"):
        _max_blocks(entry)
