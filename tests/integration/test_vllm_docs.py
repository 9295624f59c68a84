"""Every ``vllm serve ... --kv-transfer-config '{...}'`` block in docs/vllm.md works as written.

Each config passes ``kvtier check`` and is built by vLLM's own ``TieringOffloadingSpec`` (vLLM's
factory creates every tier in it, vLLM's fs tier included), then a request's blocks are stored and
loaded back byte for byte through vLLM's manager (a p2p config loads the blocks its peer holds:
inside vLLM it stores nothing).

Changed from the doc, and only this: where each tier's data lives. ``root_dir`` is a temporary
directory per entry and ``max_bytes`` 64 MiB (kvtier refuses more than the file system holds);
``cpu_bytes_to_use`` is 16 chunks instead of gigabytes of /dev/shm; server addresses point at the
test's real servers on 127.0.0.1 (redis-server with a password, a 3-master Redis Cluster, Ceph RGW,
a Mooncake master + holder, kvtier's block server for p2p; a p2p entry's own ``serve`` binds
127.0.0.1 on a free port); ``key_prefix`` / ``prefix`` / ``bucket``
are the test's own (the bucket is created if missing); the environment variables an entry names
(``password_env``, ``access_key_env``, ``secret_key_env``, ``secret_env``) hold the test servers'
credentials. vLLM's ``OffloadingConfig`` is built by the test (vLLM derives it from a model and a
GPU KV cache), so top-level keys vLLM reads there (``block_size``) are not exercised by vLLM here.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mooncake_servers import LOOPBACK_ENV
from needs import need_module
from remote_servers import RedisServer, s3_settings
from vllm_helpers import ROW_BYTES, VllmStack, assert_exact, offload_keys, offloading_config
from vllm_peer import Peer
from vllm_scenarios import load_until_hit

from kvtier.cli.check import check_config
from kvtier.config import load_config
from kvtier.engine.build import config_namespace
from kvtier.integrations.vllm import compat

DOC = Path(__file__).resolve().parents[2] / "docs" / "vllm.md"
_SERVE = re.compile(r"^vllm serve \S+ --kv-transfer-config '(\{.*\})'$", re.MULTILINE)
_REDIS_PASSWORD = "vllm-docs-redis-password"
_P2P_SECRET = "vllm-docs-p2p-secret"


def _configs() -> list[dict[str, Any]]:
    return [json.loads(m) for m in _SERVE.findall(DOC.read_text(encoding="utf-8"))]


def _kind(tier: dict[str, Any]) -> str:
    """Which server a doc entry needs: fs, redis, cluster, obj, mooncake, p2p, or vllm (its own)."""
    if tier.get("module_path") != "kvtier.integrations.vllm":
        return "vllm"
    kind = str(tier.get("tier", "fs"))
    if kind == "redis" and (str(tier.get("url", "")).startswith("redis+cluster") or tier.get("cluster")):
        return "cluster"
    return kind


def _kinds(raw: dict[str, Any]) -> set[str]:
    return {_kind(t) for t in raw["kv_connector_extra_config"]["secondary_tiers"]}


@pytest.fixture(scope="module")
def doc_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    need_module("redis", "redis")
    server = RedisServer(tmp_path_factory.mktemp("docs-redis"), extra=("--requirepass", _REDIS_PASSWORD))
    yield server
    server.kill()


def _localised(
    raw: dict[str, Any],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    peer: Peer | None = None,
) -> dict[str, Any]:
    """``raw`` pointed at the test's servers (see the module doc for every change)."""
    raw = copy.deepcopy(raw)
    prefix = "d" + hashlib.sha1(f"{request.node.nodeid}:{tmp_path}".encode()).hexdigest()[:12]
    for i, tier in enumerate(raw["kv_connector_extra_config"]["secondary_tiers"]):
        kind = _kind(tier)
        if "root_dir" in tier:
            tier["root_dir"] = str(tmp_path / f"tier{i}")
        if "max_bytes" in tier:
            tier["max_bytes"] = "64MiB"
        for key in ("key_prefix", "prefix"):
            if key in tier:
                tier[key] = f"{prefix}-{i}"
        if kind == "redis":
            tier["url"] = request.getfixturevalue("doc_redis").url
            assert "password_env" in tier, "the doc's redis server config names its password variable"
            monkeypatch.setenv(tier["password_env"], _REDIS_PASSWORD)
        elif kind == "cluster":
            tier["url"] = request.getfixturevalue("redis_cluster").url  # the session's (conftest.py)
        elif kind == "obj":
            need_module("boto3", "s3")
            s3 = s3_settings()
            tier.update(endpoint_url=s3["endpoint_url"], bucket="kvtier-tests", create_bucket=True)
            monkeypatch.setenv(tier["access_key_env"], s3["access_key_id"])
            monkeypatch.setenv(tier["secret_key_env"], s3["secret_access_key"])
        elif kind == "mooncake":
            for key, value in LOOPBACK_ENV.items():
                monkeypatch.setenv(key, value)
            store = request.getfixturevalue("mooncake_store")
            for key in ("master_server_addr", "metadata_server", "local_hostname"):
                tier[key] = store.tier_config()[key]
        elif kind == "p2p":
            assert peer is not None
            tier["peers"] = [peer.address]
            if "serve" in tier:  # this instance's own server: loopback, any free port
                tier["serve"] = {**tier["serve"], "host": "127.0.0.1", "port": 0}
            monkeypatch.setenv(tier["secret_env"], _P2P_SECRET)
    return raw


