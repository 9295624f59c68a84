"""Synthetic payloads (deterministic, key-sensitive) and the hit-ratio plot (a real PNG)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from needs import need_module

from kvtier.errors import KvtierError
from kvtier.keys import BlockKey
from kvtier.sim.payload import PayloadFactory
from kvtier.sim.plot import plot_hit_ratio

keys_st = st.lists(st.binary(min_size=1, max_size=40).map(BlockKey), min_size=1, max_size=8, unique=True)


@settings(max_examples=100, deadline=None)
@given(keys=keys_st, block_bytes=st.integers(1, 5000))
def test_payload_is_deterministic_and_verifies(keys: list[BlockKey], block_bytes: int) -> None:
    pf = PayloadFactory(block_bytes)
    data = pf.make(keys)
    assert data.shape == (len(keys), block_bytes) and data.dtype == np.uint8
    assert np.array_equal(data, PayloadFactory(block_bytes).make(keys))
    assert pf.mismatches(keys, data) == []


@settings(max_examples=100, deadline=None)
@given(keys=keys_st, pos=st.integers(0, 4095), flip=st.integers(1, 255))
def test_any_corrupted_byte_is_detected(keys: list[BlockKey], pos: int, flip: int) -> None:
    pf = PayloadFactory(4096)
    data = pf.make(keys)
    data[0, pos] ^= flip
    assert pf.mismatches(keys, data) == [0]


def test_block_served_under_another_key_is_detected() -> None:
    pf = PayloadFactory(4096)
    a, b = BlockKey(b"a" * 16), BlockKey(b"b" * 16)
    data = pf.make([a, b])
    swapped = data[::-1].copy()
    assert pf.mismatches([a, b], swapped) == [0, 1]
    # A 16-byte lane shift (same key bytes, wrong offset) is caught by the position mask.
    shifted = np.roll(data[0], 16)[None, :]
    assert pf.mismatches([a], shifted) == [0]


def test_plot_writes_png_with_curves(tmp_path: Path) -> None:
    need_module("matplotlib", "cli")
    out = tmp_path / "plot.png"
    labels = plot_hit_ratio(
        out,
        {"lru": [(1, 0.05), (5, 0.19), (10, 0.28)], "arc": [(1, 0.06), (5, 0.2), (10, 0.29)]},
        opt=[(1, 0.25), (5, 0.36), (10, 0.366)],
        ceiling=0.3664,
    )
    # One legend entry per policy, then the OPT curve and the infinite-cache line.
    assert labels == ["lru", "arc", "OPT (Belady)", "infinite cache (36.64%)"]
    raw = out.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) > 10_000


def test_plot_without_opt_or_ceiling_draws_only_the_policies(tmp_path: Path) -> None:
    need_module("matplotlib", "cli")
    labels = plot_hit_ratio(tmp_path / "p.png", {"sieve": [(1, 0.1), (5, 0.2)]})
    assert labels == ["sieve"]


def test_plot_unwritable_path_is_one_line_error(tmp_path: Path) -> None:
    need_module("matplotlib", "cli")
    with pytest.raises(KvtierError, match="--plot: cannot write"):
        plot_hit_ratio(tmp_path / "missing-dir" / "p.png", {"lru": [(1, 0.1)]})
