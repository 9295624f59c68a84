"""Every example in docs/remote.md runs: the Python example against a real redis-server, each
JSON config through ``kvtier check`` (a full round trip) with its server swapped for the local
one (AWS S3 is built but not contacted: no network beyond 127.0.0.1)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from needs import need_module
from remote_servers import RedisCluster, RedisServer, s3_settings

from kvtier.cli.check import check_config
from kvtier.config import load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "remote.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def configs() -> list[dict[str, Any]]:
    return [json.loads(b) for b in blocks("json")]


def test_the_doc_has_every_promised_example() -> None:
    types = [c.get("type") or c["secondary_tiers"][0]["type"] for c in configs()]
    assert types.count("redis") == 3 and types.count("obj") == 1 and types.count("s3") == 1
    assert any("cluster" in json.dumps(c) for c in configs())
    assert blocks("python")


def test_python_example_runs(redis_single: RedisServer) -> None:
    (code,) = blocks("python")
    code = code.replace("redis://127.0.0.1:6379/0", redis_single.url)
    exec(compile(code, str(DOC), "exec"), {})


def _check(cfg: dict[str, Any]) -> None:
    cfg = {**cfg, "block_bytes": 65536, "cpu_bytes_to_use": 1 << 20}
    report = check_config(cfg, timeout=30)
    assert report["ok"], report["tiers"]


def test_single_redis_config_round_trips(redis_single: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = configs()[0]
    monkeypatch.setenv("REDIS_PASSWORD", "")
    tier = cfg["secondary_tiers"][0]
    tier["url"] = redis_single.url
    del tier["password_env"]  # the local server has no password; the option itself is tested below
    _check(cfg)


def test_password_env_is_used_and_never_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need_module("redis", "redis")
    server = RedisServer(tmp_path / "auth", extra=("--requirepass", "s3cret-pw"))
    try:
        monkeypatch.setenv("REDIS_PASSWORD", "s3cret-pw")
        cfg = configs()[0]
        cfg["secondary_tiers"][0]["url"] = f"redis://:inline-pw@127.0.0.1:{server.port}/0"
        report = check_config({**cfg, "block_bytes": 65536, "cpu_bytes_to_use": 1 << 20}, timeout=30)
        assert report["ok"], report["tiers"]
        assert "s3cret-pw" not in json.dumps(report) and "inline-pw" not in json.dumps(report)
        from kvtier.testing import PrimaryBuffer
        from kvtier.tiers.redis import RedisTier

        p = PrimaryBuffer.heap(2, 4096, 4096)
        tier = RedisTier(
            primary_kv_view=p.view, context=p.context(), url=f"redis://:inline-pw@127.0.0.1:{server.port}"
        )
        assert "inline-pw" not in json.dumps(tier.config_info()) and "***" in tier.config_info()["url"]
        tier.shutdown()
    finally:
        server.kill()


def test_cluster_config_round_trips(redis_cluster: RedisCluster) -> None:
    cfg = configs()[1]
    cfg["secondary_tiers"][0]["url"] = redis_cluster.url
    _check(cfg)


def test_backpressure_example_is_a_valid_tier_entry(redis_single: RedisServer) -> None:
    entry = next(c for c in configs() if "backpressure" in c)
    _check({"secondary_tiers": [{**entry, "url": redis_single.url}]})


def test_aws_config_builds_without_contacting_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    need_module("boto3", "s3")
    from kvtier.plugins import create_spec, tier_contexts

    raw = configs()[2]
    raw["secondary_tiers"][0]["warm_listing"] = 0  # no start-up listing: nothing leaves 127.0.0.1
    cfg = load_config(raw)
    import numpy as np

    rows = np.zeros((2, cfg.row_stride), dtype=np.uint8)
    spec = create_spec(cfg)
    (tier,) = spec.create_tiers(rows.data, tier_contexts(cfg))
    try:
        info = tier.config_info()
        assert info["bucket"] == "acme-kv-cache" and info["max_bytes"] == 2 << 40
    finally:
        tier.shutdown()


def test_ceph_config_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    need_module("boto3", "s3")
    s3 = s3_settings()
    monkeypatch.setenv("S3_ACCESS_KEY", s3["access_key_id"])
    monkeypatch.setenv("S3_SECRET_KEY", s3["secret_access_key"])
    cfg = configs()[3]
    cfg["secondary_tiers"][0]["endpoint_url"] = s3["endpoint_url"]
    _check(cfg)
