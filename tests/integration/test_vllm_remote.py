"""kvtier's remote tiers (redis, Redis Cluster, obj on Ceph RGW, mooncake) inside vLLM 0.33.

vLLM's own ``SecondaryTierFactory`` creates each tier from ``module_path`` and vLLM's own
``TieringOffloadingManager`` drives it (``vllm_scenarios``): store -> HIT -> load into overwritten
chunks byte for byte; two vLLM managers sharing one store hit each other's blocks (two processes
for redis); a server taken away mid-way makes misses and failed jobs, each reported once, without
a hang, and the tier works again once the server is back. Real servers only (``remote_servers``,
``mooncake_servers``); the one fake is vLLM's GPU<->CPU copy (``vllm_helpers``).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from mooncake_servers import LOOPBACK_ENV, MooncakeStore
from needs import need_module
from remote_servers import CephGateway, RedisCluster, RedisServer, s3_settings
from vllm_helpers import need_vllm
from vllm_scenarios import (
    remote_entry,
    run_sharing_processes,
    scenario_round_trip,
    scenario_server_gone,
    scenario_two_managers,
)

need_vllm()

# Short deadlines so a dead server turns into misses quickly (the tiers' defaults are 1-2 s).
FAST = {"op_timeout": 0.5, "breaker_reset": 0.5, "negative_ttl": 0.2}
# Where the server stays up, one stalled request on a loaded CI host must not fail the test.
STEADY = {**FAST, "op_timeout": 2.0}


def _prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix of this test alone (servers are shared by the session)."""
    return "v" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]


# -- redis -------------------------------------------------------------------------------------------
# redis_single and redis_cluster: the session's servers (tests/integration/conftest.py).


def _redis(url: str, prefix: str, deadlines: dict[str, float] = STEADY, **kw: Any) -> dict[str, Any]:
    return remote_entry("redis", url=url, key_prefix=prefix, **deadlines, **kw)