def _for_this_vllm(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` as a user of the installed vLLM runs it: vLLM 0.32's detector has no
    ``failure_threshold`` (``kvtier check`` refuses it there, naming the key), so it is dropped."""
    if compat.FAILED_STORES_FEED_BACKPRESSURE:
        return raw
    out = copy.deepcopy(raw)
    for tier in out["kv_connector_extra_config"]["secondary_tiers"]:
        bp = tier.get("backpressure")
        if isinstance(bp, dict):
            bp.pop("failure_threshold", None)
    return out


def test_the_doc_has_configs_and_each_is_kvtier() -> None:
    configs = _configs()
    assert len(configs) >= 8
    for raw in configs:
        tiers = raw["kv_connector_extra_config"]["secondary_tiers"]
        assert any(t.get("module_path") == "kvtier.integrations.vllm" for t in tiers)
    # Every remote tier has its block (the doc promises one each).
    assert set().union(*map(_kinds, configs)) >= {"fs", "redis", "cluster", "obj", "mooncake", "p2p"}


def _check_peer(raw: dict[str, Any]) -> Peer | None:
    """For a p2p block: a peer presenting what ``kvtier check`` presents (kvtier's own block size and
    namespace for the config: vLLM's are known only once vLLM runs)."""
    if "p2p" not in _kinds(raw):
        return None
    cfg = load_config(raw)
    peer = Peer([], _P2P_SECRET, block_bytes=cfg.block_bytes)
    peer.namespace = config_namespace(cfg)
    return peer


@pytest.mark.parametrize("index", range(len(_configs())))
def test_doc_config_passes_kvtier_check(
    index: int, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = _for_this_vllm(_configs()[index])
    if "p2p" in _kinds(raw):
        monkeypatch.setenv("KVTIER_P2P_SECRET", _P2P_SECRET)  # load_config reads the secret
    peer = _check_peer(raw)
    try:
        report = check_config(_localised(raw, tmp_path, request, monkeypatch, peer))
        assert report["ok"], report
        assert report["tiers"], "every doc config has a kvtier tier to check"
    finally:
        if peer is not None:
            peer.close()


def test_kvtier_check_of_the_p2p_block_reports_a_peer_that_checks_vllm_settings(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/vllm.md: against a peer presenting a vLLM instance's block size and namespace,
    ``kvtier check`` reports the mismatch (it cannot know vLLM's settings)."""
    raw = next(r for r in _configs() if "p2p" in _kinds(r))
    peer = Peer([], _P2P_SECRET)  # vLLM's row size; a namespace that is not kvtier check's
    try:
        report = check_config(_localised(raw, tmp_path, request, monkeypatch, peer))
    finally:
        peer.close()
    assert not report["ok"]
    assert "block_bytes" in str(report["tiers"][0]["error"])


@pytest.mark.parametrize("index", range(len(_configs())))
def test_doc_config_runs_in_vllm(
    index: int, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_helpers import need_vllm

    need_vllm()
    raw = _for_this_vllm(_configs()[index])
    keys = offload_keys(3, salt=f"doc{index}".encode())
    p2p = "p2p" in _kinds(raw)
    peer = Peer(keys, _P2P_SECRET) if p2p else None
    try:
        local = _localised(raw, tmp_path, request, monkeypatch, peer)
        extra = dict(local["kv_connector_extra_config"], cpu_bytes_to_use=16 * ROW_BYTES)
        stack = VllmStack(offloading_config(extra))
        try:
            ours = [t for t in stack.manager.secondary_tiers if type(t).__name__ == "KvtierTier"]
            assert ours
            if peer is not None:
                peer.namespace = ours[0].namespace.root.hex()  # the peer serves this vLLM layout
            else:
                stack.store(keys)
                assert all(t.kvtier_tier.get_stats()["stores"] == 3 for t in ours)
                stack.wipe_primary()
            del ours  # a live reference to a tier keeps vLLM's region mapped at close
            assert_exact(load_until_hit(stack, keys), keys)
        finally:
            stack.close()
    finally:
        if peer is not None:
            peer.close()
