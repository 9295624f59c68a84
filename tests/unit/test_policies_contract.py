"""Every built-in policy (plain and with tenant quotas) passes the shipped conformance suite."""

from __future__ import annotations

from hypothesis import settings

from kvtier.policies.arc import ARCPolicy
from kvtier.policies.base import CachePolicy
from kvtier.policies.lru import LRUPolicy
from kvtier.policies.prefix import PrefixAwarePolicy
from kvtier.policies.s3fifo import S3FIFOPolicy
from kvtier.policies.sieve import SIEVEPolicy
from kvtier.testing import PolicyContractTests

_FAST = settings(max_examples=60, deadline=None)


class TestLRUContract(PolicyContractTests):
    hypothesis_settings = _FAST

    def make_policy(self, capacity: int) -> CachePolicy:
        return LRUPolicy(capacity)


class TestLRUQuotaContract(PolicyContractTests):
    hypothesis_settings = _FAST

    def make_policy(self, capacity: int) -> CachePolicy:
        return LRUPolicy(capacity, tenant_quota=0.5)


class TestARCContract(PolicyContractTests):
    hypothesis_settings = _FAST

    def make_policy(self, capacity: int) -> CachePolicy:
        return ARCPolicy(capacity)


class TestS3FIFOContract(PolicyContractTests):
    hypothesis_settings = _FAST

    def make_policy(self, capacity: int) -> CachePolicy:
        return S3FIFOPolicy(capacity)


class TestSIEVEContract(PolicyContractTests):
    hypothesis_settings = _FAST

    def make_policy(self, capacity: int) -> CachePolicy:
        return SIEVEPolicy(capacity)


class TestPrefixContract(PolicyContractTests):
    hypothesis_settings = _FAST

    def make_policy(self, capacity: int) -> CachePolicy:
        return PrefixAwarePolicy(capacity)


class TestPrefixQuotaContract(PolicyContractTests):
    hypothesis_settings = _FAST

    def make_policy(self, capacity: int) -> CachePolicy:
        return PrefixAwarePolicy(capacity, tenant_quota=0.5, horizon=10.0)
