"""RedisTier passes the shared tier conformance suite against a real redis-server, single node and
a 3-master Redis Cluster."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from needs import need_module
from remote_servers import RedisCluster, RedisServer

from kvtier.testing import AsyncTierContractTests, PrimaryBuffer

need_module("redis", "redis")

from kvtier.tiers.redis import RedisTier  # noqa: E402


def prefix(workdir: Path) -> str:
    """One key prefix per test (same workdir = same prefix: the shared/persistent tests rebuild
    the tier over the same data)."""
    return "t" + hashlib.sha1(str(workdir).encode()).hexdigest()[:12]


class TestRedisContract(AsyncTierContractTests):
    @pytest.fixture(autouse=True)
    def _server(self, redis_single: RedisServer) -> None:
        self.url = redis_single.url

    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> RedisTier:
        return RedisTier(
            primary_kv_view=primary.view,
            context=primary.context("redis"),
            url=self.url,
            key_prefix=prefix(workdir),
        )


class TestRedisClusterContract(AsyncTierContractTests):
    @pytest.fixture(autouse=True)
    def _server(self, redis_cluster: RedisCluster) -> None:
        self.url = redis_cluster.url

    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> RedisTier:
        return RedisTier(
            primary_kv_view=primary.view,
            context=primary.context("redis"),
            url=self.url,
            key_prefix=prefix(workdir),
            threads=2,
            batch_blocks=3,
        )
