"""The mooncake tier when its segment holder dies mid-run and comes back.

The master keeps a dead holder's objects listed (``is_exist`` says yes) for ``client_ttl`` (~10 s)
and its ``health_check`` stays fine, so the tier must find the death from job outcomes: loads fail
within a few deadlines, the breaker opens, lookups answer MISS long before the master notices, no
call on the engine's thread blocks, and once the holder is back new blocks round-trip again."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mooncake_servers import LOOPBACK_ENV, MooncakeStore, raw_client
from needs import need_module

from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing import PrimaryBuffer, wait_for_jobs

need_module("mooncake.store", "mooncake")

from kvtier.tiers.mooncake import MooncakeTier  # noqa: E402

DEADLINE = 1.0
OPTS: dict[str, Any] = {"op_timeout": DEADLINE, "breaker_failures": 2, "breaker_reset": 0.5, "threads": 2}
ENGINE_CALL = 0.05  # seconds: an engine-thread call never waits on the store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MooncakeStore]:
    os.environ.update(LOOPBACK_ENV)
    s = MooncakeStore(tmp_path / "mc", segment="64MB")
    yield s
    s.stop()


class Driver:
    """Submits jobs like an engine and times every call made on the "engine thread"."""

    def __init__(self, tier: MooncakeTier) -> None:
        self.tier = tier
        self.ids = itertools.count(1)
        self.slowest = 0.0

    def timed(self, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self.slowest = max(self.slowest, time.perf_counter() - t0)
        return out

    def run(self, keys: list[BlockKey], slots: list[int], *, load: bool) -> JobResult:
        job = TransferJob(next(self.ids), keys, np.asarray(slots, dtype=np.int32), is_promotion=load)
        t0 = time.monotonic()
        self.timed(self.tier.submit_load if load else self.tier.submit_store, job)
        result = wait_for_jobs(self.tier, [job.job_id], timeout=30)[job.job_id]
        # Every job is reported within a few deadlines, whatever the holder does.
        assert time.monotonic() - t0 < 3 * DEADLINE + 1.0
        return result

    def lookup(self, key: BlockKey) -> LookupResult:
        answer: LookupResult = self.timed(self.tier.lookup, key)
        return answer


def keys(tag: str, n: int) -> list[BlockKey]:
    return [BlockKey(f"{tag}{i}".encode()) for i in range(n)]


def test_holder_killed_mid_run_then_restarted(store: MooncakeStore) -> None:
    primary = PrimaryBuffer.heap(16, 8192, 5000)
    written = primary.fill_random(range(4), seed=21)
    cfg = store.tier_config(key_prefix="faults", **OPTS)
    del cfg["type"]
    tier = MooncakeTier(primary_kv_view=primary.view, context=primary.context("mooncake"), **cfg)  # type: ignore[arg-type]
    drv = Driver(tier)
    raw = raw_client(store)
    try:
        before = keys("before", 4)
        assert drv.run(before, [0, 1, 2, 3], load=False).success
        assert all(drv.lookup(k) is LookupResult.HIT for k in before)

        store.kill_holder()
        t0 = time.monotonic()
        while drv.lookup(before[0]) is LookupResult.HIT:
            assert not drv.run(before[:2], [8, 9], load=True).success  # no phantom hit is served
            assert time.monotonic() - t0 < 8, "the dead holder was not noticed from job outcomes"
        noticed = time.monotonic() - t0
        # The master had not noticed yet: its answer is the phantom the tier must not trust.
        assert raw.is_exist(f"faults/kvtier-test/{before[0].hex()}") == 1, noticed
        assert tier.get_stats()["breaker_opens"] >= 1
        assert all(drv.lookup(k) is LookupResult.MISS for k in before)
        assert not drv.run(keys("down", 2), [4, 5], load=False).success  # dropped, reported at once
        assert tier.get_stats()["dropped_stores"] >= 2

        store.start_holder()
        after = keys("after", 4)
        fresh = primary.fill_random([4, 5, 6, 7], seed=22)
        deadline = time.monotonic() + 20  # the master forgets the dead segment within client_ttl
        while not drv.run(after, [4, 5, 6, 7], load=False).success:
            assert time.monotonic() < deadline, "the tier did not recover after the holder returned"
            time.sleep(0.2)
        primary.rows[8:12] = 0
        loaded = drv.run(after, [8, 9, 10, 11], load=True)
        assert loaded.success
        assert [primary.block(s).tobytes() for s in (8, 9, 10, 11)] == [fresh[s] for s in (4, 5, 6, 7)]
        assert tier.get_stats()["breaker_open"] == 0
        # What the dead holder kept is gone: a miss (or a failed load), never wrong bytes.
        primary.rows[12] = 0
        result = drv.run(before[:1], [12], load=True)
        assert not result.success or primary.block(12).tobytes() == written[0]
        assert drv.slowest < ENGINE_CALL, f"an engine-thread call took {drv.slowest:.3f} s"
    finally:
        raw.close()
        tier.shutdown()
