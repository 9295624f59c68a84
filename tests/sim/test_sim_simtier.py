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
from kvtier.tiers.base import SimulationProfile, whole_job


def _keys(*ids: int) -> list[BlockKey]:
    return [BlockKey(i.to_bytes(16, "little")) for i in ids]


def _tier(max_blocks: int | None) -> SimTier:
    view = memoryview(np.zeros((4, 0), dtype=np.uint8))  # a simulate engine's view: rows of length 0
    profile = SimulationProfile(max_blocks, LRUPolicy(1 << 20), whole_job, "STORAGE")
    return SimTier(primary_kv_view=view, name="fs0", block_bytes=100, profile=profile)


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


def test_fs_profile_makes_room_per_job_whatever_its_chunking() -> None:
    """The real fs tier reserves room once per store job (its first chunk reserves for the whole
    job), so the model makes room per job for any threads/batch_blocks. (It used to chunk by a
    copied batch_blocks default of 8 while the tier's was 4; jobs of more than 4 blocks then
    diverged from real mode, see test_two_tier_real_equals_simulate_on_random_traces.)"""
    from kvtier.tiers.fs import FsTier

    for extra in ({}, {"threads": 1, "batch_blocks": 1}, {"threads": 8, "batch_blocks": 64}):
        options = {"root_dir": "/unused", "max_bytes": 3 * (4096 + 4096), **extra}
        profile = FsTier.simulation(options, block_bytes=4096, policy_factory=_lru_factory)
        assert [profile.chunk_blocks(n) for n in (1, 5, 100)] == [1, 5, 100]
        assert profile.capacity_blocks == 3 and profile.medium == "STORAGE"
        assert profile.policy.capacity == 3 * 2 + 1  # sized as FsTier sizes its policy


def test_a_new_tier_is_simulated_through_its_hook_alone() -> None:
    """A plug-in tier overriding ``simulation`` is modelled by sim_tiers with no edit to kvtier.sim:
    its capacity, policy (built by the factory it is handed) and chunking are what it says."""
    from collections.abc import Mapping
    from typing import Any

    from kvtier.plugins import register_tier
    from kvtier.tiers.base import PolicyFactory, SimulationProfile
    from kvtier.tiers.example import ExampleTier

    class SlotsTier(ExampleTier):
        medium = "REMOTE"

        @classmethod
        def simulation(
            cls,
            options: Mapping[str, Any],
            *,
            block_bytes: int,
            policy_factory: PolicyFactory,
            key_path: str = "",
        ) -> SimulationProfile:
            cap = int(options["capacity_blocks"])
            return SimulationProfile(
                cap, policy_factory("lru", cap, {}, key_path=key_path), lambda n: 1, "REMOTE"
            )

    register_tier("slots-test", SlotsTier)
    cfg = load_config({"secondary_tiers": [{"type": "slots-test", "capacity_blocks": 2}]})
    (tier,) = [f(memoryview(np.zeros((8, 0), dtype=np.uint8))) for f in sim_tiers(cfg)]
    assert tier.medium == "REMOTE" and tier.config_info()["max_blocks"] == 2
    tier.submit_store(_job(1, _keys(1, 2, 3)))  # one block per chunk: 3 evicts 1 (all at once: 3 dropped)
    assert [tier.lookup(k) for k in _keys(1, 2, 3)] == [LookupResult.MISS, LookupResult.HIT, LookupResult.HIT]
    assert tier.get_finished_jobs()[0].success


def test_default_profile_reads_max_bytes_and_validates_policy_options() -> None:
    cfg = load_config(
        {"secondary_tiers": [{"type": "example", "max_bytes": "8KiB", "policy_options": {"nope": 1}}]}
    )
    with pytest.raises(ConfigError, match=r"secondary_tiers\[0\]\.policy_options\.nope"):
        sim_tiers(cfg)


def _lru_factory(policy: str, capacity: int, options: object = None, *, key_path: str = "") -> LRUPolicy:
    assert policy == "lru"
    return LRUPolicy(capacity)
