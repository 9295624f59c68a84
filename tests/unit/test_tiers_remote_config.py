"""Bad options of the remote tiers are one-line ConfigErrors naming the key (no server needed)."""

from __future__ import annotations

from typing import Any

import pytest
from needs import need_module

from kvtier.engine import Engine
from kvtier.errors import ConfigError


def _cfg(**tier: Any) -> dict[str, Any]:
    return {"block_bytes": 65536, "cpu_bytes_to_use": 1 << 20, "secondary_tiers": [tier]}


@pytest.mark.parametrize(
    ("tier", "needle"),
    [
        ({"type": "redis", "url": "http://x"}, "secondary_tiers[0].url"),
        ({"type": "redis", "url": "unix:///tmp/s.sock", "cluster": True}, "secondary_tiers[0].cluster"),
        ({"type": "redis", "op_timeout": 0}, "secondary_tiers[0].op_timeout"),
        ({"type": "redis", "op_timeout": 600}, "secondary_tiers[0].op_timeout"),
        ({"type": "redis", "unknown_keys": "maybe"}, "secondary_tiers[0].unknown_keys"),
        ({"type": "redis", "password_env": "NO_SUCH_VAR_FOR_TESTS"}, "secondary_tiers[0].password_env"),
        ({"type": "redis", "backpressure": {"high_water": -1}}, "backpressure.high_water"),
        ({"type": "obj"}, "secondary_tiers[0].bucket"),
        (
            {"type": "s3", "bucket": "b", "addressing_style": "sideways"},
            "secondary_tiers[0].addressing_style",
        ),
        ({"type": "s3", "bucket": "b", "multipart_chunk": "1MiB"}, "secondary_tiers[0].multipart_chunk"),
        ({"type": "s3", "bucket": "b", "endpoint_url": "localhost"}, "secondary_tiers[0].endpoint_url"),
        ({"type": "s3", "bucket": "b", "data_path": "fast"}, "secondary_tiers[0].data_path"),
    ],
)
def test_bad_options_name_the_key(tier: dict[str, Any], needle: str) -> None:
    need_module("redis" if tier["type"] == "redis" else "boto3", "redis" if tier["type"] == "redis" else "s3")
    with pytest.raises(ConfigError) as exc:
        Engine(_cfg(**tier))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("options", "env", "direct"),
    [
        ({}, {}, True),
        ({"data_path": "boto3"}, {}, False),
        ({"sign_payload": True}, {}, False),  # the direct path never hashes bodies
        ({}, {"HTTP_PROXY": "http://127.0.0.1:9"}, False),  # boto3 speaks to proxies, it does not
        ({}, {"HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1"}, True),
    ],
)
def test_the_obj_tier_picks_its_data_path(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], env: dict[str, str], direct: bool
) -> None:
    """Where kvtier's own GET/PUT connection is used, aimed where boto3 would send the request
    (no request is made: clients are built lazily and the direct path connects on first use)."""
    need_module("boto3", "s3")
    from kvtier.testing import PrimaryBuffer
    from kvtier.tiers.obj import ObjTier

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    primary = PrimaryBuffer.heap(2, 4096, 4096)
    tier = ObjTier(
        primary_kv_view=primary.view, context=primary.context("obj"), bucket="bkt", key_prefix="p",
        endpoint_url="http://127.0.0.1:7999", addressing_style="path", region="eu-west-1",
        access_key_id="AKID", secret_access_key="SECRET", warm_listing=0, **options,
    )  # fmt: skip
    try:
        wire = tier._client().wire
        assert (wire is not None) is direct
        if wire is not None:
            ep = wire.endpoint
            assert (ep.host, ep.port, ep.base_path, ep.region) == ("127.0.0.1", 7999, "/bkt/", "eu-west-1")
            assert wire.sock is None
    finally:
        tier.shutdown()
