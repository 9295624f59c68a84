"""Engine observability and the cost gate: per-tier transfer seconds/jobs, the cost model's promotion
gate, and the Prometheus exporter started by ``metrics_port``.

Real parts: the ``example`` tier (copies bytes), the ``fs`` tier in a temporary directory, the LRU
policy, a real HTTP server on 127.0.0.1 scraped with ``urllib``.
"""

from __future__ import annotations

import logging
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from needs import need_module

from kvtier.costmodel import CostModel
from kvtier.engine import Engine
from kvtier.errors import ConfigError
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.metrics import tier_counters
from kvtier.tiers.base import TierContext
from kvtier.tiers.example import ExampleTier

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING
BLOCK = 4096
TPB = 16  # tokens per block in the cost models below
PREFILL = 1e-4  # seconds per token: recomputing one block costs 1.6 ms


def K(i: int) -> BlockKey:
    return BlockKey(b"obs-%08d" % i)


def data_for(keys: list[BlockKey]) -> np.ndarray:
    out = np.empty((len(keys), BLOCK), dtype=np.uint8)
    for i, k in enumerate(keys):
        out[i] = np.frombuffer((k * (BLOCK // len(k) + 1))[:BLOCK], dtype=np.uint8)
    return out


def cfg(slots: int, **extra: Any) -> dict[str, Any]:
    return {"cpu_bytes_to_use": slots * BLOCK, "block_bytes": BLOCK, **extra}


class RecordingTier(ExampleTier):
    """The example tier, keeping every result it reports (to compare the engine's sums with)."""

    def __init__(self, *, primary_kv_view: memoryview, context: TierContext) -> None:
        super().__init__(primary_kv_view=primary_kv_view, context=context)
        self.reported: list[JobResult] = []
        self.load_ids: set[int] = set()

    def submit_load(self, job: TransferJob) -> None:
        self.load_ids.add(job.job_id)
        super().submit_load(job)

    def get_finished_jobs(self) -> list[JobResult]:
        out = super().get_finished_jobs()
        self.reported += out
        return out


def evict_to_tier(e: Engine, keys: list[BlockKey]) -> None:
    """Store ``keys`` (write-through to every tier), then empty the primary tier."""
    assert e.store_blocks(keys, data_for(keys)) == len(keys)
    e.drain()
    e.reset()


# -- 1. per-tier read/write seconds and job counts ------------------------------------------------
def test_tier_seconds_and_jobs_are_sums_of_the_tiers_job_results() -> None:
    tiers: list[RecordingTier] = []

    def factory(view: memoryview) -> RecordingTier:
        tiers.append(RecordingTier(primary_kv_view=view, context=TierContext("rec0", BLOCK)))
        return tiers[-1]

    with Engine(cfg(8), tiers=[factory]) as e:
        st0 = e.stats()["tiers"]["rec0"]
        io_keys = ("read_seconds", "write_seconds", "read_jobs", "write_jobs")
        assert [st0[k] for k in io_keys] == [0, 0, 0, 0] and st0["promotions_skipped_cost"] == 0
        keys = [K(i) for i in range(6)]
        e.store_blocks(keys[:3], data_for(keys[:3]))
        e.store_blocks(keys[3:], data_for(keys[3:]))
        e.drain()
        e.reset()
        assert e.lookup(keys[:4]).results == [PENDING] * 4  # one promotion job
        e.drain()
        tier = tiers[0]
        reads = [r.seconds for r in tier.reported if r.job_id in tier.load_ids]
        writes = [r.seconds for r in tier.reported if r.job_id not in tier.load_ids]
        st = e.stats()["tiers"]["rec0"]
        assert st["write_jobs"] == 2 and st["read_jobs"] == 1
        assert len(reads) == 1 and len(writes) == 2
        assert st["read_seconds"] == pytest.approx(sum(reads))
        assert st["write_seconds"] == pytest.approx(sum(writes))
        assert st["write_seconds"] > 0 and st["read_seconds"] > 0
        # The tier's own counters are still there, and the metrics module reads the new keys.
        assert st["stores"] == 6 and st["loads"] == 4
        c = tier_counters(e.stats())["rec0"]
        assert c["read_seconds"] == st["read_seconds"] and c["write_seconds"] == st["write_seconds"]


def test_fs_tier_reports_read_and_write_seconds(tmp_path: Path) -> None:
    tier_cfg = {"type": "fs", "root_dir": str(tmp_path / "kv"), "threads": 2}
    with Engine(cfg(16, secondary_tiers=[tier_cfg])) as e:
        keys = [K(i) for i in range(8)]
        evict_to_tier(e, keys)
        st = e.stats()["tiers"]["fs0"]
        assert st["write_jobs"] >= 1 and st["write_seconds"] > 0
        assert st["read_jobs"] == 0 and st["read_seconds"] == 0
        assert e.lookup(keys).results == [PENDING] * 8
        e.drain()
        out = np.zeros((8, BLOCK), np.uint8)
        assert e.load_blocks(keys, out) == 8 and np.array_equal(out, data_for(keys))
        st = e.stats()["tiers"]["fs0"]
        assert st["read_jobs"] == 1 and st["read_seconds"] > 0
        assert st["bytes_written"] >= 8 * BLOCK and st["loads"] == 8


def test_stats_keep_engine_counters_when_a_tier_get_stats_fails() -> None:
    class NoStats(ExampleTier):
        def get_stats(self) -> dict[str, int]:
            raise RuntimeError("stats backend down")

    with Engine(cfg(4), tiers=[lambda v: NoStats(primary_kv_view=v, context=TierContext("ns0", BLOCK))]) as e:
        e.store_blocks([K(1)], data_for([K(1)]))
        e.drain()
        assert e.stats()["tiers"]["ns0"]["write_jobs"] == 1
        assert e.stats()["tier_errors"] >= 1  # the failure is counted (after the snapshot above)


# -- 2. the cost gate ------------------------------------------------------------------------------
def cost_cfg(tiers: dict[str, dict[str, Any]], slots: int = 8, ntiers: int = 1) -> dict[str, Any]:
    return cfg(
        slots,
        secondary_tiers=[{"type": "example"}] * ntiers,
        cost_model={"prefill_seconds_per_token": PREFILL, "tokens_per_block": TPB, "tiers": tiers},
    )


def test_no_cost_model_means_no_gate() -> None:
    with Engine(cfg(4, secondary_tiers=[{"type": "example"}])) as e:
        assert e.admission.cost is None
    # A cost model without tiers to gate is not built either.
    with Engine(cfg(4, cost_model={"tokens_per_block": TPB})) as e:
        assert e.admission.cost is None


def test_tier_slower_than_recompute_is_skipped_miss_and_counted() -> None:
    # 1 kB/s: a 4 KiB block takes 4 s to load versus 1.6 ms to recompute.
    with Engine(cost_cfg({"example0": {"load_bandwidth": 1000, "load_latency": 0.0}})) as e:
        assert e.admission.cost is not None and e.admission.cost.min_blocks_to_load("example0") is None
        keys = [K(i) for i in range(5)]
        evict_to_tier(e, keys)
        submitted = e.stats()["jobs_submitted"]
        rep = e.lookup(keys)
        assert rep.results == [MISS] * 5 and rep.pending == 0
        st = e.stats()
        assert st["promotions_skipped_cost"] == 5 and st["promotions"] == 0 and st["misses"] == 5
        assert st["jobs_submitted"] == submitted  # no load job was started
        t = st["tiers"]["example0"]
        assert t["hits"] == 5 and t["read_jobs"] == 0 and t["promotions_skipped_cost"] == 5


def test_tier_faster_than_recompute_is_promoted() -> None:
    with Engine(cost_cfg({"example0": {"load_bandwidth": "10GB", "load_latency": 1e-5}})) as e:
        keys = [K(i) for i in range(5)]
        evict_to_tier(e, keys)
        assert e.lookup(keys).results == [PENDING] * 5
        e.drain()
        assert e.lookup(keys).results == [HIT] * 5
        st = e.stats()
        assert st["promotions_skipped_cost"] == 0 and st["promotions"] == 5
        assert st["tiers"]["example0"]["read_jobs"] == 1


def test_latency_bound_tier_is_loaded_only_in_batches_that_pay() -> None:
    # Transfer is free, each job costs 4 ms: 3 blocks (4.8 ms of prefill) pay, 2 (3.2 ms) do not.
    with Engine(cost_cfg({"example0": {"load_bandwidth": 1e15, "load_latency": 4e-3}})) as e:
        assert e.admission.cost is not None and e.admission.cost.min_blocks_to_load("example0") == 3
        keys = [K(i) for i in range(5)]
        evict_to_tier(e, keys)
        assert e.lookup(keys[:2]).results == [MISS, MISS]
        assert e.lookup(keys[2:]).results == [PENDING] * 3
        st = e.stats()
        assert st["promotions_skipped_cost"] == 2 and st["promotions_inflight"] == 1


def test_a_skipped_tier_falls_through_to_the_next_tier() -> None:
    tiers = {
        "example0": {"load_bandwidth": 1000, "load_latency": 0.0},  # never pays
        "example1": {"load_bandwidth": "10GB", "load_latency": 1e-5},
    }
    with Engine(cost_cfg(tiers, ntiers=2)) as e:
        keys = [K(i) for i in range(4)]
        evict_to_tier(e, keys)
        assert e.lookup(keys).results == [PENDING] * 4
        assert [(ev.kind, ev.tier) for ev in e.poll()] == [("promoted", "example1")]
        out = np.zeros((4, BLOCK), np.uint8)
        assert e.load_blocks(keys, out) == 4 and np.array_equal(out, data_for(keys))
        st = e.stats()
        t0, t1 = st["tiers"]["example0"], st["tiers"]["example1"]
        assert st["promotions_skipped_cost"] == t0["promotions_skipped_cost"] == 4
        assert t1["promotions_skipped_cost"] == 0
        assert t0["read_jobs"] == 0 and t1["read_jobs"] == 1


def test_tiers_not_named_in_the_model_use_their_medium_defaults() -> None:
    with Engine(cost_cfg({})) as e:
        cm = e.admission.cost
        assert cm is not None and cm.tier("example0").source == "default"
        # CPU default (5 GB/s, 10 us) loads one 4 KiB block far faster than 1.6 ms of prefill.
        assert cm.min_blocks_to_load("example0") == 1


def test_bad_cost_model_is_a_config_error_naming_the_key() -> None:
    bad = cost_cfg({"example0": {"load_bandwidth": "fast"}})
    with pytest.raises(ConfigError, match=r"cost_model\.tiers\.example0\.load_bandwidth"):
        Engine(bad)


@settings(max_examples=60, deadline=None)
@given(
    latency=st.floats(0.0, 0.02),
    bandwidth=st.floats(1e5, 1e10),
    n=st.integers(1, 12),
)
def test_engine_promotes_exactly_when_the_model_says_loading_is_faster(
    latency: float, bandwidth: float, n: int
) -> None:
    tiers = {"example0": {"load_bandwidth": bandwidth, "load_latency": latency}}
    config = cost_cfg(tiers, slots=16)
    cm = CostModel(PREFILL, TPB, BLOCK)  # the oracle: the model's two costs, compared directly
    load = latency + n * BLOCK / bandwidth
    recompute = cm.recompute_seconds(n)
    if abs(load - recompute) <= 1e-9 * recompute:
        return  # a tie to the last bit: either answer is right
    with Engine(config) as e:
        keys = [K(i) for i in range(n)]
        evict_to_tier(e, keys)
        rep = e.lookup(keys)
        expect = PENDING if load < recompute else MISS
        assert rep.results == [expect] * n
        assert e.stats()["promotions_skipped_cost"] == (0 if expect is PENDING else n)


@pytest.mark.slow
def test_replay_real_and_simulate_agree_with_the_cost_gate(tmp_path: Path) -> None:
    """The gate sits in the engine, so simulate mode (modelled tiers, same names and media) takes the
    same decisions as real mode with a real fs tier: same hits per tier, same skips."""
    from kvtier.config import load_config
    from kvtier.keys import KeyNamespace
    from kvtier.sim.defaults import default_config, shipped_trace
    from kvtier.sim.replay import prepare_trace, replay
    from kvtier.sim.trace import read_trace

    raw = default_config(tmp_path / "fs0", block_bytes=2048)
    raw["cpu_bytes_to_use"] = 300 * 4096  # small primary: the fs tier serves hits
    raw["write_policy"] = "write_through"
    # One I/O thread: the fs tier indexes a job's blocks in key order, as the model does.
    # One file per block (small_block_bytes 0): the model is exact for that path (docs/fs.md).
    raw["secondary_tiers"] = [
        dict(raw["secondary_tiers"][0], max_bytes=2000 * 6144, threads=1, small_block_bytes=0)
    ]
    # 0.41 s per fs job and free transfer: a batch pays from 9 blocks (51.2 ms of prefill each).
    raw["cost_model"] = {
        "tokens_per_block": 512,
        "tiers": {"fs0": {"load_bandwidth": 1e12, "load_latency": 0.41}},
    }
    config = load_config(raw)
    with shipped_trace() as path:
        requests = read_trace(path, limit=1000)
    trace = prepare_trace(requests, KeyNamespace.from_config(config, block_size=512))
    skipped: dict[str, int] = {}

    def hook(engine: Engine, done: int, exporter: object) -> None:
        mode = "simulate" if engine.primary.backing == "none" else "real"
        skipped[mode] = engine.stats()["promotions_skipped_cost"]

    real = replay(trace, config, sync=True, hook=hook)
    sim = replay(trace, config, simulate=True, hook=hook)
    assert skipped["real"] > 0  # the gate took decisions on this trace
    assert skipped["real"] == skipped["simulate"]
    assert [(t.name, t.hits) for t in real.tiers] == [(t.name, t.hits) for t in sim.tiers]
    assert real.hit_ratio == sim.hit_ratio and real.verify_mismatches == 0


# -- 3. the Prometheus exporter started by metrics_port --------------------------------------------
def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_metrics_port_serves_the_engine_stats_until_close() -> None:
    need_module("prometheus_client", "cli")
    e = Engine(cfg(4, secondary_tiers=[{"type": "example"}], metrics_port=0))
    try:
        exp = e.metrics_exporter
        assert exp is not None and exp.addr == "127.0.0.1" and exp.port > 0
        keys = [K(i) for i in range(6)]
        for batch in (keys[:3], keys[3:]):  # 6 blocks through 4 slots: 2 evicted
            assert e.store_blocks(batch, data_for(batch)) == 3
            e.drain()
        e.reset()
        e.lookup(keys[:3])
        e.drain()
        st = e.stats()
        got = scrape(exp.url)
        t = st["tiers"]["example0"]
        assert got[("kvtier_lookups_total", ())] == st["lookups"]
        assert got[("kvtier_hits_total", (("tier", "example0"),))] == t["hits"] == 3
        for direction, key in (("read", "read_seconds"), ("write", "write_seconds")):
            sample = ("kvtier_transfer_seconds_total", (("direction", direction), ("tier", "example0")))
            assert got[sample] == pytest.approx(t[key]) and t[key] > 0
        assert got[("kvtier_bytes_total", (("direction", "write"), ("tier", "example0")))] == 6 * BLOCK
        url = exp.url
    finally:
        e.close()
    assert e.metrics_exporter is None
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)


def test_missing_prometheus_client_logs_one_warning_and_the_engine_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # `import prometheus_client` fails
    with caplog.at_level(logging.WARNING, logger="kvtier"), Engine(cfg(4, metrics_port=0)) as e:
        assert e.metrics_exporter is None
        e.store_blocks([K(1)], data_for([K(1)]))
        assert e.lookup([K(1)]).results == [HIT]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "metrics_port 0" in warnings[0].getMessage()
    assert "prometheus_client" in warnings[0].getMessage()


def test_a_taken_metrics_port_logs_a_warning_and_the_engine_runs(caplog: pytest.LogCaptureFixture) -> None:
    need_module("prometheus_client", "cli")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="kvtier"), Engine(cfg(4, metrics_port=port)) as e:
            assert e.metrics_exporter is None
            assert e.lookup([K(1)]).results == [MISS]
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(msgs) == 1 and f"metrics_port {port}" in msgs[0]