@pytest.mark.parametrize("kind", ["redis_single", "redis_cluster"])
def test_redis_round_trip_through_vllm(kind: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(kind).url
    scenario_round_trip(_redis(url, _prefix(request)), salt=kind.encode())


@pytest.mark.parametrize("kind", ["redis_single", "redis_cluster"])
def test_two_vllm_managers_share_redis(kind: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(kind).url
    scenario_two_managers(_redis(url, _prefix(request)), salt=kind.encode())


@pytest.mark.slow
def test_two_vllm_processes_share_redis(
    redis_single: RedisServer, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    run_sharing_processes([_redis(redis_single.url, _prefix(request))], tmp_path)


def test_redis_server_gone_is_misses_and_failed_jobs(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    need_module("redis", "redis")
    server = RedisServer(tmp_path / "redis")
    try:
        stats = scenario_server_gone(
            _redis(server.url, _prefix(request), FAST), server.kill, server.start, salt=b"redis-gone"
        )
        assert stats["failed_jobs"] + stats["dropped_stores"] >= 1, stats
    finally:
        server.kill()


def test_redis_cluster_gone_is_misses_and_failed_jobs(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    need_module("redis", "redis")
    cluster = RedisCluster(tmp_path / "cluster")
    try:
        entry = _redis(cluster.url, _prefix(request), FAST)
        scenario_server_gone(entry, cluster.stop, None, salt=b"cluster-gone")
    finally:
        cluster.stop()


@pytest.mark.parametrize("where", ["env", "inline"])
def test_a_redis_password_is_used_and_never_logged(
    where: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    need_module("redis", "redis")
    from kvtier.integrations.vllm import tier as adapter

    adapter.reset_log_once()
    secret = "vllm-redis-secret-" + hashlib.sha1(str(tmp_path).encode()).hexdigest()[:8]
    server = RedisServer(tmp_path / "redis", extra=("--requirepass", secret))
    if where == "env":
        monkeypatch.setenv("KVTIER_TEST_REDIS_PASSWORD", secret)
        entry = _redis(server.url, _prefix(request), password_env="KVTIER_TEST_REDIS_PASSWORD")
    else:
        entry = _redis(f"redis://:{secret}@127.0.0.1:{server.port}/0", _prefix(request))
    try:
        with caplog.at_level(logging.DEBUG):
            scenario_round_trip(entry, salt=b"redis-auth-" + where.encode())
    finally:
        server.kill()
    assert caplog.records, "the round trip logged nothing at all: the check below would be empty"
    assert not [r for r in caplog.records if secret in r.getMessage()]
    # An inline password works, and the adapter says once where it should go (vLLM logs its config).
    warned = [r.getMessage() for r in caplog.records if "holds a secret" in r.getMessage()]
    assert len(warned) == (1 if where == "inline" else 0), warned
    if warned:
        assert "'url'" in warned[0] and "password_env" in warned[0]


# -- obj (S3 on Ceph RGW) ---------------------------------------------------------------------------
def _obj(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """An obj entry on the test gateway; credentials from the environment, as docs/vllm.md says."""
    need_module("boto3", "s3")
    s3 = s3_settings()
    monkeypatch.setenv("KVTIER_TEST_VLLM_S3_KEY", s3["access_key_id"])
    monkeypatch.setenv("KVTIER_TEST_VLLM_S3_SECRET", s3["secret_access_key"])
    return remote_entry(
        "obj", bucket="kvtier-tests", key_prefix=_prefix(request), endpoint_url=s3["endpoint_url"],
        region="us-east-1", addressing_style="path", create_bucket=True,
        access_key_env="KVTIER_TEST_VLLM_S3_KEY", secret_key_env="KVTIER_TEST_VLLM_S3_SECRET",
        **{**FAST, "op_timeout": 3.0},  # a gateway on a loaded 2-core machine answers slowly at first
    )  # fmt: skip


def test_obj_round_trip_through_vllm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario_round_trip(_obj(request, monkeypatch), salt=b"obj")


def test_two_vllm_managers_share_a_bucket(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario_two_managers(_obj(request, monkeypatch), salt=b"obj-share")


def test_obj_gateway_gone_is_misses_and_failed_jobs(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = _obj(request, monkeypatch)
    gateway = CephGateway(entry["endpoint_url"])
    try:
        scenario_server_gone(entry, gateway.stop, gateway.start, salt=b"obj-gone")
    finally:
        if not gateway.up():
            gateway.start()


# -- mooncake (master + a separate holder process) -----------------------------------------------------
def _mooncake(
    store: MooncakeStore, request: pytest.FixtureRequest, deadlines: dict[str, float] = STEADY
) -> dict[str, Any]:
    os.environ.update(LOOPBACK_ENV)  # this process's transfer engine binds loopback only
    options = {k: v for k, v in store.tier_config(key_prefix=_prefix(request)).items() if k != "type"}
    return remote_entry("mooncake", **options, **deadlines)


def test_mooncake_round_trip_through_vllm(
    mooncake_store: MooncakeStore, request: pytest.FixtureRequest
) -> None:
    scenario_round_trip(_mooncake(mooncake_store, request), salt=b"mooncake")


def test_two_vllm_managers_share_a_mooncake_store(
    mooncake_store: MooncakeStore, request: pytest.FixtureRequest
) -> None:
    scenario_two_managers(_mooncake(mooncake_store, request), salt=b"mooncake-share")


def test_mooncake_holder_gone_is_misses_and_failed_jobs(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    os.environ.update(LOOPBACK_ENV)
    store = MooncakeStore(tmp_path / "mooncake")
    try:
        # The holder owns every object: killed, the blocks are gone; restarted, it is empty.
        scenario_server_gone(
            _mooncake(store, request, FAST), store.kill_holder, store.start_holder, salt=b"mc-gone"
        )
    finally:
        store.stop()
