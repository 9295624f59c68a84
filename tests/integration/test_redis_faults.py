"""The redis tier against real server faults (kvtier.testing.RemoteFaultTests): redis-server killed
mid-run and restarted, stalled (SIGSTOP) and resumed; then what only Redis has: one Cluster master
killed, the batched lookup with the breaker open, idle connections the server closed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from needs import need_module
from remote_servers import RedisCluster, RedisServer

from kvtier.keys import BlockKey, LookupResult
from kvtier.testing import PrimaryBuffer
from kvtier.testing.faults import EngineDriver, RemoteFaultTests, block_keys

need_module("redis", "redis")

from kvtier.tiers.redis import RedisTier  # noqa: E402

DEADLINE = RemoteFaultTests.deadline
OPTS: dict[str, Any] = {"op_timeout": DEADLINE, **RemoteFaultTests.options}
keys = block_keys


class TestRedisFaults(RemoteFaultTests):
    faults = ("kill", "stall")

    @pytest.fixture(autouse=True)
    def _server(self, tmp_path: Path) -> Iterator[None]:
        self.server = RedisServer(tmp_path / "r")
        yield
        self.server.kill()

    def make_tier(self, primary: PrimaryBuffer, **options: Any) -> RedisTier:
        return RedisTier(
            primary_kv_view=primary.view, context=primary.context("redis"), url=self.server.url, **options
        )

    def break_service(self, fault: str) -> None:
        self.server.kill() if fault == "kill" else self.server.pause()

    def restore_service(self, fault: str) -> None:
        # A killed server comes back on the same port, empty: the blocks are gone.
        self.server.start() if fault == "kill" else self.server.resume()


def driver(tier: RedisTier) -> EngineDriver:
    return EngineDriver(tier, job_limit=4 * DEADLINE + 0.5, patience=10)


def test_cluster_node_killed_only_its_keys_miss(tmp_path: Path) -> None:
    cluster = RedisCluster(tmp_path / "c")
    primary = PrimaryBuffer.heap(64, 8192, 5000)
    primary.fill_random(range(30), seed=3)
    tier = RedisTier(primary_kv_view=primary.view, context=primary.context("redis"), url=cluster.url, **OPTS)
    d = driver(tier)
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
    d = driver(tier)

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
    d = driver(tier)
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
