"""kvtier's tiers inside vLLM's own (0.32, 0.33, 0.34) ``TieringOffloadingManager`` (CPU only).

Each test builds vLLM's real ``TieringOffloadingSpec`` and manager (see ``vllm_helpers``): vLLM's
``SecondaryTierFactory`` loads ``kvtier.integrations.vllm`` by ``module_path``, vLLM's manager
cascades stores to it and promotes hits from it. Only the GPU<->CPU copies are done with numpy.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_helpers import (
    ADAPTER,
    assert_exact,
    kvtier_entry,
    manager_lock,
    need_vllm,
    offload_keys,
    payload,
    vllm_stack,
)

need_vllm()

from kvtier.integrations.vllm import compat  # noqa: E402
from kvtier.integrations.vllm import tier as adapter  # noqa: E402

PROBE = {**ADAPTER, "tier": "ProbeTier", "tier_module_path": "vllm_probe_tier"}


def test_factory_loads_the_adapter_by_module_path(tmp_path: Path) -> None:
    with vllm_stack(tmp_path) as stack:
        tier = stack.tier
        assert type(tier) is adapter.KvtierTier
        assert tier.tier_type == "KvtierTier"
        assert type(tier.kvtier_tier).__name__ == "FsTier"
        assert tier.medium.name == "STORAGE"


def test_store_then_lookup_hit_then_load_is_byteassert_exact(tmp_path: Path) -> None:
    keys = offload_keys(6)
    with vllm_stack(tmp_path) as stack:
        assert stack.store(keys) == keys
        assert stack.tier.kvtier_tier.get_stats()["stores"] == 6
        stack.wipe_primary()  # every chunk overwritten: a HIT must copy the bytes back
        out = stack.load(keys)
        assert_exact(out, keys)
        assert stack.tier.kvtier_tier.get_stats()["loads"] == 6


def test_second_instance_on_the_same_root_hits_the_first_ones_blocks(tmp_path: Path) -> None:
    keys = offload_keys(4, salt=b"shared")
    with vllm_stack(tmp_path) as a:
        a.store(keys)
    with vllm_stack(tmp_path) as b:  # a new engine id, a new primary region, the same fs root
        assert_exact(b.load(keys), keys)


@pytest.mark.parametrize(
    "change",
    [{"model": "other/model"}, {"dtype": "bfloat16"}, {"tokens_per_block": 32}, {"tp_size": 2}],
    ids=["model", "dtype", "block-size", "tp-layout"],
)
def test_a_layout_change_never_reuses_old_blocks(tmp_path: Path, change: dict[str, object]) -> None:
    keys = offload_keys(3, salt=b"layout")
    with vllm_stack(tmp_path) as a:
        a.store(keys)
    with vllm_stack(tmp_path, **change) as b:  # type: ignore[arg-type]
        assert b.load(keys) == {k: None for k in keys}
    with vllm_stack(tmp_path) as c:  # and the unchanged layout still hits
        assert_exact(c.load(keys), keys)


def test_cache_salt_keeps_deployments_apart(tmp_path: Path) -> None:
    keys = offload_keys(2, salt=b"salt")
    with vllm_stack(tiers=[kvtier_entry(tmp_path, cache_salt="team-a")]) as a:
        a.store(keys)
    with vllm_stack(tiers=[kvtier_entry(tmp_path, cache_salt="team-b")]) as b:
        assert b.load(keys) == {k: None for k in keys}


def test_a_corrupt_block_is_a_miss_never_wrong_bytes(tmp_path: Path) -> None:
    keys = offload_keys(3, salt=b"corrupt")
    # One file per block (small_block_bytes 0), so the test can flip a bit in the victim's file; the
    # small-block segments have their own corruption test (tests/integration/test_fs_segments.py).
    one_file = [kvtier_entry(tmp_path, small_block_bytes=0)]
    with vllm_stack(tiers=one_file) as a:
        a.store(keys)
    victim = keys[1]
    files = [p for p in tmp_path.rglob(f"{victim.hex()}*") if p.is_file()]
    assert len(files) == 1, "the block file of the victim key"
    data = bytearray(files[0].read_bytes())
    data[-1] ^= 0xFF  # one payload bit flipped on disk
    files[0].write_bytes(bytes(data))
    with vllm_stack(tiers=one_file) as b:
        out = b.load(keys)
        assert out[victim] is None or np.array_equal(out[victim], payload(victim))
        assert_exact(out, [keys[0], keys[2]])
        # vLLM promoted the corrupt block (the index had it) and got a partial success back.
        assert b.tier.kvtier_tier.get_stats()["corrupt"] == 1
        assert b.load([victim]) == {victim: None}


def test_partial_promotion_reports_the_keys_that_landed(tmp_path: Path) -> None:
    keys = offload_keys(3, salt=b"partial")
    with vllm_stack(tiers=[{**PROBE, "lose_keys": True}]) as stack:
        stack.store(keys)
        stack.wipe_primary()
        out = stack.load(keys)
        # One batched promotion job; the probe tier drops its last key.
        assert sum(v is None for v in out.values()) == 1
        assert_exact(out, [k for k, v in out.items() if v is not None])


def test_a_raising_backend_becomes_failed_jobs_not_an_engine_crash(tmp_path: Path) -> None:
    keys = offload_keys(3, salt=b"raise")
    with vllm_stack(tiers=[{**PROBE, "raise_on_submit": True}]) as stack:
        stack.store(keys)  # settles: every store job was reported (failed), none left in flight
        assert stack.manager._jobs == {}
        stack.wipe_primary()
        assert stack.load(keys) == {k: None for k in keys}


def test_duplicate_reports_reach_vllm_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    adapter.reset_log_once()
    keys = offload_keys(4, salt=b"dup")
    with (
        caplog.at_level(logging.WARNING, logger="kvtier.integrations.vllm"),
        vllm_stack(tiers=[{**PROBE, "duplicate_reports": True}]) as stack,
    ):
        # vLLM's manager asserts on a job id it does not know: a second report would raise here.
        stack.store(keys[:2])
        stack.store(keys[2:])
        stack.wipe_primary()
        assert_exact(stack.load(keys), keys)
    dup = [r for r in caplog.records if "not in flight" in r.getMessage()]
    assert len(dup) == 1


def test_drain_waits_for_copies_in_flight(tmp_path: Path) -> None:
    keys = offload_keys(4, salt=b"drain")
    with vllm_stack(tiers=[{**PROBE, "delay": 0.3}]) as stack:
        stack.store(keys, wait=False)  # jobs submitted, copies sleeping on the tier's workers
        probe = stack.tier.kvtier_tier
        assert probe.copies_running > 0 or probe.has_pending_work()
        stack.reset()  # vLLM's reset_cache: drain_jobs, then asserts every job was reported
        assert probe.max_copies_seen_by_drain == 0
        assert stack.manager._jobs == {}
        assert len(probe.blocks) == 4  # nothing aborted: every copy finished
        stack.wipe_primary()
        assert_exact(stack.load(keys), keys)


def test_vllm_backpressure_is_fed_and_respected(tmp_path: Path) -> None:
    # Watermarks so low that any store is "slow": after one warm-up completion vLLM's detector
    # must be under pressure and its manager must stop cascading to the tier.
    bp = {
        "backpressure_cls": "EMABackpressureDetector",
        "policy_cls": "DropStorePolicy",
        "warmup_completions": 1,
        "high_water_s": 1e-9,
        "low_water_s": 1e-10,
        "decay_half_life_s": 1e9,
    }
    with vllm_stack(tiers=[{**PROBE, "delay": 0.05, "backpressure": bp}], chunks=32) as stack:
        detector = stack.tier.bp_detector
        assert detector is not None
        stack.store(offload_keys(2, salt=b"bp1"))
        stack.store(offload_keys(2, salt=b"bp2"))
        assert detector.store_latency_ema > 0  # fed from the adapter's transfer_bytes
        assert detector.is_under_pressure()
        calls = stack.tier.kvtier_tier.store_calls
        stack.store(offload_keys(2, salt=b"bp3"))
        assert stack.tier.kvtier_tier.store_calls == calls  # respected: the cascade was dropped
        assert detector.policy.pop_stores_dropped()[0] >= 1


@pytest.mark.skipif(
    not compat.FAILED_STORES_FEED_BACKPRESSURE,
    reason="vLLM 0.32's tiering manager feeds its detector successful stores only (no failure_threshold)",
)
def test_failed_stores_put_the_tier_under_vllm_pressure(tmp_path: Path) -> None:
    bp = {"backpressure_cls": "EMABackpressureDetector", "failure_threshold": 2}
    with vllm_stack(tiers=[{**PROBE, "fail_stores": True, "backpressure": bp}], chunks=32) as stack:
        detector = stack.tier.bp_detector
        stack.store(offload_keys(1, salt=b"f1"))
        stack.store(offload_keys(1, salt=b"f2"))
        assert detector.is_under_pressure()


def test_unknown_keyword_arguments_are_accepted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    adapter.reset_log_once()
    entry = kvtier_entry(tmp_path, future_vllm_option=1)
    with (
        caplog.at_level(logging.WARNING, logger="kvtier.integrations.vllm"),
        vllm_stack(tiers=[entry]),
        vllm_stack(tiers=[entry]),
    ):
        pass
    lines = [r.getMessage() for r in caplog.records if "future_vllm_option" in r.getMessage()]
    assert len(lines) == 1
    assert "1" not in lines[0].replace("future_vllm_option", "")  # the name, never the value


def test_tier_counters_reach_vllm_metrics(tmp_path: Path) -> None:
    keys = offload_keys(2, salt=b"metrics")
    with vllm_stack(tmp_path) as stack:
        names = stack.spec.build_metric_definitions(stack.config.extra_config)
        assert f"{adapter.METRIC_PREFIX}stores" in names
        stack.store(keys)
        with manager_lock(stack.manager):
            stats = stack.manager.get_stats()
            again = stack.manager.get_stats()
        values = stats.data["data"][f"{adapter.METRIC_PREFIX}stores"]
        assert values == {(stack.tier.kvtier_tier.name,): 2}
        # Deltas: a second poll with nothing new reports no kvtier counter.
        assert again is None or f"{adapter.METRIC_PREFIX}stores" not in again.data["data"]
        if compat.HAS_CONFIG_INFO:  # vLLM 0.33's info metric; 0.32 has none
            info = stack.manager.config_info()
            assert info[1]["kvtier_tier_type"] == "fs"


def test_shutdown_lets_vllm_unmap_its_primary_region(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), vllm_stack(tmp_path) as stack:
        stack.store(offload_keys(2, salt=b"unmap"))
    assert not [r for r in caplog.records if "Keeping" in r.getMessage()]


def test_a_kv_hints_pin_on_kvtier_tier_is_named_once_as_having_no_effect(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope
    from vllm.v1.kv_offload.base import ReqContext

    adapter.reset_log_once()
    pin = KvHintAction(action_id="k", action_type="kvtier.pin", action_version="1.0", payload={"ttl_s": 60})
    with caplog.at_level(logging.WARNING), vllm_stack(tmp_path) as stack:
        for i in range(3):  # three requests, one notice
            ctx = ReqContext(req_id=f"hinted-{i}", kv_hints=KvHintsEnvelope("0.1", f"m{i}", [pin]))
            with manager_lock(stack.manager):
                stack.manager.on_new_request(ctx)
                stack.manager.on_request_finished(ctx)
        stack.store(offload_keys(2, salt=b"hinted"))  # the tier works on as before
    notices = [r.getMessage() for r in caplog.records if "kvtier.pin" in r.getMessage()]
    assert len(notices) == 1 and "KvtierOffloadingSpec" in notices[0] and "\n" not in notices[0]


def _start_promotion(stack: Any, key: bytes, req_id: str) -> Any:
    """One request looks ``key`` up (a tier HIT: vLLM queues a promotion) and the step ends (vLLM
    submits it); returns the request's context, already reported finished."""
    from vllm.v1.kv_offload.base import ReqContext, ScheduleEndContext

    ctx = ReqContext(req_id=req_id)
    with manager_lock(stack.manager):
        stack.manager.on_new_request(ctx)
        stack.manager.lookup(key, ctx)
        stack.manager.on_schedule_end(ScheduleEndContext((req_id,), ()))
        stack.manager.on_request_finished(ctx)
    return ctx


