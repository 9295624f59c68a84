"""The engine's latency histograms and per-tier totals in ``stats()``: in-flight jobs, errors,
promotions, fs used/max bytes, the primary tier's timed copies.

Real parts: the engine with a real ``fs`` tier in ``tmp_path`` and the ``example`` tier (both copy
real bytes), real threads for the concurrency check. The one fault is injected into a real example
tier (its lookup raises), since no healthy tier raises on demand.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.engine import Engine
from kvtier.engine.latency import BOUNDS, Histogram
from kvtier.keys import BlockKey, LookupResult
from kvtier.tiers.base import TierContext
from kvtier.tiers.example import ExampleTier
from kvtier.transfer.movers import KVLayout

BLOCK = 4096
FS_MAX = 1 << 20


def K(i: int) -> BlockKey:
    return BlockKey(b"lat-%06d" % i)


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, BLOCK), dtype=np.uint8)


def two_tiers(tmp_path: Path, slots: int = 4) -> dict[str, Any]:
    return {
        "cpu_bytes_to_use": slots * BLOCK, "block_bytes": BLOCK,
        "secondary_tiers": [
            {"type": "fs", "root_dir": str(tmp_path / "fs"), "max_bytes": FS_MAX},
            {"type": "example"},
        ],
    }  # fmt: skip


# -- the histogram -------------------------------------------------------------------------------


def test_bounds_are_increasing_and_span_microseconds_to_tens_of_seconds() -> None:
    assert list(BOUNDS) == sorted(set(BOUNDS))
    assert BOUNDS[0] == 1e-6 and BOUNDS[-1] == 50.0


def test_snapshot_is_cumulative_le_inclusive_with_inf_last() -> None:
    h = Histogram()
    for v in (1e-6, 1.5e-6, 0.01, 0.0100001, 120.0, -3.0):
        h.observe(v)
    snap = h.snapshot()
    b = dict((le, n) for le, n in snap["buckets"])
    assert snap["buckets"][-1] == [math.inf, 6] and snap["count"] == 6
    assert b[1e-6] == 2  # -3 counts as 0, 1e-6 lies on its bound (le: less or equal)
    assert b[2.5e-6] == 3 and b[0.01] == 4 and b[0.025] == 5 and b[50.0] == 5
    assert snap["sum"] == pytest.approx(1e-6 + 1.5e-6 + 0.01 + 0.0100001 + 120.0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.0, 200.0, allow_nan=False), max_size=60))
def test_every_bucket_counts_the_durations_at_or_below_its_bound(values: list[float]) -> None:
    h = Histogram()
    for v in values:
        h.observe(v)
    snap = h.snapshot()
    for le, n in snap["buckets"]:
        assert n == sum(1 for v in values if v <= le)
    assert snap["count"] == len(values) and snap["sum"] == pytest.approx(sum(values))


def test_concurrent_observers_lose_no_count() -> None:
    h = Histogram(threading.Lock())  # as the primary load/store histograms the copy workers share
    per, workers = 5000, 4

    def run() -> None:
        for i in range(per):
            h.observe(i * 1e-6)

    threads = [threading.Thread(target=run) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = h.snapshot()
    assert snap["count"] == per * workers == snap["buckets"][-1][1]
    assert snap["sum"] == pytest.approx(workers * sum(i * 1e-6 for i in range(per)))


# -- a real engine ---------------------------------------------------------------------------------


def test_stats_carry_every_histogram_and_tier_total_before_any_traffic(tmp_path: Path) -> None:
    with Engine(two_tiers(tmp_path)) as e:
        st_ = e.stats()
    lat = st_["latency"]
    assert set(lat) == {"primary", "fs0", "example1"}
    assert set(lat["primary"]) == {"lookup", "load", "store"}
    assert set(lat["fs0"]) == set(lat["example1"]) == {"load", "store"}
    for ops in lat.values():
        for h in ops.values():
            assert h["count"] == 0 and h["sum"] == 0.0
            assert [le for le, _ in h["buckets"]] == [*BOUNDS, math.inf]
    for name in ("fs0", "example1"):
        t = st_["tiers"][name]
        assert t["inflight_jobs"] == t["errors"] == t["promotions"] == t["deferred_stores"] == 0
    assert st_["tiers"]["fs0"]["max_bytes"] == FS_MAX and st_["tiers"]["fs0"]["used_bytes"] == 0
    assert st_["primary"]["inflight_jobs"] == 0
    # Nothing was copied: no primary transfer time is reported (not a constant 0).
    assert "read_seconds" not in st_["primary"] and "write_seconds" not in st_["primary"]


def test_jobs_are_timed_from_submission_to_result_per_tier(tmp_path: Path) -> None:
    with Engine(two_tiers(tmp_path)) as e:
        assert e.store_blocks([K(i) for i in range(4)], rows(4)) == 4
        # Write-through: one store job per tier, submitted, not reported until the engine polls.
        mid = e.stats()
        assert mid["tiers"]["fs0"]["inflight_jobs"] == mid["tiers"]["example1"]["inflight_jobs"] == 1
        assert mid["jobs_inflight"] == 2
        time.sleep(0.03)
        e.drain()
        st_ = e.stats()
    lat = st_["latency"]
    for name in ("fs0", "example1"):
        store = lat[name]["store"]
        assert store["count"] == 1 and st_["tiers"][name]["inflight_jobs"] == 0
        # The job's result was collected after the 30 ms sleep: the engine saw it take that long.
        assert store["sum"] >= 0.03
        assert dict((le, n) for le, n in store["buckets"])[0.025] == 0
        assert lat[name]["load"]["count"] == 0
    assert lat["primary"]["store"]["count"] == 1 and lat["primary"]["store"]["sum"] > 0
    assert st_["primary"]["write_seconds"] == lat["primary"]["store"]["sum"]
    assert st_["primary"]["write_jobs"] == 1
    # The fs tier's bytes on disk (its accounting) and capacity, next to what its index holds.
    fs = st_["tiers"]["fs0"]
    assert fs["used_bytes"] == fs["index_bytes"] > 4 * BLOCK and fs["max_bytes"] == FS_MAX


def test_promotions_loads_and_lookups_are_counted_where_they_happen(tmp_path: Path) -> None:
    with Engine(two_tiers(tmp_path)) as e:
        first, second = [K(i) for i in range(4)], [K(i) for i in range(4, 8)]
        e.store_blocks(first, rows(4, 1))
        e.drain()
        e.store_blocks(second, rows(4, 2))  # evicts `first` from the 4-slot primary tier
        e.drain()
        rep = e.lookup(first)
        assert all(r == LookupResult.HIT_PENDING for r in rep.results)
        before = e.stats()
        assert before["tiers"]["fs0"]["inflight_jobs"] == 1 and before["promotions_inflight"] == 1
        e.drain()
        out = np.empty((4, BLOCK), dtype=np.uint8)
        assert e.load_blocks(first, out) == 4
        np.testing.assert_array_equal(out, rows(4, 1))
        st_ = e.stats()
    fs, ex = st_["tiers"]["fs0"], st_["tiers"]["example1"]
    # The first tier that holds a key serves it: every promotion came from fs0.
    assert fs["promotions"] == 4 and ex["promotions"] == 0
    assert fs["promotions"] + ex["promotions"] == st_["promotions"]
    assert fs["promotions_failed"] == 0
    lat = st_["latency"]
    assert lat["fs0"]["load"]["count"] == 1 and lat["example1"]["load"]["count"] == 0
    assert lat["primary"]["lookup"]["count"] == st_["lookup_calls"] == 1
    assert lat["primary"]["load"]["count"] == 1 and st_["primary"]["read_jobs"] == 1
    assert st_["primary"]["read_seconds"] == lat["primary"]["load"]["sum"] > 0


class RaisingLookupTier(ExampleTier):
    """The example tier whose lookup raises (a tier bug or a dead backend)."""

    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        raise ConnectionError("backend gone")


def test_tier_errors_are_counted_per_tier(tmp_path: Path) -> None:
    def bad(view: memoryview) -> ExampleTier:
        return RaisingLookupTier(primary_kv_view=view, context=TierContext("bad", BLOCK))

    def good(view: memoryview) -> ExampleTier:
        return ExampleTier(primary_kv_view=view, context=TierContext("good", BLOCK))

    with Engine({"cpu_bytes_to_use": 4 * BLOCK, "block_bytes": BLOCK}, tiers=[bad, good]) as e:
        rep = e.lookup([K(1), K(2)])
        assert all(r == LookupResult.MISS for r in rep.results)
        st_ = e.stats()
    assert st_["tiers"]["bad"]["errors"] >= 1 and st_["tiers"]["good"]["errors"] == 0
    assert st_["tiers"]["bad"]["errors"] == st_["tier_errors"]


def test_primary_copies_on_transfer_workers_are_timed_and_in_flight(tmp_path: Path) -> None:
    kv = np.zeros((8, BLOCK), dtype=np.uint8)
    kv[:] = rows(8, 3)
    layout = KVLayout([kv])
    with Engine({"cpu_bytes_to_use": 8 * BLOCK, "block_bytes": BLOCK}) as e:
        keys = [K(i) for i in range(8)]
        job = e.submit_store_kv(keys, layout, list(range(8)))
        assert job is not None
        e.drain()
        st_ = e.stats()
        assert [r.success for r in e.poll_transfers()] == [True]
    assert st_["primary"]["inflight_jobs"] == 0
    assert st_["latency"]["primary"]["store"]["count"] == 1
    assert st_["primary"]["write_seconds"] > 0
