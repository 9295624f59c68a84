"""StoreGate: latency-per-MiB EMA throttling with hysteresis, pauses, config validation, and the
counters every AsyncTier shows in get_stats (a real tier on real workers, slowed by a real sleep)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import ConfigError
from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing import PrimaryBuffer, wait_for_jobs
from kvtier.tiers.async_tier import AsyncTier, ChunkOutcome, JobState
from kvtier.tiers.backpressure import GateConfig, StoreGate

MIB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def gate(**kw: float) -> tuple[StoreGate, Clock]:
    clock = Clock()
    return StoreGate(GateConfig(**kw), clock=clock), clock  # type: ignore[arg-type]


def admitted(g: StoreGate, n: int) -> int:
    return sum(g.admit(MIB) is None for _ in range(n))


def test_open_until_the_ema_crosses_high_water_then_throttles_half() -> None:
    g, _ = gate(high_water=0.5, low_water=0.2, drop_water=2.0, alpha=1.0)
    g.observe(MIB, 0.4)
    assert g.state == "open" and admitted(g, 10) == 10
    g.observe(MIB, 0.6)
    assert g.state == "throttled" and admitted(g, 10) == 5
    assert g.counters()["gate_throttled"] == 5 and g.counters()["gate_state"] == 1
    assert g.counters()["gate_ms_per_mib"] == 600


def test_hysteresis_needs_low_water_to_reopen() -> None:
    g, _ = gate(high_water=0.5, low_water=0.2, drop_water=2.0, alpha=1.0)
    g.observe(MIB, 0.6)
    g.observe(MIB, 0.3)  # below high water, above low water: still throttled
    assert g.state == "throttled"
    g.observe(MIB, 0.1)
    assert g.state == "open" and admitted(g, 4) == 4


def test_dropping_admits_one_probe_per_interval_and_recovers() -> None:
    g, clock = gate(high_water=0.5, low_water=0.2, drop_water=1.0, alpha=1.0, probe_interval=0.5)
    g.observe(MIB, 3.0)
    assert g.state == "dropping"
    assert admitted(g, 20) == 0
    reason = g.admit(MIB)
    assert reason is not None and "ms/MiB" in reason
    clock.now += 0.6
    assert admitted(g, 20) == 1  # the probe
    g.observe(MIB, 0.05)  # the probe was fast: the medium is back
    assert g.state == "open" and admitted(g, 5) == 5


def test_small_jobs_are_judged_by_their_latency() -> None:
    g, _ = gate(alpha=1.0)  # min_bytes = 1 MiB by default
    g.observe(4096, 0.01)  # 10 ms for one 4 KiB block is fine, not 2.5 s/MiB
    assert g.state == "open" and g.counters()["gate_ms_per_mib"] == 10


def test_ema_smooths_a_single_spike() -> None:
    g, _ = gate(high_water=0.5, low_water=0.2, drop_water=2.0, alpha=0.2)
    for _ in range(10):
        g.observe(MIB, 0.01)
    g.observe(MIB, 1.5)  # one slow job: EMA ~0.31, under high water
    assert g.state == "open"


def test_pause_drops_everything_until_it_expires() -> None:
    g, clock = gate()
    g.pause(1.0, "server full")
    assert g.admit(1) == "server full" and g.paused
    clock.now = 1.01
    assert g.admit(1) is None


def test_disabled_gate_only_tracks_latency() -> None:
    g, _ = gate(enabled=False)  # type: ignore[arg-type]
    g.observe(MIB, 100.0)
    assert g.state == "open" and g.admit(MIB) is None and g.seconds_per_mib == 100.0


@pytest.mark.parametrize(
    ("options", "path"),
    [
        ({"high_water": 0}, "backpressure.high_water"),
        ({"low_water": 1.0, "high_water": 0.5}, "backpressure"),
        ({"bogus": 1}, "backpressure.bogus"),
        ({"enabled": "yes"}, "backpressure.enabled"),
    ],
)
def test_bad_config_names_the_key(options: dict[str, object], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        GateConfig.from_options(options)
    assert info.value.key_path == path


@given(st.lists(st.floats(0.0, 5.0), max_size=60))
def test_state_always_matches_the_marks(latencies: list[float]) -> None:
    """Property: after any sequence of observations the state is consistent with the EMA and the
    marks: above drop water -> dropping; above high water -> not open; below low water -> open."""
    cfg = GateConfig(high_water=0.5, low_water=0.2, drop_water=2.0, alpha=0.5)
    g = StoreGate(cfg, clock=Clock())
    for s in latencies:
        g.observe(MIB, s)
        ema = g.ema or 0.0
        if ema > cfg.drop_water:
            assert g.state == "dropping"
        elif ema > cfg.high_water:
            assert g.state == "throttled"
        elif ema < cfg.low_water:
            assert g.state == "open"


class SlowTier(AsyncTier):
    """Stores sleep ``delay`` seconds per chunk on a real worker; everything is kept in a dict."""

    def __init__(self, primary: PrimaryBuffer, gate: StoreGate) -> None:
        super().__init__(
            primary_kv_view=primary.view, context=primary.context("slow"), threads=1, store_gate=gate
        )
        self.delay = 0.0
        self.blocks: dict[BlockKey, bytes] = {}

    def lookup(self, key: BlockKey, req_context: object = None) -> LookupResult:
        return LookupResult.HIT if key in self.blocks else LookupResult.MISS

    def _store_chunk(self, state: JobState, items: list[tuple[BlockKey, int]]) -> ChunkOutcome:
        time.sleep(self.delay)
        for k, s in items:
            self.blocks[k] = self.slot_array(s).tobytes()
        return ChunkOutcome(done=[k for k, _ in items], nbytes=len(items) * self.block_bytes)


def test_a_slow_tier_is_throttled_visibly_in_stats() -> None:
    """A real AsyncTier whose stores get slow (real sleeps) drops stores, counts them in
    ``dropped_stores`` and shows the gate in ``get_stats()``; when it is fast again stores flow."""
    primary = PrimaryBuffer.heap(4, 4096, 4096)
    cfg = GateConfig(
        high_water=20.0, low_water=10.0, drop_water=40.0, alpha=1.0, probe_interval=0.05, min_bytes=1
    )  # marks far above what a 4 KiB store costs on a loaded machine (20 s/MiB = 78 ms per store)
    tier = SlowTier(primary, StoreGate(cfg))
    try:
        ids = iter(range(1, 1000))

        def store(i: int) -> bool:
            job = TransferJob(next(ids), [BlockKey(f"k{i}".encode())], [0])
            tier.submit_store(job)
            return wait_for_jobs(tier, [job.job_id], timeout=10)[job.job_id].success

        assert store(0)
        assert tier.get_stats()["gate_state"] == 0
        tier.delay = 0.5  # 4096 bytes in 500 ms = 128 s/MiB: over the drop mark
        assert store(1)
        stats = tier.get_stats()
        assert stats["gate_state"] == 2 and stats["gate_ms_per_mib"] > 40000
        assert not store(2)
        assert tier.get_stats()["dropped_stores"] == 1 and tier.get_stats()["gate_throttled"] == 1
        tier.delay = 0.0
        deadline = time.monotonic() + 5
        while tier.get_stats()["gate_state"] != 0 and time.monotonic() < deadline:
            store(3)  # a probe gets through every probe_interval and brings the EMA down
            time.sleep(0.06)
        assert tier.get_stats()["gate_state"] == 0 and store(4)
    finally:
        tier.shutdown()
