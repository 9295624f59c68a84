"""The p2p tier in ``kvtier replay --simulate``: the peers' primary tiers pooled, never unbounded.

A p2p hit exists only while a peer still holds the block in its own primary tier, so the modelled
capacity is peers x one peer's primary slots. The replay runs are real ``kvtier`` subprocesses on a
real trace (the Mooncake arXiv trace, first 400 requests); no peer is contacted (simulate mode
builds no real tier).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from needs import need_module

from kvtier.config import load_config
from kvtier.errors import ConfigError
from kvtier.policies.arc import ARCPolicy
from kvtier.sim.simtier import sim_tiers
from kvtier.tiers.p2p import P2PTier

TRACE = Path("/work/shared/traces/mooncake_arxiv_first1000.jsonl")
if not TRACE.is_file():
    TRACE = Path(__file__).parents[2] / "src" / "kvtier" / "data" / "conversation_trace.jsonl.gz"

BLOCK = 4096
PRIMARY_SLOTS = 200
P2P = {"type": "p2p", "peers": ["127.0.0.1:9"], "secret_env": "KVTIER_TEST_P2P_SIM_SECRET"}


def _config(**p2p: Any) -> dict[str, Any]:
    return {
        "block_bytes": BLOCK, "cpu_bytes_to_use": PRIMARY_SLOTS * BLOCK, "write_policy": "write_back",
        "secondary_tiers": [{**P2P, **p2p}],
    }  # fmt: skip


def _replay(tmp_path: Path, config: dict[str, Any]) -> dict[str, Any]:
    need_module("rich", "cli")
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "KVTIER_TEST_P2P_SIM_SECRET": "s"}
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier.cli.main", "replay", str(TRACE), "--simulate", "--json",
         "--limit", "400", "--config", str(path)],
        capture_output=True, text=True, timeout=240, check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def test_replay_hits_grow_with_the_peers_capacity_and_stay_below_the_infinite_cache(
    tmp_path: Path,
) -> None:
    hits = {}
    for label, options in {
        "none": {"sim_peers": 0},
        "one small": {"sim_peers": 1, "sim_peer_bytes": 50 * BLOCK},
        "static list": {},  # one static peer of this config's primary size
        "eight": {"sim_peers": 8},
        "huge": {"sim_peers": 1, "sim_peer_bytes": "1GiB"},
    }.items():
        out = _replay(tmp_path, _config(**options))
        primary, p2p = out["tiers"]
        assert p2p["type"] == "p2p/simulated"
        hits[label] = (primary["hits"], p2p["hits"])
        ceiling = out["infinite"]["block"] * out["block_refs"]  # hits of a cache holding everything
        assert primary["hits"] + p2p["hits"] <= ceiling + 1e-6
    assert hits["none"][1] == 0  # no peer holds anything
    p2p_hits = [hits[k][1] for k in ("none", "one small", "static list", "eight", "huge")]
    assert p2p_hits == sorted(p2p_hits) and p2p_hits[1] < p2p_hits[3], hits  # fewer when smaller
    assert hits["eight"][1] > 0


def test_directory_only_config_must_say_how_many_peers(tmp_path: Path) -> None:
    cfg = load_config(_config(peers=[], directory="redis://127.0.0.1:9/0"))
    with pytest.raises(ConfigError, match=r"secondary_tiers\[0\]\.sim_peers: .*set sim_peers"):
        sim_tiers(cfg)
    cfg = load_config(_config(peers=[], directory="redis://127.0.0.1:9/0", sim_peers=3))
    (tier,) = [f(memoryview(np.zeros((8, 0), dtype=np.uint8))) for f in sim_tiers(cfg)]
    assert tier.config_info()["max_blocks"] == 3 * PRIMARY_SLOTS


def test_profile_uses_the_primary_policy_and_row_stride() -> None:
    raw = _config(sim_peers=2, sim_peer_bytes=10 * 8192)
    raw.update(block_bytes=5000, cpu_bytes_to_use=30 * 8192, eviction_policy="arc")
    (factory,) = sim_tiers(load_config(raw))
    tier = factory(memoryview(np.zeros((8, 0), dtype=np.uint8)))
    assert tier.config_info()["max_blocks"] == 2 * 10  # rows of 5000 bytes take 8 KiB each
    assert isinstance(tier._policy, ARCPolicy)  # the peers evict as this config's primary does
    assert tier.medium == "REMOTE"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"sim_peers": -1}, r"sim_peers: expected a peer count >= 0"),
        ({"sim_peers": True}, r"sim_peers: expected a peer count"),
        ({"sim_peer_bytes": "lots"}, r"sim_peer_bytes"),
    ],
)
def test_bad_simulation_options_name_the_key(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        sim_tiers(load_config(_config(**options)))


def test_without_the_primary_the_peer_size_is_required() -> None:
    def lru(policy: str, capacity: int, options: object = None, *, key_path: str = "") -> Any:
        from kvtier.policies.lru import LRUPolicy

        return LRUPolicy(capacity)

    with pytest.raises(ConfigError, match="sim_peer_bytes"):
        P2PTier.simulation(P2P, block_bytes=BLOCK, policy_factory=lru)
    profile = P2PTier.simulation({**P2P, "sim_peer_bytes": 7 * BLOCK}, block_bytes=BLOCK, policy_factory=lru)
    assert profile.capacity_blocks == 7
