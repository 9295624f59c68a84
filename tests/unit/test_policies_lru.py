"""LRU specifics: order, batch helpers, protected keys, quotas."""

from __future__ import annotations

import pytest

from kvtier.keys import BlockInfo, BlockKey
from kvtier.policies.lru import LRUPolicy


def k(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(4, "little"))


def test_lru_order_and_touch() -> None:
    p = LRUPolicy(3)
    for i in range(3):
        p.insert(k(i))
    p.touch(k(0))
    assert p.evict(1) == [k(1)]
    assert len(p) == 2 and k(1) not in p


def test_lru_protected_and_atomic_failure() -> None:
    p = LRUPolicy(4)
    p.insert_many([k(i) for i in range(4)])
    assert p.evict(2, protected=[k(0), k(2)]) == [k(1), k(3)]
    before = list(p)
    assert p.evict(1, protected={k(0), k(2)}) == []
    assert list(p) == before
    assert p.evict(3) == []
    assert len(p) == 2


def test_lru_batch_helpers_match_per_key() -> None:
    a, b = LRUPolicy(10), LRUPolicy(10)
    keys = [k(i) for i in range(10)]
    a.insert_many(keys, [BlockInfo(depth=i) for i in range(10)])
    for key in keys:
        b.insert(key)
    a.touch_many(keys[::3])
    for key in keys[::3]:
        b.touch(key)
    assert a.evict(10) == b.evict(10)
    with pytest.raises(ValueError, match="infos"):
        a.insert_many(keys, [None])


def test_unknown_option_is_type_error() -> None:
    with pytest.raises(TypeError):
        LRUPolicy(4, nonsense=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="tenant_quota"):
        LRUPolicy(4, tenant_quota=1.5)


def test_tenant_quota_keeps_a_noisy_tenant_from_evicting_everyone() -> None:
    p = LRUPolicy(10, tenant_quota=0.5)
    for i in range(5):
        p.insert(k(i), BlockInfo(tenant="quiet"))
    # The noisy tenant streams 100 blocks through a full cache.
    for i in range(100, 200):
        if len(p) == p.capacity:
            assert len(p.evict(1, incoming=k(i))) == 1
        p.insert(k(i), BlockInfo(tenant="noisy"))
    # The noisy tenant overshoots its limit (5) by at most one block, so the quiet one keeps >= 4.
    assert sum(k(i) in p for i in range(5)) >= 4
    assert p._quota is not None and p._quota.usage("noisy") <= 6
    assert len(p) == 10
    # Without a quota the quiet tenant is flushed by plain LRU.
    q = LRUPolicy(10)
    for i in range(5):
        q.insert(k(i), BlockInfo(tenant="quiet"))
    for i in range(100, 200):
        if len(q) == q.capacity:
            q.evict(1)
        q.insert(k(i), BlockInfo(tenant="noisy"))
    assert not any(k(i) in q for i in range(5))
