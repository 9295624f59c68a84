"""The redis tier against real server faults: redis-server killed mid-run and restarted, stalled
(SIGSTOP) and resumed, one Cluster master killed. Stores drop, lookups miss within the deadline,
no call on the engine's thread blocks, and the tier recovers by itself."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from needs import need_module
from remote_servers import RedisCluster, RedisServer

from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing import PrimaryBuffer, wait_for_jobs

need_module("redis", "redis")

from kvtier.tiers.redis import RedisTier  # noqa: E402

DEADLINE = 0.3
OPTS: dict[str, Any] = {"op_timeout": DEADLINE, "breaker_failures": 2, "breaker_reset": 0.3, "threads": 2}


class Driver:
    """Submits jobs like an engine and times every call made on the "engine thread"."""

    def __init__(self, tier: RedisTier, primary: PrimaryBuffer) -> None:
        self.tier, self.primary = tier, primary
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
        result = wait_for_jobs(self.tier, [job.job_id], timeout=10)[job.job_id]
        # Every job is reported within a few deadlines, whatever the server does.
        assert time.monotonic() - t0 < 4 * DEADLINE + 0.5
        return result

    def lookup(self, key: BlockKey) -> LookupResult:
        answer: LookupResult = self.timed(self.tier.lookup, key)
        return answer


def keys(tag: str, n: int) -> list[BlockKey]:
    return [BlockKey(f"{tag}{i}".encode()) for i in range(n)]


@pytest.mark.parametrize("fault", ["kill", "stall"])
def test_server_down_then_back(tmp_path: Path, fault: str) -> None:
    server = RedisServer(tmp_path / "r")
    primary = PrimaryBuffer.heap(16, 8192, 5000)
    primary.fill_random(range(16), seed=1)
    tier = RedisTier(primary_kv_view=primary.view, context=primary.context("redis"), url=server.url, **OPTS)
    d = Driver(tier, primary)
    try:
        held = keys("held", 4)
        assert d.run(held, [0, 1, 2, 3], load=False).success
        assert d.lookup(held[0]) is LookupResult.HIT
        server.kill() if fault == "kill" else server.pause()
        t_fault = time.monotonic()
        # Loads of held keys fail; after breaker_failures of them lookups answer MISS.
        while d.lookup(held[0]) is LookupResult.HIT:
            assert not d.run(held[:1], [8], load=True).success
            assert time.monotonic() - t_fault < 6 * DEADLINE + 1
        assert tier.get_stats()["breaker_open"] == 1
        # While open: stores are dropped at once and counted, loads fail at once.
        before = tier.get_stats()["dropped_stores"]
        result = d.run(keys("new", 2), [4, 5], load=False)
        assert not result.success and "breaker" in (result.error or "")
        assert tier.get_stats()["dropped_stores"] == before + 2
        assert not d.run(held[:1], [9], load=True).success
        assert d.slowest < DEADLINE, f"an engine-thread call took {d.slowest:.3f}s"
        if fault == "kill":
            server.start()  # same port, empty: the blocks are gone, the server is back
        else:
            server.resume()
        # The tier recovers by itself (half-open trials), without being rebuilt.
        deadline = time.monotonic() + 10
        fresh = keys("fresh", 2)
        while not d.run(fresh, [6, 7], load=False).success:
            assert time.monotonic() < deadline, "the tier did not recover after the server came back"
            time.sleep(0.1)
        assert d.lookup(fresh[0]) is LookupResult.HIT
        assert d.run(fresh, [10, 11], load=True).success
        assert primary.block(10).tobytes() == primary.block(6).tobytes()
        assert tier.get_stats()["breaker_open"] == 0 and tier.get_stats()["breaker_opens"] >= 1
        assert d.slowest < DEADLINE
    finally:
        tier.shutdown()
        server.kill()


def test_lookups_reopen_the_breaker_without_traffic(tmp_path: Path) -> None:
    """With no jobs at all, lookups start the half-open probe; the breaker closes once the server
    is back (the probe is a real command, not a health call)."""
    server = RedisServer(tmp_path / "r")
    primary = PrimaryBuffer.heap(4, 8192, 5000)
    primary.fill_random(range(4), seed=2)
    tier = RedisTier(primary_kv_view=primary.view, context=primary.context("redis"), url=server.url, **OPTS)
    d = Driver(tier, primary)
    try:
        k = keys("p", 1)
        assert d.run(k, [0], load=False).success
        server.kill()
        while d.lookup(k[0]) is LookupResult.HIT:
            d.run(k, [1], load=True)
        server.start()
        deadline = time.monotonic() + 10
        while tier.get_stats()["breaker_open"]:
            assert time.monotonic() < deadline
            d.lookup(k[0])
            time.sleep(0.05)
        assert d.slowest < DEADLINE
    finally:
        tier.shutdown()
        server.kill()


def test_cluster_node_killed_only_its_keys_miss(tmp_path: Path) -> None:
    cluster = RedisCluster(tmp_path / "c")
    primary = PrimaryBuffer.heap(64, 8192, 5000)
    primary.fill_random(range(30), seed=3)
    tier = RedisTier(primary_kv_view=primary.view, context=primary.context("redis"), url=cluster.url, **OPTS)
    d = Driver(tier, primary)
    try:
        ks = keys("c", 30)
        assert d.run(ks, list(range(30)), load=False).success
        dead = cluster.nodes[1]
        dead_name = f"127.0.0.1:{dead.port}"
        on_dead = [k for k in ks if tier._route(k) == dead_name]
        alive = [k for k in ks if k not in on_dead]
        assert on_dead and alive, "30 keys spread over 3 masters"
        dead.kill()
        deadline = time.monotonic() + 6 * DEADLINE + 1
        while any(d.lookup(k) is LookupResult.HIT for k in on_dead):
            assert time.monotonic() < deadline
            got = d.run(ks, list(range(30, 60)), load=True)
            assert set(alive) <= set(got.transferred(ks)), "keys on live masters still load"
        assert all(d.lookup(k) is LookupResult.HIT for k in alive)
        got = d.run(alive, list(range(30, 30 + len(alive))), load=True)
        assert got.success
        for i, k in enumerate(alive):
            assert primary.block(30 + i).tobytes() == primary.block(ks.index(k)).tobytes()
        assert tier.get_stats()["breaker_open"] == 1
        assert d.slowest < DEADLINE
    finally:
        tier.shutdown()
        cluster.stop()


def test_lookup_many_answers_and_counts_like_lookup(tmp_path: Path) -> None:
    """The batched lookup's one-pass path (one server, breaker closed, keys the index knows) gives
    the per-key answers and counters, and so does its fallback with the breaker open."""
    server = RedisServer(tmp_path / "r")
    primary = PrimaryBuffer.heap(8, 8192, 5000)
    primary.fill_random(range(8), seed=3)
    tier = RedisTier(primary_kv_view=primary.view, context=primary.context("redis"), url=server.url, **OPTS)
    d = Driver(tier, primary)

    def both(asked: list[BlockKey]) -> None:
        before = tier.get_stats()
        batched = tier.lookup_many(asked)
        mid = tier.get_stats()
        single = [tier.lookup(k) for k in asked]
        after = tier.get_stats()
        assert batched == single
        for counter in ("lookups", "hits"):
            assert mid[counter] - before[counter] == after[counter] - mid[counter]

    try:
        held = keys("held", 4)
        assert d.run(held, [0, 1, 2, 3], load=False).success
        asked = [held[0], *keys("unknown", 3), held[2], held[2], held[3]]
        both(asked)
        assert tier.lookup_many(asked)[0] is LookupResult.HIT
        server.kill()
        while d.lookup(held[0]) is LookupResult.HIT:
            d.run(held[:1], [5], load=True)
        both(asked)
        assert set(tier.lookup_many(asked)) == {LookupResult.MISS}
    finally:
        tier.shutdown()
        server.kill()


@pytest.mark.parametrize("how", ["client_kill", "restart"])
def test_a_connection_the_server_closed_while_idle_is_replaced(tmp_path: Path, how: str) -> None:
    """The server drops the tier's idle connections (CLIENT KILL, or a restart on the same port):
    the next job succeeds on a new connection instead of failing on the dead one."""
    import redis

    server = RedisServer(tmp_path / "r")
    primary = PrimaryBuffer.heap(8, 8192, 5000)
    written = primary.fill_random(range(4), seed=3)
    one = {**OPTS, "threads": 1}  # one worker, one connection: the one the server closes
    tier = RedisTier(primary_kv_view=primary.view, context=primary.context("redis"), url=server.url, **one)
    d = Driver(tier, primary)
    try:
        held = keys("idle", 2)
        assert d.run(held, [0, 1], load=False).success
        if how == "client_kill":
            admin = redis.Redis.from_url(server.url)
            assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
            admin.close()
        else:
            server.kill()
            server.start()  # empty now: the next job stores again
        time.sleep(0.2)  # the close reaches this side
        if how == "client_kill":
            result = d.run(held, [4, 5], load=True)
            assert result.success, result.error
            assert primary.block(4).tobytes() == written[0] and primary.block(5).tobytes() == written[1]
        else:
            result = d.run(keys("after", 2), [2, 3], load=False)
            assert result.success, result.error
        stats = tier.get_stats()
        assert stats["failed_jobs"] == 0 and stats["breaker_opens"] == 0, stats
    finally:
        tier.shutdown()
        server.kill()
