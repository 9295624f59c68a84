"""The adapter through vLLM's ``SecondaryTierFactory`` directly, driven call by call.

``test_vllm_manager.py`` runs it inside vLLM's manager; here each contract point is checked on the
tier vLLM's factory returns: the job objects are vLLM's ``TransferJob`` and the results must be
vLLM's ``JobResult`` with the fields vLLM's manager reads.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from vllm_helpers import (
    ADAPTER,
    ROW_BYTES,
    extra_config,
    kvtier_entry,
    need_vllm,
    offload_keys,
    offloading_config,
    payload,
)

need_vllm()

from vllm.v1.kv_offload.base import LookupResult  # noqa: E402
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

from kvtier.errors import ConfigError  # noqa: E402
from kvtier.integrations.vllm import KvtierTier  # noqa: E402

PROBE = {**ADAPTER, "tier": "ProbeTier", "tier_module_path": "vllm_probe_tier"}


def _spec() -> Any:
    return TieringOffloadingSpec(offloading_config(extra_config([])))


def _create(entry: dict[str, Any], chunks: int = 8) -> tuple[Any, np.ndarray]:
    rows = np.zeros((chunks, ROW_BYTES), dtype=np.int8)  # vLLM's primary buffer is int8
    tier = SecondaryTierFactory.create_secondary_tier(dict(entry), memoryview(rows), _spec())
    return tier, rows


def _wait(tier: Any, job_ids: set[int], timeout: float = 20.0) -> dict[int, Any]:
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while set(got) != job_ids:
        for result in tier.get_finished_jobs():
            assert result.job_id not in got, "a job was reported twice"
            got[result.job_id] = result
        assert time.monotonic() < deadline, f"jobs never reported: {job_ids - set(got)}"
        time.sleep(0.002)
    return got


def _job(job_id: int, keys: list[bytes], chunks: list[int], promotion: bool) -> Any:
    return TransferJob(job_id, keys, np.array(chunks, dtype=np.int32), promotion, None)


def test_vllm_resolves_the_class_by_module_path() -> None:
    cls = SecondaryTierFactory.get_tier_class(dict(ADAPTER))
    assert cls is KvtierTier


def test_direct_contract_store_lookup_load(tmp_path: Path) -> None:
    tier, rows = _create(kvtier_entry(tmp_path))
    u8 = rows.view(np.uint8)
    keys = offload_keys(3, salt=b"direct")
    try:
        assert all(tier.lookup(k, None) is LookupResult.MISS for k in keys)
        for i, key in enumerate(keys):
            u8[i] = payload(key)
        tier.submit_store(_job(1, keys, [0, 1, 2], False))
        (stored,) = _wait(tier, {1}).values()
        assert isinstance(stored, JobResult) and stored.success
        assert stored.transfer_bytes == 3 * ROW_BYTES and stored.transfer_time is not None
        assert all(tier.lookup(k, None) is LookupResult.HIT for k in keys)
        u8[3:6] = 0
        tier.submit_load(_job(2, keys, [5, 4, 3], True))
        (loaded,) = _wait(tier, {2}).values()
        assert loaded.success and loaded.successful_keys is None
        for key, chunk in zip(keys, [5, 4, 3], strict=True):
            assert np.array_equal(u8[chunk], payload(key))
        # Storing held keys again moves no bytes (vLLM's detector is then not fed a fake figure).
        tier.submit_store(_job(3, keys, [0, 1, 2], False))
        assert _wait(tier, {3})[3].transfer_bytes == 0
        tier.drain_jobs()
        assert not tier.has_pending_work()
    finally:
        tier.shutdown()


def test_load_of_missing_keys_is_a_partial_success(tmp_path: Path) -> None:
    tier, rows = _create(kvtier_entry(tmp_path))
    keys = offload_keys(2, salt=b"missing")
    try:
        rows.view(np.uint8)[0] = payload(keys[0])
        tier.submit_store(_job(1, keys[:1], [0], False))
        _wait(tier, {1})
        tier.submit_load(_job(2, keys, [1, 2], True))
        result = _wait(tier, {2})[2]
        assert not result.success
        assert list(result.successful_keys) == [keys[0]]
    finally:
        tier.shutdown()


def test_bad_tier_option_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="root_dir") as err:
        _create({**ADAPTER, "tier": "fs"})
    assert err.value.key_path == "KvtierTier.root_dir"
    with pytest.raises(ConfigError, match="locality"):
        _create({**kvtier_entry(tmp_path), "locality": "MARS"})
    with pytest.raises(ConfigError, match="n_read_threads"):
        _create({**kvtier_entry(tmp_path), "n_read_threads": 0})


def test_vllm_fs_thread_keys_keep_vllm_meaning(tmp_path: Path) -> None:
    tier, _ = _create({**kvtier_entry(tmp_path), "n_read_threads": 3, "n_write_threads": 2})
    try:
        assert tier.kvtier_tier.threads == 5  # vLLM runs 3 read + 2 write threads: 5 in all
    finally:
        tier.shutdown()


def test_locality_and_medium_reach_vllm(tmp_path: Path) -> None:
    tier, _ = _create({**kvtier_entry(tmp_path), "locality": "remote"})
    try:
        assert tier.locality.name == "REMOTE" and tier.medium.name == "STORAGE"
        assert tier.cache_hit_source.value == "disk"
    finally:
        tier.shutdown()


@given(
    st.lists(
        st.tuples(st.booleans(), st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True)),
        min_size=1,
        max_size=12,
    ),
    st.booleans(),
    st.booleans(),
)
def test_every_job_is_reported_exactly_once(
    ops: list[tuple[bool, list[int]]], duplicate: bool, raising: bool
) -> None:
    tier, _ = _create({**PROBE, "duplicate_reports": duplicate, "raise_on_submit": raising})
    keys = offload_keys(6, salt=b"once")
    jobs = {}
    try:
        for job_id, (load, idx) in enumerate(ops, start=1):
            jobs[job_id] = job = _job(job_id, [keys[i] for i in idx], list(idx), load)
            (tier.submit_load if load else tier.submit_store)(job)
        tier.drain_jobs()  # afterwards vLLM expects every result to be available
        results = list(tier.get_finished_jobs())
        assert sorted(r.job_id for r in results) == sorted(jobs)
        assert list(tier.get_finished_jobs()) == []
        for r in results:
            if r.successful_keys is not None:  # vLLM asserts this subset relation
                assert jobs[r.job_id].is_promotion and set(r.successful_keys) <= set(jobs[r.job_id].keys)
    finally:
        tier.shutdown()


@pytest.mark.parametrize("version", ["0.31.2", "0.35.0", None])
def test_an_unknown_vllm_is_refused_in_vllms_factory_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str | None
) -> None:
    # The installed version as compat read it is replaced: the refusal is checked against what
    # the factory really does with the tier's constructor error (it must reach the user as is).
    from kvtier.errors import PluginError
    from kvtier.integrations.vllm import compat

    monkeypatch.setattr(compat, "VLLM_VERSION", version)
    with pytest.raises(PluginError) as err:
        _create(kvtier_entry(tmp_path))
    message = str(err.value)
    assert "\n" not in message and "0.32, 0.33, 0.34" in message
    assert (version or "no vLLM") in message
    assert not list(tmp_path.iterdir()), "nothing is created before the refusal"
