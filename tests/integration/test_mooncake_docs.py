"""docs/mooncake.md's config is a valid config and, pointed at a real store (its addresses replaced
by the test's loopback ones, its sizes shrunk), round-trips blocks byte for byte through the engine."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
from mooncake_servers import MooncakeStore
from needs import need_module

from kvtier.config import load_config
from kvtier.engine import Engine
from kvtier.keys import BlockKey

DOC = Path(__file__).resolve().parents[2] / "docs" / "mooncake.md"


def _config() -> dict[str, object]:
    (block,) = re.findall(r"```json\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    cfg: dict[str, object] = json.loads(block)
    return cfg


def test_config_example_loads() -> None:
    parsed = load_config(_config())
    tier = parsed.secondary_tiers[0]
    assert tier.type == "mooncake" and tier.options["protocol"] == "tcp"


def test_config_example_round_trips_against_a_real_store(mooncake_store: MooncakeStore) -> None:
    need_module("mooncake.store", "mooncake")
    cfg = _config()
    cfg.update(block_bytes=65536, cpu_bytes_to_use=16 * 65536)
    (tier,) = cfg["secondary_tiers"]  # type: ignore[misc]
    tier.update(
        master_server_addr=mooncake_store.master_addr,
        metadata_server=mooncake_store.metadata_server,
        local_hostname="127.0.0.1",
        key_prefix="docs",
    )
    keys = [BlockKey(f"doc{i}".encode()) for i in range(4)]
    data = np.random.default_rng(1).integers(0, 256, (4, 65536), dtype=np.uint8)
    out = np.zeros_like(data)
    with Engine(cfg) as eng:
        assert eng.tiers[0].config_info()["data_path"] == {"store": "in place", "load": "in place"}
        assert eng.store_blocks(keys, data) == 4
        eng.drain()
        eng.reset()
        deadline = time.monotonic() + 10
        while eng.lookup(keys).num_hits < 4:
            assert time.monotonic() < deadline
            eng.poll()
            time.sleep(0.005)
        assert eng.load_blocks(keys, out) == 4
    assert np.array_equal(out, data)
