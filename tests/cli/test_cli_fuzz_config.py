"""Fuzzed configs (issue 17): whatever a config holds, ``load_config`` returns a config or raises
``ConfigError``, and ``kvtier check`` (in-process :func:`kvtier.cli.main.main`) exits 0, or 2 with
one ``ConfigError``/``PluginError`` line; never another exception, a traceback or exit 1 from a
crash.

The generator mixes valid keys with bad values (wrong types, NaN, huge and negative numbers, size
strings), unknown keys and tier entries (``example``, ``fs`` under a temporary root, unknown
types). It never generates ``module_path``-like values: those import modules by design (the
``plugins`` trust boundary governs them, tested elsewhere). Bounded: a few dozen examples, seconds.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvtier.cli.main import main
from kvtier.config import KvtierConfig, load_config
from kvtier.errors import ConfigError, PluginError

_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 4096, 1 << 20, 1e30, -1, 0.5]),
)
_sizes = st.one_of(_numbers, st.sampled_from(["8KiB", "1MiB", "999999999PiB", "4 KB", "", "lots", "1e3"]))
_junk = st.one_of(
    st.none(), st.booleans(), _numbers, st.text(max_size=6), st.lists(st.integers(), max_size=2)
)
_any = st.one_of(_junk, _sizes, st.dictionaries(st.text(max_size=5), _junk, max_size=3))

_TOP = {
    "cpu_bytes_to_use": st.one_of(_sizes, st.sampled_from([1 << 16, 1 << 20])),
    "block_bytes": st.one_of(_sizes, st.sampled_from([4096, 8192])),
    "eviction_policy": st.sampled_from(["lru", "arc", "sieve", "s3fifo", "lur", "", 7]),
    "policy_options": _any,
    "write_policy": st.sampled_from(["write_through", "write_back", "after_hits", "write_thru", None]),
    "write_after_hits": _junk,
    "max_inflight_jobs": _junk,
    "promotion_share": _numbers,
    "pin_share": st.one_of(_numbers, _junk),
    "pin_max_ttl_s": st.one_of(_numbers, _junk),
    "metrics_port": _junk,
    "model": _junk,
    "cache_salt": _junk,
    "primary_backing": st.sampled_from(["heap", "none", "gpu", 1]),
    "cost_model": st.one_of(
        _any,
        st.fixed_dictionaries(
            {},
            optional={
                "prefill_seconds_per_token": _numbers,
                "prefil_seconds_per_token": _numbers,
                "tokens_per_block": _junk,
                "tiers": st.dictionaries(st.sampled_from(["example0", "fs1", "exmaple0"]), _any, max_size=2),
            },
        ),
    ),
    "plugins": st.one_of(_any, st.just({"allow_module_path": False})),
    "unknown_key": _junk,
}
_FS = {
    "max_bytes": _sizes,
    "threads": st.one_of(_junk, st.integers(min_value=-2, max_value=100_000)),
    "batch_blocks": _junk,
    "fsync": _junk,
    "verify": st.sampled_from(["always", "never", "sometimes", True]),
    "direct_io": st.sampled_from(["auto", "never", "always", False, "maybe"]),
    "full_backoff": _numbers,
    "refresh_interval": _numbers,
    "log_interval": _numbers,
    "record_access": _junk,
    "precreate_dirs": st.booleans(),
    "eviction_policy": st.sampled_from(["lru", "nope"]),
    "bogus": _junk,
}
_EXAMPLE = {"capacity_blocks": _junk, "name": _junk, "bogus": _junk}


_VALID_TIERS: dict[str, dict[str, Any]] = {
    "example": {"type": "example", "capacity_blocks": 4},
    "fs": {"type": "fs", "threads": 1, "precreate_dirs": False, "max_bytes": "1MiB"},
}


@st.composite
def _configs(draw: st.DrawFn, root: str) -> dict[str, Any]:
    """A valid config (small primary, 0-3 tiers), then up to three keys changed to generated values:
    mostly valid configs with one or two things wrong, the case a hand-written config is."""
    cfg: dict[str, Any] = {"block_bytes": 4096, "cpu_bytes_to_use": 16 * 4096}
    kinds = draw(st.lists(st.sampled_from(["example", "fs", "nosuch"]), max_size=3))
    tiers = []
    for i, kind in enumerate(kinds):
        entry = dict(_VALID_TIERS.get(kind, {"type": kind}))
        if kind == "fs":
            entry["root_dir"] = f"{root}/t{i}"
        for key in draw(st.lists(st.sampled_from(sorted(_FS if kind == "fs" else _EXAMPLE)), max_size=2)):
            entry[key] = draw((_FS if kind == "fs" else _EXAMPLE)[key])
        tiers.append(entry)
    if tiers:
        cfg["secondary_tiers"] = tiers
    for key in draw(st.lists(st.sampled_from(sorted(_TOP)), max_size=3)):
        cfg[key] = draw(_TOP[key])
    if draw(st.integers(0, 9)) == 0:
        cfg["secondary_tiers"] = draw(_any)
    return cfg


def _finite(cfg: KvtierConfig) -> None:
    assert cfg.cpu_bytes_to_use >= 0 and cfg.block_bytes >= 1
    assert math.isfinite(cfg.promotion_share)
    assert 0.0 <= cfg.pin_share <= 1.0 and math.isfinite(cfg.pin_max_ttl_s) and cfg.pin_max_ttl_s > 0


_ROOT = "/tmp/kvtier-fuzz-placeholder"


def _subclasses(cls: type) -> set[str]:
    return {cls.__name__}.union(*(_subclasses(c) for c in cls.__subclasses__()))


#: The error types exit 2 may name: ConfigError and PluginError and their subclasses.
_INPUT_ERRORS = _subclasses(ConfigError) | _subclasses(PluginError)


@settings(max_examples=200, deadline=None)
@given(_configs(_ROOT))
def test_load_config_returns_a_config_or_raises_config_error(raw: dict[str, Any]) -> None:
    try:
        cfg = load_config(raw)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        event("ConfigError")
        return
    event("loaded")
    _finite(cfg)
    # The JSON form of the same config loads the same way.
    try:
        text = json.dumps(raw, allow_nan=False)
    except ValueError:
        return
    assert load_config(text) == cfg


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_kvtier_check_exits_0_or_2_with_one_line_whatever_the_config(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], data: st.DataObject
) -> None:
    root = str(tmp_path_factory.mktemp("fuzz"))
    raw = data.draw(_configs(root))
    try:
        text = json.dumps(raw, allow_nan=False)
    except ValueError:  # NaN/Infinity: JSON has no spelling; Python's would be JSON5-ish
        text = json.dumps(raw)
    code = main(["check", text])
    out = capsys.readouterr()
    err = out.err.strip()
    event(f"exit {code}")
    if code == 2:
        assert len(err.splitlines()) == 1, err
        assert err.split(":", 1)[0] in _INPUT_ERRORS, err
    else:
        # 0: every tier round-tripped; a tier that fails its probe is reported, not a crash.
        assert code == 0, (code, err, out.out[-500:])
        assert "Traceback" not in err and "Error:" not in err, err
