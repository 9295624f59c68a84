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
    ],
)
def test_bad_options_name_the_key(tier: dict[str, Any], needle: str) -> None:
    need_module("redis" if tier["type"] == "redis" else "boto3", "redis" if tier["type"] == "redis" else "s3")
    with pytest.raises(ConfigError) as exc:
        Engine(_cfg(**tier))
    assert needle in str(exc.value) and "\n" not in str(exc.value)
