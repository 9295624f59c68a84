"""RedisTier passes the shared tier conformance suite against a real redis-server, single node and
a 3-master Redis Cluster."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from needs import need_module
from remote_servers import RedisCluster, RedisServer

from kvtier.testing import AsyncTierContractTests, PrimaryBuffer

need_module("redis", "redis")

from kvtier.tiers.redis import RedisTier  # noqa: E402


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    c = RedisCluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


def prefix(workdir: Path) -> str:
    """One key prefix per test (same workdir = same prefix: the shared/persistent tests rebuild
    the tier over the same data)."""
    return "t" + hashlib.sha1(str(workdir).encode()).hexdigest()[:12]


class TestRedisContract(AsyncTierContractTests):
    @pytest.fixture(autouse=True)
    def _server(self, single: RedisServer) -> None:
        self.url = single.url

    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> RedisTier:
        return RedisTier(
            primary_kv_view=primary.view,
            context=primary.context("redis"),
            url=self.url,
            key_prefix=prefix(workdir),
        )


class TestRedisClusterContract(AsyncTierContractTests):
    @pytest.fixture(autouse=True)
    def _server(self, cluster: RedisCluster) -> None:
        self.url = cluster.url

    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> RedisTier:
        return RedisTier(
            primary_kv_view=primary.view,
            context=primary.context("redis"),
            url=self.url,
            key_prefix=prefix(workdir),
            threads=2,
            batch_blocks=3,
        )
