"""Metrics collector and exporter over real HTTP on 127.0.0.1 (stats from a plain mapping).

Names, types, the real engine and the Grafana dashboard: tests/unit/test_metrics_exposition.py."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest

from kvtier.config import load_config
from kvtier.errors import KvtierError
from kvtier.metrics import exporter_from_config, start_exporter, tier_counters


def _stats() -> dict[str, Any]:
    return {
        "lookups": 100,
        "hits": 30,
        "evictions": 7,
        "dropped_stores": 1,
        "jobs_inflight": 2,  # the engine's name (Engine.stats(); kvtier.stats.EngineStats)
        "primary": {"hits": 30, "lookups": 100, "num_slots": 64, "resident": 50},
        "tiers": {
            "fs0": {
                "lookups": 70, "hits": 12, "bytes_read": 12 * 4096, "bytes_written": 60 * 4096,
                "evictions": 3, "corrupt": 1, "dropped_stores": 0, "failed_jobs": 0,
            }
        },
    }  # fmt: skip


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_tier_counters_fall_back_to_engine_totals() -> None:
    c = tier_counters(_stats())
    assert c["primary"]["evictions"] == 7 and c["primary"]["dropped_stores"] == 1
    assert c["fs0"]["bytes_read"] == 12 * 4096 and c["fs0"]["corrupt"] == 1


def test_exporter_serves_engine_counters_over_http() -> None:
    state = _stats()
    with start_exporter(lambda: state) as exp:
        assert exp.port > 0
        m = _scrape(exp.url)
        assert m["kvtier_lookups_total"] == 100
        assert m['kvtier_hits_total{tier="primary"}'] == 30
        assert m['kvtier_hits_total{tier="fs0"}'] == 12
        assert m['kvtier_bytes_total{direction="read",tier="fs0"}'] == 12 * 4096
        assert m['kvtier_corrupt_blocks_total{tier="fs0"}'] == 1
        assert m['kvtier_evictions_total{tier="primary"}'] == 7
        # An engine-wide total is its own gauge; kvtier_inflight_jobs is per tier only.
        assert m["kvtier_engine_inflight_jobs"] == 2
        assert not any(k.startswith("kvtier_inflight_jobs{") for k in m)
        assert m["kvtier_primary_slots"] == 64
        # Counters are read at scrape time: a change in the engine shows on the next scrape.
        state["tiers"]["fs0"]["hits"] = 13
        assert _scrape(exp.url)['kvtier_hits_total{tier="fs0"}'] == 13


def test_stats_failure_yields_empty_scrape_not_error() -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("engine closed")

    with start_exporter(broken) as exp:
        assert not any(k.startswith("kvtier_") for k in _scrape(exp.url))


def test_exporter_from_config_and_busy_port() -> None:
    assert exporter_from_config(_stats, load_config({})) is None
    with start_exporter(_stats) as exp:
        with pytest.raises(KvtierError, match="metrics_port"):
            start_exporter(_stats, exp.port)
        exp2 = exporter_from_config(_stats, load_config({"metrics_port": 0}))
        assert exp2 is not None
        exp2.close()
        exp2.close()
