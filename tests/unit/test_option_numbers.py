"""Every numeric option of every built-in tier passes one shared check (issue 28).

Walks each built-in tier's constructor: every option whose default is a number must be declared
in the class's ``option_ranges`` (so a new option cannot skip the check), and NaN, infinities,
1e300, negatives and any value outside its declared range are refused by
:func:`kvtier.plugins.check_tier` with a ``ConfigError`` naming the entry and the option, before
anything is built. The p2p ``serve`` options go through the same check.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.errors import ConfigError
from kvtier.numbers import Range, check_number
from kvtier.plugins import TIERS, check_tier
from kvtier.tiers.base import TierContext
from kvtier.tiers.p2p.service import SERVE_RANGES, check_serve_options

TIER_NAMES = sorted(TIERS.builtin_names())
CONTEXT = TierContext(name="t", block_bytes=4096)
HOSTILE = [math.nan, math.inf, -math.inf, 1e300, -1e300, -1, -0.5]


def numeric_options(cls: type) -> dict[str, inspect.Parameter]:
    params = inspect.signature(cls).parameters.values()
    return {
        p.name: p for p in params if isinstance(p.default, int | float) and not isinstance(p.default, bool)
    }


def all_options() -> list[tuple[str, str, Range]]:
    """(tier, dotted option path, range) for every declared option the tier accepts, nested
    mappings (``backpressure``, ``serve``) walked into."""
    out = []
    for name in TIER_NAMES:
        cls = TIERS.resolve(name)
        accepted = set(inspect.signature(cls).parameters)
        for option, rng in cls.option_ranges.items():
            if option not in accepted:
                continue
            if isinstance(rng, Range):
                out.append((name, option, rng))
            else:
                out.extend((name, f"{option}.{sub}", r) for sub, r in rng.items())
    return out


def entry(name: str, option: str, value: object) -> dict[str, object]:
    """A tier config entry setting the (possibly dotted) ``option`` to ``value``."""
    head, _, sub = option.partition(".")
    return {"type": name, head: {sub: value} if sub else value}


OPTIONS = all_options()


@pytest.mark.parametrize("name", TIER_NAMES)
def test_every_numeric_option_is_declared(name: str) -> None:
    cls = TIERS.resolve(name)
    missing = sorted(set(numeric_options(cls)) - set(cls.option_ranges))
    assert not missing, f"tier {name!r}: numeric options without a declared range: {missing}"
    accepted = inspect.signature(cls).parameters
    if "backpressure" in accepted:  # nested numeric options are declared too
        from kvtier.tiers.backpressure import GateConfig

        numeric = {f.name for f in dataclasses.fields(GateConfig) if f.type in ("float", "int")}
        assert numeric <= set(cls.option_ranges["backpressure"])


def outside(rng: Range) -> st.SearchStrategy[Any]:
    """Values ``rng`` refuses: the hostile list, just past each end, and non-integers for integers."""
    bad = [v for v in HOSTILE if not (math.isfinite(v) and rng.contains(v) and not rng.integer)]
    candidates = st.sampled_from(bad) | st.floats(min_value=rng.high, exclude_min=True, allow_infinity=False)
    if rng.open_low or rng.low > -1e300:
        candidates |= st.floats(max_value=rng.low, exclude_max=not rng.open_low, allow_infinity=False)
    if rng.integer:
        candidates |= st.floats(min_value=rng.low, max_value=min(rng.high, 1e9)).filter(
            lambda v: not v.is_integer()
        )
    return candidates.filter(
        lambda v: not (math.isfinite(v) and rng.contains(v) and (v.is_integer() or not rng.integer))
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_every_option_refuses_nan_inf_huge_and_negative(data: st.DataObject) -> None:
    name, option, rng = data.draw(st.sampled_from(OPTIONS), label="option")
    value = data.draw(outside(rng), label="value")
    with pytest.raises(ConfigError) as err:
        check_tier(entry(name, option, value), CONTEXT)
    assert err.value.key_path == f"secondary_tiers[0].{option}", str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("name", "option", "rng"), OPTIONS, ids=[f"{n}.{o}" for n, o, _ in OPTIONS])
@pytest.mark.parametrize("value", HOSTILE[:5], ids=["nan", "inf", "-inf", "1e300", "-1e300"])
def test_each_option_refuses_each_hostile_value(name: str, option: str, rng: Range, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"secondary_tiers\[0\]\.{option}: expected"):
        check_tier(entry(name, option, value), CONTEXT)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_values_inside_a_range_pass_the_shared_check(data: st.DataObject) -> None:
    _, option, rng = data.draw(st.sampled_from(OPTIONS))
    if rng.integer:
        value: float = data.draw(st.integers(int(rng.low) + rng.open_low, int(min(rng.high, 2**62))))
    else:
        value = data.draw(st.floats(rng.low, rng.high, exclude_min=rng.open_low))
    assert check_number(option, value, rng) == value


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_serve_options_pass_the_same_check(data: st.DataObject) -> None:
    option = data.draw(st.sampled_from(sorted(SERVE_RANGES)))
    value = data.draw(outside(SERVE_RANGES[option]))
    with pytest.raises(ConfigError, match=rf"serve\.{option}: expected"):
        check_serve_options({option: value})


@pytest.mark.parametrize("key", ["prefill_seconds_per_token", "prefill_tokens_per_second"])
@pytest.mark.parametrize("value", [math.nan, math.inf, 1e300, -1, 0])
def test_cost_model_numbers_pass_the_same_check(key: str, value: float) -> None:
    from kvtier.config import load_config
    from kvtier.costmodel import CostModel

    cfg = load_config({"cpu_bytes_to_use": 65536, "block_bytes": 4096, "cost_model": {key: value}})
    with pytest.raises(ConfigError, match=rf"cost_model\.{key}: expected"):
        CostModel.from_config(cfg)


REMOTE = [(n, o, r) for n, o, r in OPTIONS if n in ("redis", "obj", "s3", "mooncake", "p2p")]


@pytest.mark.parametrize(("name", "option", "rng"), REMOTE, ids=[f"{n}.{o}" for n, o, _ in REMOTE])
def test_a_remote_constructor_refuses_a_bad_number_before_starting_anything(
    name: str, option: str, rng: Range
) -> None:
    import threading

    from kvtier.testing import PrimaryBuffer

    primary = PrimaryBuffer.heap(2, 8192, 4096)
    options = entry(name, option, math.nan)
    del options["type"]
    before = threading.active_count()
    with pytest.raises(ConfigError, match=rf"{option.rpartition('.')[2]}: expected"):
        TIERS.resolve(name)(primary_kv_view=primary.view, context=primary.context("t"), **options)
    assert threading.active_count() == before  # no worker thread left behind
