"""The redis tier behind the real engine, shared between real processes
(kvtier.testing.SharedStoreTests), on one Redis and on a Cluster; then what only Redis has: TTLs on
pipelined writes and unix-socket URLs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from needs import need_module
from remote_servers import RedisServer

from kvtier.keys import BlockKey
from kvtier.testing import PrimaryBuffer, SharedStoreTests, run_job
from kvtier.tiers.remote import RemoteTier

need_module("redis", "redis")

import redis  # noqa: E402

from kvtier.tiers.redis import RedisTier  # noqa: E402


class TestRedisShared(SharedStoreTests):
    @pytest.fixture(autouse=True)
    def _server(self, redis_single: RedisServer) -> None:
        self.url = redis_single.url  # the session's server (conftest.py)

    def tier_config(self, prefix: str, **options: Any) -> dict[str, Any]:
        return {"type": "redis", "url": self.url, "key_prefix": prefix, **options}

    def make_tier(self, primary: PrimaryBuffer, prefix: str, **options: Any) -> RedisTier:
        return _tier(primary, self.url, prefix, **options)

    def _name(self, tier: RemoteTier, key: BlockKey) -> bytes:
        return f"{tier.options.key_prefix}:kvtier-test:".encode() + key  # type: ignore[attr-defined]

    def raw_get(self, tier: RemoteTier, key: BlockKey) -> bytes:
        with redis.Redis.from_url(self.url) as raw:
            value = raw.get(self._name(tier, key))
        assert isinstance(value, bytes)
        return value

    def raw_put(self, tier: RemoteTier, key: BlockKey, value: bytes) -> None:
        with redis.Redis.from_url(self.url) as raw:
            raw.set(self._name(tier, key), value)

    def raw_delete(self, tier: RemoteTier, key: BlockKey) -> None:
        with redis.Redis.from_url(self.url) as raw:
            assert raw.delete(self._name(tier, key)) == 1


class TestRedisClusterShared(TestRedisShared):
    """The same scenarios on a three-master Cluster (keys routed to their slot's master)."""

    @pytest.fixture(autouse=True)
    def _server(self, redis_cluster: Any) -> None:
        self.url = redis_cluster.url

    def _raw(self) -> Any:
        return redis.RedisCluster.from_url(self.url.replace("+cluster://", "://", 1))

    def raw_get(self, tier: RemoteTier, key: BlockKey) -> bytes:
        with self._raw() as raw:
            value = raw.get(self._name(tier, key))
        assert isinstance(value, bytes)
        return value

    def raw_put(self, tier: RemoteTier, key: BlockKey, value: bytes) -> None:
        with self._raw() as raw:
            raw.set(self._name(tier, key), value)

    def raw_delete(self, tier: RemoteTier, key: BlockKey) -> None:
        with self._raw() as raw:
            assert raw.delete(self._name(tier, key)) == 1


def _tier(primary: PrimaryBuffer, url: str, prefix: str, **kw: Any) -> RedisTier:
    return RedisTier(
        primary_kv_view=primary.view, context=primary.context("redis"), url=url, key_prefix=prefix, **kw
    )


def _store(tier: RedisTier, keys: list[BlockKey], slots: list[int], jid: int) -> bool:
    return run_job(tier, jid, keys, slots, load=False, timeout=10).success


def _load(tier: RedisTier, keys: list[BlockKey], slots: list[int], jid: int) -> set[BlockKey]:
    return set(run_job(tier, jid, keys, slots, load=True, timeout=10).transferred(keys))


@pytest.mark.parametrize("block", [5000, 64 << 10], ids=["small", "large"])
def test_ttl_expires_blocks(redis_single: RedisServer, block: int) -> None:
    """Every SET of a pipelined chunk carries the expiry, whether its payload is joined with the
    command (small) or sent as the slot's own memory (large), and the values read back intact."""
    primary = PrimaryBuffer.heap(8, block, block)
    written = primary.fill_random([0, 1, 2], seed=8)
    tier = _tier(primary, redis_single.url, f"ttl{block}", ttl=30, batch_blocks=3, threads=1)
    keys = [BlockKey(b"t%d" % i) for i in range(3)]
    try:
        assert _store(tier, keys, [0, 1, 2], 1)
        client = redis.Redis.from_url(redis_single.url)
        for k in keys:
            assert 25_000 < client.pttl(b"ttl%d:kvtier-test:%s" % (block, bytes(k))) <= 30_000
        assert _load(tier, keys, [3, 4, 5], 2) == set(keys)
        assert [primary.block(s).tobytes() for s in (3, 4, 5)] == [written[s] for s in (0, 1, 2)]
        client.close()
    finally:
        tier.shutdown()


def test_unix_socket_url(tmp_path: Path) -> None:
    sock = tmp_path / "redis.sock"
    server = RedisServer(tmp_path / "u", extra=("--unixsocket", str(sock), "--unixsocketperm", "700"))
    primary = PrimaryBuffer.heap(4, 8192, 5000)
    written = primary.fill_random([0], seed=9)
    tier = _tier(primary, f"unix://{sock}?db=0", "unix")
    try:
        assert _store(tier, [BlockKey(b"u")], [0], 1)
        assert _load(tier, [BlockKey(b"u")], [1], 2) == {BlockKey(b"u")}
        assert primary.block(1).tobytes() == written[0]
    finally:
        tier.shutdown()
        server.kill()