def test_a_promotion_that_fails_after_starting_never_frees_a_chunk_still_being_written() -> None:
    # The probe's submit_load hands the job to its I/O, then raises; the I/O writes 0xEE into the
    # promotion's chunk 0.4 s later. Until then vLLM must not give that chunk to another block: on
    # vLLM 0.34 through JobResult.deferred_release, on 0.32/0.33 by holding the failed result back.
    from vllm.v1.kv_offload.base import ReqContext

    held, fresh = offload_keys(2, salt=b"late-write")
    with vllm_stack(tiers=[PROBE], chunks=1) as stack:
        stack.store([held])
        stack.wipe_primary()  # held is in the tier only; the one chunk is free
        probe = stack.tier.kvtier_tier
        probe.arm_late_write(0.4)
        _start_promotion(stack, held, "promote")
        stack.step()  # vLLM collects the failed promotion
        if compat.HAS_DEFERRED_RELEASE:  # 0.34: failed at once, its chunk kept out of the free pool
            assert stack.manager._deferred_releases and stack.manager._jobs == {}
        else:  # 0.32/0.33: the failed result waits until the late write is over
            assert stack.manager._jobs and stack.tier.has_pending_work()
        ctx = ReqContext(req_id="store-fresh")
        deadline = time.monotonic() + 20
        with manager_lock(stack.manager):
            stack.manager.on_new_request(ctx)
        while True:
            rows = stack.rows()
            with manager_lock(stack.manager):
                out = stack.manager.prepare_store([fresh], ctx)
                if out is not None:
                    writer_done = probe.late_writes_done == 1
                    (chunk,) = out.store_spec.chunk_ids
                    rows[int(chunk)] = payload(fresh, rows.shape[1])  # the GPU->CPU copy
                    stack.manager.complete_store([fresh], ctx)
                    stack.manager.on_request_finished(ctx)
            del rows
            if out is not None:
                break
            assert time.monotonic() < deadline, "the chunk never came back"
            stack.step()
            time.sleep(0.01)
        assert writer_done, "vLLM reused the chunk while the failed promotion could still write it"
        stack.settle()
        assert_exact(stack.load([fresh]), [fresh])


