"""``PolicyContractTests``: the eviction-policy contract as a pytest mixin.

    from kvtier.testing import PolicyContractTests
    from my_package.policies import MyPolicy


    class TestMyPolicyContract(PolicyContractTests):
        def make_policy(self, capacity):
            return MyPolicy(capacity, my_option=3)

Checks the rules of :class:`kvtier.policies.base.CachePolicy` the primary tier relies on: residency
bookkeeping (``len``/``in``/``iter``), atomic ``evict`` (exactly ``n`` unprotected victims, or ``[]``
and no change), protected keys never chosen, ``remove`` of absent keys ignored, batch helpers equal
to per-key calls, unknown options rejected with ``TypeError``; plus a Hypothesis property driving a
random sequence of operations the way an owner does.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.keys import BlockInfo, BlockKey
from kvtier.policies.base import CachePolicy

__all__ = ["PolicyContractTests"]


def _k(i: int) -> BlockKey:
    return BlockKey(b"policy-contract/%d" % i)


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "touch", "remove", "evict"]),
        st.integers(0, 40),
        st.integers(0, 6),
        st.sets(st.integers(0, 40), max_size=8),
    ),
    max_size=120,
)


class TierlessOwner:
    """A minimal owner: keeps the resident set the way the primary tier does, evicting when full."""

    def __init__(self, policy: CachePolicy) -> None:
        self.policy = policy
        self.resident: set[BlockKey] = set()

    def admit(self, key: BlockKey, depth: int) -> bool:
        if key in self.resident:
            self.policy.touch(key)
            return True
        if len(self.resident) >= self.policy.capacity:
            victims = self.policy.evict(1, incoming=key)
            if not victims:
                return False
            self.resident.difference_update(victims)
        info = BlockInfo(parent=_k(depth - 1) if depth else None, depth=depth)
        self.policy.insert(key, info if depth % 2 else None)
        self.resident.add(key)
        return True


class PolicyContractTests:
    """Subclass as ``TestXxx`` and implement :meth:`make_policy`."""

    #: Capacity used by the tests (small, so eviction happens constantly).
    capacity: int = 8
    #: Hypothesis settings of the random-operations property (None: 150 examples, no deadline).
    hypothesis_settings: settings | None = None

    def make_policy(self, capacity: int) -> CachePolicy:
        """Build the policy under test for ``capacity`` blocks."""
        raise NotImplementedError("subclasses of PolicyContractTests implement make_policy()")

    # -- fixed scenarios -----------------------------------------------------------------------
    def test_residency_bookkeeping(self) -> None:
        """``len``, ``in`` and ``iter`` follow insert/remove exactly; ``capacity`` is as built."""
        policy = self.make_policy(self.capacity)
        assert policy.capacity == self.capacity and len(policy) == 0
        keys = [_k(i) for i in range(self.capacity)]
        for key in keys:
            policy.insert(key)
        assert len(policy) == self.capacity and set(policy) == set(keys)
        assert all(key in policy for key in keys) and _k(999) not in policy
        policy.remove(keys[0])
        policy.remove(_k(999))  # absent: ignored
        assert len(policy) == self.capacity - 1 and keys[0] not in policy

    def test_evict_returns_exactly_n_unprotected_victims(self) -> None:
        """Victims are resident, unprotected, exactly ``n``, and gone from the policy afterwards."""
        policy = self.make_policy(self.capacity)
        keys = [_k(i) for i in range(self.capacity)]
        for key in keys:
            policy.insert(key)
        protected = set(keys[: self.capacity // 2])
        victims = policy.evict(2, protected=protected)
        assert len(victims) == 2 and len(set(victims)) == 2
        assert not set(victims) & protected and set(victims) <= set(keys)
        assert all(v not in policy for v in victims) and len(policy) == self.capacity - 2

    def test_evict_is_atomic_when_impossible(self) -> None:
        """Asking for more unprotected victims than exist returns ``[]`` and changes nothing."""
        policy = self.make_policy(self.capacity)
        keys = [_k(i) for i in range(self.capacity)]
        for key in keys:
            policy.insert(key)
        before = set(policy)
        assert policy.evict(self.capacity, protected={keys[0]}) == []
        assert set(policy) == before
        assert policy.evict(1, protected=set(keys)) == []
        assert set(policy) == before
        # ... and the policy still works afterwards.
        assert len(policy.evict(self.capacity)) == self.capacity and len(policy) == 0

    def test_batch_helpers_match_per_key_calls(self) -> None:
        """``insert_many``/``touch_many`` leave the policy as the per-key calls would."""
        one, many = self.make_policy(self.capacity), self.make_policy(self.capacity)
        keys = [_k(i) for i in range(self.capacity)]
        infos = [BlockInfo(depth=i) for i in range(self.capacity)]
        for key, info in zip(keys, infos, strict=True):
            one.insert(key, info)
        many.insert_many(keys, infos)
        for key in keys[::2]:
            one.touch(key)
        many.touch_many(keys[::2])
        assert one.evict(self.capacity // 2) == many.evict(self.capacity // 2)
        assert set(one) == set(many)

    def test_unknown_option_and_bad_capacity_are_rejected(self) -> None:
        """Unknown options raise ``TypeError`` (kvtier reports it as a config error); capacity < 1 fails."""
        cls: Any = type(self.make_policy(self.capacity))
        with pytest.raises(TypeError):
            cls(self.capacity, kvtier_contract_no_such_option=1)
        with pytest.raises((ValueError, TypeError)):
            cls(0)

    # -- property ------------------------------------------------------------------------------
    def test_random_operations_keep_the_contract(self) -> None:
        """A random mix of the owner's calls: residency matches the owner's view after each step,
        capacity is never exceeded, and every ``evict`` is exact-or-nothing."""

        # @given on an inner function: one mixin method shared by many subclasses would trip
        # Hypothesis' differing-executors health check.
        @(self.hypothesis_settings or settings(max_examples=150, deadline=None))
        @given(_OPS)
        def run(ops: list[tuple[str, int, int, set[int]]]) -> None:
            self._check_operations(ops)

        run()

    def _check_operations(self, ops: list[tuple[str, int, int, set[int]]]) -> None:
        owner = TierlessOwner(self.make_policy(self.capacity))
        policy = owner.policy
        for op, i, n, prot in ops:
            key = _k(i)
            if op == "insert":
                owner.admit(key, depth=i % 5)
            elif op == "touch" and key in owner.resident:
                policy.touch(key)
            elif op == "remove":
                policy.remove(key)
                owner.resident.discard(key)
            elif op == "evict":
                protected = {_k(p) for p in prot}
                before = set(owner.resident)
                victims = policy.evict(n, protected=protected)
                if victims:
                    assert len(victims) == n and len(set(victims)) == n
                    assert set(victims) <= before and not set(victims) & protected
                    owner.resident.difference_update(victims)
                else:
                    assert n == 0 or len(before - protected) < n, "evict gave up although victims existed"
                    assert set(policy) == before, "a failed evict changed the policy"
            assert len(policy) == len(owner.resident) <= policy.capacity
            assert set(policy) == owner.resident
