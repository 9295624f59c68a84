"""The fs tier configured by name behind the real engine: write-through, promotion, restart, errors."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvtier.engine import Engine
from kvtier.errors import ConfigError
from kvtier.keys import BlockKey
from kvtier.tiers.fs import FsTier

BLOCK = 64 * 1024


def _config(root: Path, **tier: Any) -> dict[str, Any]:
    return {
        "block_bytes": BLOCK,
        "cpu_bytes_to_use": 16 * BLOCK,
        "model": "engine-fs-test",
        "secondary_tiers": [{"type": "fs", "root_dir": str(root), **tier}],
    }


def _promote(eng: Engine, keys: list[BlockKey], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while eng.lookup(keys).num_hits < len(keys):
        assert time.monotonic() < deadline, "promotion from the fs tier did not finish"
        eng.poll()
        time.sleep(0.002)


def test_store_through_engine_then_promote_after_reset_and_restart(tmp_path: Path) -> None:
    keys = [BlockKey(f"e{i}".encode()) for i in range(8)]
    data = np.random.default_rng(3).integers(0, 256, (8, BLOCK), dtype=np.uint8)
    out = np.zeros_like(data)
    with Engine(_config(tmp_path, max_bytes="10MiB")) as eng:
        assert isinstance(eng.tiers[0], FsTier)
        assert eng.store_blocks(keys, data) == 8
        eng.drain()
        eng.reset()  # the primary tier forgets; the fs tier still has every block
        _promote(eng, keys)
        assert eng.load_blocks(keys, out) == 8
        assert np.array_equal(out, data)
    out[:] = 0
    with Engine(_config(tmp_path, max_bytes="10MiB")) as eng:  # a new process would see the same
        _promote(eng, keys)
        assert eng.load_blocks(keys, out) == 8
        assert np.array_equal(out, data)
        assert eng.stats()["tiers"]["fs0"]["corrupt"] == 0


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("verify", "sometimes", "secondary_tiers[0].verify"),
        ("max_bytes", "lots", "secondary_tiers[0].max_bytes"),
        ("eviction_policy", "nosuch", "eviction_policy"),
        ("threads", 0, "secondary_tiers[0].threads"),
    ],
)
def test_bad_options_are_one_line_config_errors(tmp_path: Path, option: str, value: Any, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        Engine(_config(tmp_path, **{option: value}))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_missing_root_dir_names_the_key(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    del cfg["secondary_tiers"][0]["root_dir"]
    with pytest.raises(ConfigError) as exc:
        Engine(cfg)
    assert "root_dir" in str(exc.value)


def test_a_striped_fs_tier_behind_the_engine_stores_promotes_and_restarts(tmp_path: Path) -> None:
    from kvtier.tiers.fs.striped import StripedFsTier

    keys = [BlockKey(f"s{i}".encode()) for i in range(12)]
    data = np.random.default_rng(4).integers(0, 256, (12, BLOCK), dtype=np.uint8)
    out = np.zeros_like(data)
    cfg = _config(tmp_path)
    cfg["cpu_bytes_to_use"] = 24 * BLOCK
    del cfg["secondary_tiers"][0]["root_dir"]
    cfg["secondary_tiers"][0].update(
        root_dirs=[str(tmp_path / "d0"), str(tmp_path / "d1")], max_bytes="10MiB"
    )
    for run in range(2):  # the second engine is a restart: every block found on its root
        with Engine(cfg) as eng:
            tier = eng.tiers[0]
            assert isinstance(tier, StripedFsTier) and tier.wait_scan(30)
            assert len(tier.indexed_keys()) == (12 if run else 0)
            if not run:
                assert eng.store_blocks(keys, data) == 12
                eng.drain()
                eng.reset()
            _promote(eng, keys)
            assert eng.load_blocks(keys, out) == 12
            assert np.array_equal(out, data)
            stats = eng.stats()["tiers"]["fs0"]
            assert stats["roots"] == 2 and stats["root0_index_blocks"] + stats["root1_index_blocks"] == 12
        out[:] = 0
