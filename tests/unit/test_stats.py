"""The typed views of ``Engine.stats()`` (kvtier.stats): every field is a key a real engine reports,
reading is total (any JSON-like value reads without raising), numbers come through unchanged."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvtier.engine import Engine
from kvtier.keys import BlockKey
from kvtier.stats import EngineStats, PrimaryStats, TierReport

BLOCK = 4096


def _real_stats(tmp_path: Path) -> dict[str, Any]:
    config = {
        "cpu_bytes_to_use": 4 * BLOCK, "block_bytes": BLOCK,
        "secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path / "fs"), "max_bytes": "1MiB"}],
    }  # fmt: skip
    with Engine(config) as e:
        keys = [BlockKey(b"s/%d" % i) for i in range(6)]
        data = np.arange(6 * BLOCK, dtype=np.uint64).astype(np.uint8).reshape(6, BLOCK)
        for lo in (0, 3):
            e.store_blocks(keys[lo : lo + 3], data[lo : lo + 3])
            e.drain()
        e.lookup(keys)
        e.drain()
        out = np.empty((1, BLOCK), dtype=np.uint8)
        e.load_blocks(keys[-1:], out)
        return e.stats()


def _numeric(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.type in ("float", "float | None")]


def test_every_field_is_a_key_a_real_engine_reports(tmp_path: Path) -> None:
    raw = _real_stats(tmp_path)
    assert [k for k in _numeric(EngineStats) if k not in raw] == []
    assert [k for k in _numeric(PrimaryStats) if k not in raw["primary"]] == []
    # An fs tier is an I/O tier with a gate and a capacity: it reports every tier field.
    assert [k for k in _numeric(TierReport) if k not in raw["tiers"]["fs0"]] == []


def test_a_real_snapshot_reads_field_by_field(tmp_path: Path) -> None:
    raw = _real_stats(tmp_path)
    s = EngineStats.from_mapping(raw)
    for name in _numeric(EngineStats):
        assert getattr(s, name) == raw[name], name
    assert s.primary is not None and s.primary.resident == raw["primary"]["resident"]
    fs0 = s.tiers["fs0"]
    for name in _numeric(TierReport):
        assert getattr(fs0, name) == raw["tiers"]["fs0"][name], name
    assert s.latency == raw["latency"]


def test_missing_counters_read_as_zero_and_unreported_gauges_as_none() -> None:
    s = EngineStats.from_mapping({"tiers": {"t": {"hits": 2}}})
    assert s.primary is None and s.lookups == 0.0
    assert s.tiers["t"].hits == 2.0 and s.tiers["t"].used_bytes is None and s.tiers["t"].gate_state is None


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
_keys = st.sampled_from([*_numeric(EngineStats), "primary", "tiers", "latency", "other"])


@given(st.dictionaries(_keys, _json, max_size=8))
def test_any_json_like_snapshot_reads_without_raising(raw: dict[str, Any]) -> None:
    s = EngineStats.from_mapping(raw)
    for name in _numeric(EngineStats):
        value = raw.get(name)
        expected = float(value) if isinstance(value, int | float) else 0.0
        assert getattr(s, name) == expected
