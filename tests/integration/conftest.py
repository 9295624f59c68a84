"""Real services shared by the integration modules, started once per session.

A test that only stores and reads through a service takes it from here and keeps to its own key
prefix (the servers are shared by every module of the run). A test that kills, pauses, restarts or
reconfigures a service starts its own (``RedisServer``, ``MooncakeStore``... in
``remote_servers``/``mooncake_servers``), so no other test sees the damage.

Missing services skip locally and fail under ``CI=true`` (:mod:`needs`); the S3 server is the one
``tests/services/ceph-rgw.sh`` starts (its ``DIR/env`` exports ``KVTIER_TEST_S3_*``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from mooncake_servers import LOOPBACK_ENV, MooncakeStore
from needs import need_module
from remote_servers import RedisCluster, RedisServer, s3_settings


@pytest.fixture(scope="session")
def redis_single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server on 127.0.0.1 for the whole run."""
    need_module("redis", "redis")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.kill()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A three-master Redis Cluster on 127.0.0.1 for the whole run."""
    need_module("redis", "redis")
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def s3() -> dict[str, str]:
    """The S3 test server's endpoint and credentials (``endpoint_url``, ``access_key_id``,
    ``secret_access_key``)."""
    need_module("boto3", "s3")
    return s3_settings()


@pytest.fixture(scope="session")
def mooncake_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MooncakeStore]:
    """One Mooncake Store (``mooncake_master`` and a ``mooncake_client`` holder) on 127.0.0.1 for
    the whole run."""
    os.environ.update(LOOPBACK_ENV)  # this process's transfer engine too: loopback only
    store = MooncakeStore(tmp_path_factory.mktemp("mooncake"))
    yield store
    store.stop()
