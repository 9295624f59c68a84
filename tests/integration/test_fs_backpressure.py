"""Back-pressure on the fs tier: the same latency gate as every other tier (:mod:`kvtier.tiers.backpressure`).

A real FsTier writes real files on real worker threads. A disk that is slow on demand cannot be made
here without privileges, so the slow disk is the tier's own write seam (``_write_file``, the one
fault-injection tests override) sleeping before it writes the real file: a store job then really
takes that long, exactly as it would on a saturated disk, and the gate sees it through the normal
report path. The marks are small (tenths of a second per job of small blocks; ``min_bytes`` = 1 MiB
so a job is judged by its latency) and the delays sit well inside each band, so a loaded machine
(slower real writes) cannot move a phase into the wrong state.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import pytest
from needs import need_module

from kvtier.config import load_config
from kvtier.errors import ConfigError
from kvtier.keys import BlockKey
from kvtier.plugins.factories import create_tier
from kvtier.tiers.fs import FsTier

BLOCK = 4096
#: Throttle above 0.6 s a job, drop above 2 s, reopen under 0.3 s; the newest job is the EMA.
MARKS = {"high_water": 0.6, "low_water": 0.3, "drop_water": 2.0, "alpha": 1.0, "probe_interval": 0.5}


class _SlowDiskTier(FsTier):
    """An fs tier whose disk takes ``delay`` seconds per block file (then writes it for real)."""

    delay = 0.0

    def _write_file(self, tmp: str, key: BlockKey, slot: int) -> None:
        time.sleep(self.delay)
        super()._write_file(tmp, key, slot)


def _slow_tier(primary: h.PrimaryBuffer, root: Path, **options: Any) -> _SlowDiskTier:
    ctx = h.TierContext(name="fs", block_bytes=primary.block_bytes, namespace=h.NAMESPACE)
    return _SlowDiskTier(
        primary_kv_view=primary.view, context=ctx, root_dir=str(root), precreate_dirs=False,
        threads=1, small_block_bytes=0, **options,
    )  # fmt: skip  # one file per block: the slowed seam is the per-file write


def test_a_slow_disk_is_throttled_then_dropped_then_recovers_with_hysteresis(tmp_path: Path) -> None:
    primary = h.aligned_primary(4, BLOCK)
    tier = _slow_tier(primary, tmp_path, backpressure=MARKS)
    n = iter(range(1_000_000))

    def store() -> bool:
        return h.store(tier, primary, [h.key_of(f"b{next(n)}")], timeout=30).success

    def until(state: int) -> None:
        deadline = time.monotonic() + 30
        while tier.get_stats()["gate_state"] != state and time.monotonic() < deadline:
            time.sleep(0.55)  # past probe_interval: this store is a probe if dropping
            store()
        assert tier.get_stats()["gate_state"] == state

    try:
        until(0)  # a first store on a loaded machine may be slow (worker start, first directories)
        tier.delay = 1.0  # a job takes >= 1 s: over high water, 1 s under the drop mark
        assert store()
        stats = tier.get_stats()
        assert stats["gate_state"] in (1, 2) and stats["gate_ms_per_mib"] >= 1000
        if stats["gate_state"] == 1:  # throttled: half of the stores pass (deterministic credit)
            outcomes = [store() for _ in range(2)]
            assert outcomes.count(False) >= 1
        tier.delay = 2.5  # over the drop mark: every store but the probes is dropped
        until(2)
        dropped = tier.get_stats()["dropped_stores"]
        assert not store()  # within probe_interval of the last probe: dropped at once
        stats = tier.get_stats()
        assert stats["dropped_stores"] == dropped + 1 and stats["gate_throttled"] >= 2
        # Hysteresis: a job between low and high water (0.45 s) does not reopen the gate.
        tier.delay = 0.45
        time.sleep(0.55)
        assert store()  # the probe, slow enough to stay over low water
        assert tier.get_stats()["gate_state"] != 0
        tier.delay = 0.0  # the disk is fast again: probes bring the EMA under low water
        until(0)
        assert store() and store()  # open: every store is admitted again
    finally:
        tier.shutdown()


def test_tiny_marks_in_config_drop_real_stores_visibly_in_stats_and_metrics(tmp_path: Path) -> None:
    """Through the config: marks no real disk can meet (1 us a job) drop real, unslowed stores
    after the first one, visibly in ``get_stats()`` and the Prometheus families; a bad mark names
    its key."""
    need_module("prometheus_client", "metrics")  # the metrics extra (fails under CI=true)
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from kvtier.metrics import register_collector

    tiny = {"high_water": 1e-6, "low_water": 1e-7, "drop_water": 2e-6, "probe_interval": 60.0}
    entry = {"type": "fs", "root_dir": str(tmp_path / "t"), "precreate_dirs": False, "backpressure": tiny}
    cfg = load_config({"block_bytes": BLOCK, "cpu_bytes_to_use": 1 << 20, "secondary_tiers": [entry]})
    primary = h.aligned_primary(4, BLOCK)
    ctx = h.TierContext(name="fs", block_bytes=BLOCK, namespace=h.NAMESPACE)
    tier = create_tier(cfg.secondary_tiers[0], primary_kv_view=primary.view, context=ctx)
    assert isinstance(tier, FsTier)
    try:
        assert h.store(tier, primary, [h.key_of("first")]).success  # the gate starts open
        second = h.store(tier, primary, [h.key_of("second")])
        assert not second.success and "back-pressure" in (second.error or "")
        stats = tier.get_stats()
        assert stats["gate_state"] == 2 and stats["gate_throttled"] == 1 and stats["dropped_stores"] == 1
        reg = CollectorRegistry()
        register_collector(lambda: {"tiers": {"fs": tier.get_stats()}}, reg)
        got = {
            (s.name, tuple(s.labels.items())): s.value
            for fam in text_string_to_metric_families(generate_latest(reg).decode())
            for s in fam.samples
        }
        assert got[("kvtier_store_gate_state", (("tier", "fs"),))] == 2
        assert got[("kvtier_store_gate_throttled_total", (("tier", "fs"),))] == 1
    finally:
        tier.shutdown()
    with pytest.raises(ConfigError) as err:
        create_tier({**entry, "backpressure": {"high_watr": 1}}, primary_kv_view=primary.view, context=ctx)
    assert "backpressure.high_watr" in str(err.value)