def test_drain_releases_every_deferred_chunk_before_it_returns() -> None:
    # vLLM 0.34's reset_cache asserts that no deferred release is pending after drain_jobs.
    (held,) = offload_keys(1, salt=b"late-drain")
    with vllm_stack(tiers=[PROBE], chunks=2) as stack:
        stack.store([held])
        stack.wipe_primary()
        probe = stack.tier.kvtier_tier
        probe.arm_late_write(0.3)
        _start_promotion(stack, held, "promote")
        stack.step()  # vLLM collects the failed promotion (0.34: with its unset event)
        stack.reset()  # drain_jobs, then vLLM's own checks
        assert probe.late_writes_done == 1
        assert stack.manager._jobs == {}
        assert not getattr(stack.manager, "_deferred_releases", None)
        assert not stack.tier.has_pending_work()


def test_a_lookup_hit_refreshes_the_block_in_the_tier_when_the_request_finishes() -> None:
    # vLLM never calls touch (0.34 removed it): the adapter takes recency from lookups, applied
    # once per request at on_request_finished, which vLLM's manager passes on to its tiers.
    keys = offload_keys(3, salt=b"recency")
    with vllm_stack(tiers=[PROBE]) as stack:
        stack.store(keys)
        stack.wipe_primary()
        probe = stack.tier.kvtier_tier
        probe.touched.clear()
        assert_exact(stack.load(keys), keys)
        stack.settle()
        assert len(probe.touched) == 1, probe.touched  # one refresh for the request
        assert sorted(probe.touched[0]) == sorted(keys)
        assert stack.tier._hits == {}
