"""``root_dirs`` parsing and the split of ``max_bytes`` over roots (property tests; the free space
of each root comes through the ``free`` seam, so no disk is read)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.tiers.fs.roots import read_roots

MIN = 8192


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(1, 6))
def test_shares_add_up_keep_own_limits_and_follow_free_space(data: st.DataObject, n: int) -> None:
    own = data.draw(st.lists(st.none() | st.integers(MIN, 1 << 30), min_size=n, max_size=n))
    frees = data.draw(st.lists(st.integers(1 << 30, 1 << 36), min_size=n, max_size=n))  # within 64x
    fixed = sum(o for o in own if o is not None)
    shared = [i for i, o in enumerate(own) if o is None]
    total = data.draw(st.integers(fixed + MIN * (len(shared) + 1) * 1000, fixed + (1 << 40)))
    entries: list[Any] = [
        f"/r{i}" if o is None else {"path": f"/r{i}", "max_bytes": o} for i, o in enumerate(own)
    ]
    specs = read_roots(entries, total, 1, free=lambda p: frees[int(p[2:])])
    assert [s.path for s in specs] == [f"/r{i}" for i in range(n)]
    for s, o in zip(specs, own, strict=True):
        if o is not None:
            assert s.max_bytes == o  # a root's own limit is kept
    sizes = [s.max_bytes or 0 for s in specs]
    if shared:
        assert sum(sizes) == total  # the rest of the total is shared out exactly
        left, weight = total - fixed, sum(frees[i] for i in shared)
        for i in shared:  # by free space, within a byte of the exact share (the last takes the rest)
            assert abs(sizes[i] - left * frees[i] / weight) <= len(shared) + 1
    assert all(s.weight > 0 for s in specs)


def test_without_a_total_shared_roots_are_unbounded_and_weighted_by_free_space() -> None:
    frees = {"/a": 100, "/b": 300}
    specs = read_roots(
        ["/a", {"path": "/b"}, {"path": "/c", "max_bytes": "1MiB"}], None, 1, free=lambda p: frees.get(p, 1)
    )
    assert [(s.max_bytes, s.weight) for s in specs] == [
        (None, 100.0),
        (None, 300.0),
        (1 << 20, float(1 << 20)),
    ]
