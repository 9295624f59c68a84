"""PrefixAwarePolicy: leaf-first eviction, learned reuse curve, and the prefix-hit comparison."""

from __future__ import annotations

import pytest

from kvtier.keys import BlockInfo, BlockKey
from kvtier.policies.prefix import PrefixAwarePolicy


def k(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(4, "little"))


def _chain(p: PrefixAwarePolicy, ids: list[int]) -> None:
    parent = None
    for depth, i in enumerate(ids):
        p.insert(k(i), BlockInfo(parent=parent, depth=depth))
        parent = k(i)


def _warm(p: PrefixAwarePolicy) -> PrefixAwarePolicy:
    """Give the policy a settled reuse curve (a fresh one drifts while its first counts come in)."""
    p._reach = [[0, 10_000, 3_000, 1_500, 900, 600, 400, 300, 250, 2_000] for _ in range(4)]
    p._refresh()
    return p


def test_tail_is_evicted_before_head() -> None:
    p = _warm(PrefixAwarePolicy(6))
    _chain(p, [0, 1, 2])  # the older chain
    _chain(p, [10, 11, 12])
    # LRU would take 0 (oldest); a prefix-aware policy trims the oldest chain from its tail.
    assert p.evict(1) == [k(2)]
    assert p.evict(1) == [k(1)]
    assert p.evict(1) == [k(0)]


def test_shared_head_outlives_its_branches() -> None:
    p = _warm(PrefixAwarePolicy(5))
    _chain(p, [0, 1])
    p.touch(k(0))
    p.insert(k(2), BlockInfo(parent=k(0), depth=1))  # second branch under the shared head
    p.insert(k(3), BlockInfo())
    victims = p.evict(3)
    assert k(0) not in victims and set(victims) == {k(1), k(2), k(3)}


def test_protected_leaves_force_inner_nodes_only_as_last_resort() -> None:
    p = _warm(PrefixAwarePolicy(3))
    _chain(p, [0, 1, 2])
    assert p.evict(1, protected={k(2)}) == [k(1)]  # only inner nodes left unprotected
    assert p.evict(2, protected={k(2)}) == []  # only k(0) is unprotected: fail, unchanged
    assert set(p) == {k(0), k(2)}


def test_frequent_blocks_are_kept_over_recent_one_offs() -> None:
    p = PrefixAwarePolicy(4, horizon=50.0)
    for i in range(200):  # teach the policy that re-used blocks get re-used again
        key = k(1000 + i % 20)
        if key in p:
            p.touch(key)
        else:
            if len(p) >= p.capacity:
                p.evict(1)
            p.insert(key)
    assert p.reuse_probability(3) > p.reuse_probability(1)
    q = PrefixAwarePolicy(3, horizon=100.0)
    q._reach = [row[:] for row in p._reach]  # same learned curve
    q._refresh()
    q.insert(k(1))
    for _ in range(5):
        q.touch(k(1))
    q.insert(k(2))
    q.insert(k(3))
    assert q.evict(1) == [k(2)]  # the once-seen older block goes, the hot one stays


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="horizon"):
        PrefixAwarePolicy(4, horizon=0)
    with pytest.raises(ValueError, match="ghost_factor"):
        PrefixAwarePolicy(4, ghost_factor=-1)
    for bad in (float("nan"), float("inf")):  # NaN slipped past the old `<= 0` checks
        with pytest.raises(ValueError, match="horizon: expected a finite number"):
            PrefixAwarePolicy(4, horizon=bad)
        with pytest.raises(ValueError, match="ghost_factor: expected a finite number"):
            PrefixAwarePolicy(4, ghost_factor=bad)
    with pytest.raises(TypeError):
        PrefixAwarePolicy(4, bogus=True)  # type: ignore[call-arg]


def test_stranded_blocks_go_first_and_recover_when_the_parent_returns() -> None:
    p = _warm(PrefixAwarePolicy(8))
    p.insert(k(10))  # an old, unrelated root
    p.insert(k(11))
    _chain(p, [0, 1])
    p.remove(k(0))  # invalidated head: block 1 can no longer be a prefix hit
    assert p.evict(1) == [k(1)]  # stranded, although more recent than 10 and 11
    _chain(p, [0, 1])
    p.remove(k(0))
    p.insert(k(0), BlockInfo(depth=0))  # the head comes back: 1 is reachable again
    assert p.evict(2) == [k(10), k(11)]


def test_heap_stays_bounded_under_hits_only() -> None:
    p = PrefixAwarePolicy(10)
    _chain(p, list(range(5)))
    for _ in range(10_000):
        p.touch(k(4))
    assert len(p._heap) <= 4 * len(p) + 64 + 1
    assert p.evict(1) == [k(4)]  # the only leaf, however hot: a chain is trimmed from its tail
