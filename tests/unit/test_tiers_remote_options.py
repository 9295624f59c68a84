"""The network tiers' options, declared once (kvtier.tiers.remote.options): every tier's keys are its
dataclass's fields, its constructor signature and ranges come from it, renamed keys still work with
one deprecation line, and every number is checked the same way (no server needed)."""

from __future__ import annotations

import inspect
import logging
import math
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from needs import need_module

from kvtier.errors import ConfigError
from kvtier.numbers import Range
from kvtier.tiers.remote.options import RemoteOptions


def _classes() -> list[tuple[type[Any], type[RemoteOptions], dict[str, Any]]]:
    """(tier class, options class, the least config it builds from) of every network tier."""
    need_module("redis", "redis")
    need_module("boto3", "s3")
    from kvtier.tiers.mooncake import MooncakeOptions, MooncakeTier
    from kvtier.tiers.obj import ObjOptions, ObjTier
    from kvtier.tiers.p2p import P2POptions, P2PTier
    from kvtier.tiers.redis import RedisOptions, RedisTier

    mooncake = {"master_server_addr": "127.0.0.1:50051", "metadata_server": "http://127.0.0.1:8080/metadata"}
    return [
        (RedisTier, RedisOptions, {}),
        (ObjTier, ObjOptions, {"bucket": "b"}),
        (MooncakeTier, MooncakeOptions, mooncake),
        (P2PTier, P2POptions, {"peers": ["127.0.0.1:7801"]}),
    ]


def test_each_tier_takes_exactly_its_options_fields() -> None:
    for tier, opts, _ in _classes():
        assert tier.options_class is opts and issubclass(opts, RemoteOptions)
        params = set(inspect.signature(tier).parameters) - {"primary_kv_view", "context"}
        assert params == {f.name for f in fields(opts)} | set(opts.renamed), tier
        # The common keys are declared once, in the base; a tier only re-declares a default.
        assert {f.name for f in fields(RemoteOptions)} <= params
        assert set(opts.option_ranges()) >= set(RemoteOptions.ranges)


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [("io_threads", "threads", 3), ("prefix", "key_prefix", "team-a")],
)
def test_a_renamed_obj_key_still_works_with_one_deprecation_line(
    old: str, new: str, value: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _classes()
    from kvtier.tiers.obj import ObjOptions

    caplog.set_level(logging.WARNING, "kvtier.tiers.remote")
    first = ObjOptions.from_config({"bucket": "b", old: value}, owner="ObjTier-test-" + old)
    again = ObjOptions.from_config({"bucket": "b", old: value}, owner="ObjTier-test-" + old)
    assert getattr(first, new) == getattr(again, new) == value
    assert first == ObjOptions.from_config({"bucket": "b", new: value})
    lines = [r.getMessage() for r in caplog.records if old in r.getMessage()]
    assert len(lines) == 1 and "deprecated" in lines[0] and new in lines[0] and "\n" not in lines[0]
    with pytest.raises(ConfigError, match=f"^{old}: .*set only {new}"):
        ObjOptions.from_config({"bucket": "b", old: value, new: value})


def test_p2p_tls_ca_is_the_old_name_of_tls_ca_file(caplog: pytest.LogCaptureFixture) -> None:
    _classes()
    from kvtier.tiers.p2p import P2POptions

    caplog.set_level(logging.WARNING, "kvtier.tiers.remote")
    o = P2POptions.from_config({"peers": ["127.0.0.1:7801"], "tls_ca": "/ca.pem"}, owner="P2PTier-test")
    assert o.tls_ca_file == "/ca.pem"
    assert any("tls_ca_file" in r.getMessage() for r in caplog.records)


def test_an_unknown_key_names_the_closest_one() -> None:
    with pytest.raises(ConfigError, match=r"^op_timout: unexpected option \(did you mean 'op_timeout'\?\)"):
        RemoteOptions.from_config({"op_timout": 1.0})


def test_secrets_stay_out_of_the_repr() -> None:
    _classes()
    from kvtier.tiers.obj import ObjOptions
    from kvtier.tiers.p2p import P2POptions
    from kvtier.tiers.redis import RedisOptions

    shown = " ".join(
        [
            repr(RedisOptions(password="hunter2-redis")),
            repr(
                ObjOptions(
                    bucket="b", access_key_id="AKID-x", secret_access_key="hunter2-s3", session_token="tok-z"
                )
            ),
            repr(P2POptions(peers=["127.0.0.1:1"], secret="hunter2-p2p")),
        ]
    )
    for secret in ("hunter2", "AKID-x", "tok-z"):
        assert secret not in shown


def _numeric_fields() -> list[tuple[type[RemoteOptions], dict[str, Any], str, Range]]:
    out = []
    for _, opts, base in _classes():
        for name, rng in opts.ranges.items():
            if isinstance(rng, Range) and name in {f.name for f in fields(opts)}:
                out.append((opts, base, name, rng))
    return out


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_number_of_every_tier_is_checked_the_same_way(data: st.DataObject) -> None:
    """A non-finite or out-of-range value is refused naming the key; an in-range one is kept."""
    opts, base, name, rng = data.draw(st.sampled_from(_numeric_fields()))
    bad = data.draw(
        st.sampled_from([math.nan, math.inf, -math.inf, rng.high * 2 + 1, rng.low - 1, "many", True])
    )
    if rng.open_low and bad == rng.low - 1:
        bad = rng.low
    with pytest.raises(ConfigError, match=f"^{name}: "):
        opts.from_config({**base, name: bad})
    if rng.integer:
        good: float = data.draw(
            st.integers(math.ceil(rng.low) + int(rng.open_low), int(min(rng.high, 1 << 40)))
        )
    else:
        good = data.draw(st.floats(rng.low, min(rng.high, 1e6), exclude_min=rng.open_low, allow_nan=False))
    try:
        kept = opts.from_config({**base, name: good})
    except ConfigError as exc:  # a value the number check passes may still break a cross-option rule
        assert name not in {"op_timeout", "breaker_failures", "negative_ttl", "index_capacity"}, exc
        return
    assert getattr(kept, name) == good


def test_the_factory_suggests_current_names_only() -> None:
    """A typo is answered with the current key, and old names are not offered as valid ones."""
    _classes()
    from kvtier.plugins import create_tier
    from kvtier.testing import PrimaryBuffer

    primary = PrimaryBuffer.heap(2, 4096, 4096)
    with pytest.raises(ConfigError) as exc:
        create_tier({"type": "obj", "bucket": "b", "io_thread": 2}, primary_kv_view=primary.view)
    line = str(exc.value)
    assert "did you mean 'io_threads'" not in line
    accepted = line.split("it accepts: ")[1].split(", ")
    assert "threads" in accepted and "key_prefix" in accepted
    assert "io_threads" not in accepted and "prefix" not in accepted
