"""The one-pass LRU curve equals per-capacity flat LRU simulation exactly.

The oracle is an independent flat LRU (an ``OrderedDict``: every block of every request, in trace
order, one cache request each — the sequence libCacheSim sees)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvtier.plan.curve import lru_curve, stack_distances
from kvtier.sim.defaults import shipped_trace
from kvtier.sim.trace import flatten, read_trace


def flat_lru_hits(flat: np.ndarray, capacity: int) -> int:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for x in flat.tolist():
        if x in cache:
            cache.move_to_end(x)
            hits += 1
        else:
            cache[x] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits


def test_shipped_trace_curve_equals_flat_lru_at_reference_capacities() -> None:
    with shipped_trace() as path:
        flat = flatten(read_trace(path))
    curve = lru_curve(flat)
    assert curve.unique == 182_790 and curve.refs == 288_500
    for pct in (1, 5, 10, 25, 50):
        cap = curve.unique * pct // 100
        assert curve.hits(cap) == flat_lru_hits(flat, cap), pct
    # The README's reference figures (shared/traces/README.md), and the infinite ceiling.
    assert round(100 * curve.hit_ratio(1827), 2) == 5.23
    assert round(100 * curve.hit_ratio(9139), 2) == 19.54
    assert curve.hits(curve.unique) == curve.refs - curve.unique


@given(st.lists(st.integers(0, 12), max_size=80), st.integers(1, 15))
def test_curve_equals_flat_lru_on_any_sequence(seq: list[int], capacity: int) -> None:
    flat = np.asarray(seq, dtype=np.int64)
    assert lru_curve(flat).hits(capacity) == flat_lru_hits(flat, capacity)


def test_stack_distance_definition() -> None:
    # a b c a b b : distances -1 -1 -1 2 2 0
    d = stack_distances(np.array([1, 2, 3, 1, 2, 2]))
    assert d.tolist() == [-1, -1, -1, 2, 2, 0]
    assert stack_distances(np.array([], dtype=np.int64)).size == 0
