"""The redis tier behind the real engine, shared between real processes: byte-exact round trips,
two engine processes hitting each other's blocks through one Redis and one Cluster, tenants
(cache_salt) never sharing, and corrupted or truncated values never served."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from needs import need_module
from remote_servers import RedisServer

from kvtier.engine import Engine
from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing import PrimaryBuffer, wait_for_jobs

need_module("redis", "redis")

from kvtier.tiers.redis import RedisTier  # noqa: E402

BLOCK = 256 * 1024
PROC = Path(__file__).with_name("remote_engine_proc.py")


def config(url: str, prefix: str, **top: Any) -> dict[str, Any]:
    return {
        "block_bytes": BLOCK,
        "cpu_bytes_to_use": 16 * BLOCK,
        "model": "redis-shared-test",
        "secondary_tiers": [{"type": "redis", "url": url, "key_prefix": prefix}],
        **top,
    }


def engine_proc(cfg: dict[str, Any], mode: str, n: int, seed: int, timeout: float = 10.0) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(PROC), json.dumps(cfg), mode, str(n), str(seed), str(timeout)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("kind", ["single", "cluster"])
def test_two_engine_processes_share_blocks_and_tenants_never_do(
    kind: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(f"redis_{kind}").url  # the session's servers (conftest.py)
    cfg = config(url, f"share-{kind}")
    assert engine_proc(cfg, "store", 12, seed=7) == {"stored": 12, "tier_stores": 12}
    assert engine_proc(cfg, "load", 12, seed=7) == {"hits": 12, "exact": 12}
    other_tenant = config(url, f"share-{kind}", cache_salt="tenant-b")
    assert engine_proc(other_tenant, "load", 12, seed=7, timeout=1.5)["hits"] == 0


def test_engine_round_trip_is_byte_exact(redis_single: RedisServer) -> None:
    keys = [BlockKey(f"e{i}".encode()) for i in range(8)]
    data = np.random.default_rng(3).integers(0, 256, (8, BLOCK), dtype=np.uint8)
    out = np.zeros_like(data)
    with Engine(config(redis_single.url, "engine-rt")) as eng:
        assert isinstance(eng.tiers[0], RedisTier)
        assert eng.store_blocks(keys, data) == 8
        eng.drain()
        eng.reset()
        deadline = time.monotonic() + 10
        while eng.lookup(keys).num_hits < 8:
            assert time.monotonic() < deadline
            eng.poll()
            time.sleep(0.005)
        assert eng.load_blocks(keys, out) == 8
        assert np.array_equal(out, data)


def _tier(primary: PrimaryBuffer, url: str, prefix: str, **kw: Any) -> RedisTier:
    return RedisTier(
        primary_kv_view=primary.view, context=primary.context("redis"), url=url, key_prefix=prefix, **kw
    )


def _store(tier: RedisTier, keys: list[BlockKey], slots: list[int], jid: int) -> bool:
    job = TransferJob(jid, keys, np.asarray(slots, dtype=np.int32))
    tier.submit_store(job)
    return wait_for_jobs(tier, [jid], timeout=10)[jid].success


def _load(tier: RedisTier, keys: list[BlockKey], slots: list[int], jid: int) -> set[BlockKey]:
    job = TransferJob(jid, keys, np.asarray(slots, dtype=np.int32), is_promotion=True)
    tier.submit_load(job)
    return set(wait_for_jobs(tier, [jid], timeout=10)[jid].transferred(keys))


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip_payload", "flip_header", "other_key", "empty", "extend"],
)
def test_corrupted_or_truncated_values_are_never_served(redis_single: RedisServer, damage: str) -> None:
    import redis

    primary = PrimaryBuffer.heap(4, 8192, 5000)
    written = primary.fill_random([0, 1], seed=5)
    a, b = BlockKey(b"victim"), BlockKey(b"donor")
    prefix = f"corrupt-{damage}"
    tier = _tier(primary, redis_single.url, prefix)
    try:
        assert _store(tier, [a, b], [0, 1], 1)
        raw = redis.Redis.from_url(redis_single.url)
        name = f"{prefix}:kvtier-test:".encode() + a
        value = raw.get(name)
        assert value is not None and value.endswith(written[0])
        if damage == "truncate":
            value = value[:-100]
        elif damage == "flip_payload":
            value = value[:-1] + bytes([value[-1] ^ 1])
        elif damage == "flip_header":
            value = value[:10] + bytes([value[10] ^ 0xFF]) + value[11:]
        elif damage == "other_key":
            value = raw.get(f"{prefix}:kvtier-test:".encode() + b)
        elif damage == "empty":
            value = b""
        else:
            value = value + b"\0"
        raw.set(name, value)
        primary.rows[2] = 0
        assert _load(tier, [a, b], [2, 3], 2) == {b}
        assert not primary.block(2).any(), "a bad value must not reach the slot"
        assert primary.block(3).tobytes() == written[1]
        assert tier.get_stats()["corrupt"] == 1
        assert tier.lookup(a) is LookupResult.MISS  # forgotten, not served again
        raw.close()
    finally:
        tier.shutdown()


def test_a_key_the_server_evicted_is_a_miss_not_an_error(redis_single: RedisServer) -> None:
    import redis

    primary = PrimaryBuffer.heap(4, 8192, 5000)
    primary.fill_random([0], seed=6)
    tier = _tier(primary, redis_single.url, "evicted")
    try:
        k = BlockKey(b"gone")
        assert _store(tier, [k], [0], 1) and tier.lookup(k) is LookupResult.HIT
        redis.Redis.from_url(redis_single.url).delete(b"evicted:kvtier-test:gone")
        assert _load(tier, [k], [1], 2) == set()
        assert tier.lookup(k) is LookupResult.MISS and tier.get_stats()["failed_jobs"] == 1
        assert tier.get_stats()["breaker_open"] == 0
    finally:
        tier.shutdown()


@pytest.mark.parametrize("block", [5000, 64 << 10], ids=["small", "large"])
def test_ttl_expires_blocks(redis_single: RedisServer, block: int) -> None:
    """Every SET of a pipelined chunk carries the expiry, whether its payload is joined with the
    command (small) or sent as the slot's own memory (large), and the values read back intact."""
    import redis

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
