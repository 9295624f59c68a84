"""Hypothesis stateful tests: every built-in policy against a reference model of residency.

Invariants checked after every step: ``len`` equals the model, never above capacity; iteration and
``in`` agree with the model. ``evict`` returns exactly ``n`` distinct resident, unprotected keys, or
``[]`` only when fewer than ``n`` unprotected keys exist -- and then the policy is unchanged (its
complete future eviction order, obtained by draining a copy, is the same as before the call).
"""

from __future__ import annotations

import copy
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvtier.keys import BlockInfo, BlockKey
from kvtier.policies.arc import ARCPolicy
from kvtier.policies.base import CachePolicy
from kvtier.policies.lru import LRUPolicy
from kvtier.policies.prefix import PrefixAwarePolicy
from kvtier.policies.s3fifo import S3FIFOPolicy
from kvtier.policies.sieve import SIEVEPolicy

KEYS = [BlockKey(bytes([i])) for i in range(14)]
keys_st = st.sampled_from(KEYS)
tenants_st = st.sampled_from([None, "a", "b"])

FACTORIES: dict[str, Any] = {
    "lru": lambda c: LRUPolicy(c),
    "arc": lambda c: ARCPolicy(c),
    "s3fifo": lambda c: S3FIFOPolicy(c),
    "sieve": lambda c: SIEVEPolicy(c),
    "prefix": lambda c: PrefixAwarePolicy(c),
    "prefix_fixed": lambda c: PrefixAwarePolicy(c, horizon=5.0, ghost_factor=1.0),
    "lru_quota": lambda c: LRUPolicy(c, tenant_quota=0.5),
    "arc_quota": lambda c: ARCPolicy(c, tenant_quota=0.4),
    "s3fifo_quota": lambda c: S3FIFOPolicy(c, tenant_quota=0.5),
    "sieve_quota": lambda c: SIEVEPolicy(c, tenant_quota=0.3),
    "prefix_quota": lambda c: PrefixAwarePolicy(c, tenant_quota=0.5),
}


def _drain_order(policy: CachePolicy) -> list[BlockKey]:
    clone = copy.deepcopy(policy)
    return clone.evict(len(clone)) if len(clone) else []


def make_machine(factory: Any) -> type[RuleBasedStateMachine]:  # noqa: C901 (counts the nested rules)
    class PolicyMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.capacity = 0
            self.policy: CachePolicy | None = None
            self.model: set[BlockKey] = set()
            self.last: BlockKey | None = None  # parent for the next insert (builds chains)

        @precondition(lambda self: self.policy is None)
        @rule(capacity=st.integers(1, 8))
        def create(self, capacity: int) -> None:
            self.capacity = capacity
            self.policy = factory(capacity)

        def _info(self, data: st.DataObject, key: BlockKey) -> BlockInfo | None:
            kind = data.draw(st.sampled_from(["none", "chain", "random"]))
            tenant = data.draw(tenants_st)
            if kind == "none":
                return None if tenant is None else BlockInfo(tenant=tenant)
            parent = self.last if kind == "chain" else data.draw(st.one_of(st.none(), keys_st))
            if parent == key:
                parent = None
            return BlockInfo(parent=parent, depth=data.draw(st.integers(0, 5)), tenant=tenant)

        @precondition(lambda self: self.policy is not None)
        @rule(key=keys_st, data=st.data())
        def access(self, key: BlockKey, data: st.DataObject) -> None:
            """What an owner does on a lookup: touch a hit; on a miss evict if full, then insert."""
            p = self.policy
            assert p is not None
            if key in self.model:
                p.touch(key)
                return
            if len(self.model) >= self.capacity:
                protected = set(data.draw(st.lists(st.sampled_from(sorted(self.model)), max_size=3)))
                self._evict_checked(1, protected, key)
                if len(self.model) >= self.capacity:
                    return  # everything protected: the owner does not insert
            p.insert(key, self._info(data, key))
            self.model.add(key)
            self.last = key

        @precondition(lambda self: self.policy is not None)
        @rule(key=keys_st)
        def remove(self, key: BlockKey) -> None:
            assert self.policy is not None
            self.policy.remove(key)
            self.model.discard(key)

        @precondition(lambda self: self.policy is not None)
        @rule(n=st.integers(0, 9), protected=st.sets(keys_st, max_size=8), use_incoming=st.booleans())
        def evict(self, n: int, protected: set[BlockKey], use_incoming: bool) -> None:
            incoming = next((k for k in KEYS if k not in self.model), None) if use_incoming else None
            self._evict_checked(n, protected, incoming)

        @precondition(lambda self: self.policy is not None)
        @rule(keys=st.lists(keys_st, max_size=6))
        def touch_many(self, keys: list[BlockKey]) -> None:
            assert self.policy is not None
            self.policy.touch_many([k for k in keys if k in self.model])

        @precondition(lambda self: self.policy is not None)
        @rule(key=keys_st)
        def out_of_contract(self, key: BlockKey) -> None:
            """Touching an absent key or re-inserting a resident one must not corrupt the policy."""
            assert self.policy is not None
            if key in self.model:
                self.policy.insert(key, BlockInfo(depth=1))
            else:
                self.policy.touch(key)
                self.policy.touch_many([key])

        def _evict_checked(self, n: int, protected: set[BlockKey], incoming: BlockKey | None) -> None:
            p = self.policy
            assert p is not None
            before = _drain_order(p)
            victims = p.evict(n, protected, incoming)
            available = len(self.model - protected)
            if n > 0 and available >= n:
                assert len(victims) == n
                assert len(set(victims)) == n
                assert set(victims) <= self.model
                assert not set(victims) & protected
                self.model -= set(victims)
            else:
                assert victims == []
                assert set(p) == self.model
                assert _drain_order(p) == before, "a failed evict changed the policy's state"

        @invariant()
        def consistent(self) -> None:
            p = self.policy
            if p is None:
                return
            assert len(p) == len(self.model) <= self.capacity
            assert set(p) == self.model
            for key in KEYS:
                assert (key in p) == (key in self.model)

    return PolicyMachine


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_policy_state_machine(name: str) -> None:
    machine = make_machine(FACTORIES[name])
    machine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
    machine.TestCase().runTest()
