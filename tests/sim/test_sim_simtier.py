"""SimTier: the metadata-only tier model used by simulate mode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvtier.config import load_config
from kvtier.errors import ConfigError
from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.policies.lru import LRUPolicy
from kvtier.sim.simtier import SimTier, sim_tiers


def _keys(*ids: int) -> list[BlockKey]:
    return [BlockKey(i.to_bytes(16, "little")) for i in ids]


def _tier(max_blocks: int | None) -> SimTier:
    view = memoryview(np.zeros((4, 0), dtype=np.uint8))  # a simulate engine's view: rows of length 0
    return SimTier(
        primary_kv_view=view, name="fs0", block_bytes=100, policy=LRUPolicy(1 << 20),
        max_blocks=max_blocks, medium="STORAGE",
    )  # fmt: skip


def _job(job_id: int, keys: list[BlockKey]) -> TransferJob:
    return TransferJob(job_id, keys, np.zeros(len(keys), dtype=np.int32))


def test_store_evicts_lru_and_load_refreshes() -> None:
    t = _tier(3)
    t.submit_store(_job(1, _keys(1, 2, 3)))
    t.submit_load(_job(2, _keys(1)))  # 1 becomes most recent
    t.submit_store(_job(3, _keys(4)))  # evicts 2, the least recent
    assert [t.lookup(k) for k in _keys(1, 2, 3, 4)] == [
        LookupResult.HIT, LookupResult.MISS, LookupResult.HIT, LookupResult.HIT,
    ]  # fmt: skip
    results = t.get_finished_jobs()
    assert [r.job_id for r in results] == [1, 2, 3] and all(r.success for r in results)
    assert t.get_finished_jobs() == []
    s = t.stats
    assert (s.stores, s.evictions, s.loads, s.bytes_written, s.bytes_read) == (4, 1, 1, 400, 100)
    assert (s.lookups, s.hits) == (4, 3)


def test_store_of_held_key_refreshes_without_counting() -> None:
    t = _tier(2)
    t.submit_store(_job(1, _keys(1, 2)))
    t.submit_store(_job(2, _keys(1)))  # held: refreshed, not stored again
    t.submit_store(_job(3, _keys(3)))  # evicts 2
    assert t.lookup(_keys(2)[0]) is LookupResult.MISS and t.lookup(_keys(1)[0]) is LookupResult.HIT
    assert t.stats.stores == 3


def test_load_of_missing_key_is_partial_failure() -> None:
    t = _tier(None)
    t.submit_store(_job(1, _keys(1)))
    t.submit_load(_job(2, _keys(1, 2)))
    res = t.get_finished_jobs()[-1]
    assert not res.success and res.transferred(_keys(1, 2)) == _keys(1)
    assert t.stats.failed_jobs == 1


def test_sim_tiers_model_fs_capacity_from_config() -> None:
    cfg = load_config(
        {
            "block_bytes": 2048,
            "secondary_tiers": [
                {"type": "fs", "root_dir": "/unused", "max_bytes": 10 * (4096 + 2048) + 5},
                {"type": "fs", "name": "cold", "root_dir": "/unused2"},
            ],
        }
    )
    view = memoryview(np.zeros((8, 0), dtype=np.uint8))
    tiers = [f(view) for f in sim_tiers(cfg)]
    assert [t.name for t in tiers] == ["fs0", "cold"]
    assert [t.medium for t in tiers] == ["STORAGE", "STORAGE"]
    assert tiers[0].config_info()["max_blocks"] == 10  # header (4 KiB) + payload per file
    assert tiers[1].config_info()["max_blocks"] is None
    assert not Path("/unused").exists()  # a model: nothing is created on disk


def test_sim_tiers_reject_unknown_policy() -> None:
    cfg = load_config({"secondary_tiers": [{"type": "fs", "root_dir": "/x", "eviction_policy": "nope"}]})
    with pytest.raises((ConfigError, LookupError)):
        sim_tiers(cfg)
