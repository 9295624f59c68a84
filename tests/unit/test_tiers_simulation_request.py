"""The tier simulation hook's request object and the shared lookup counter of ``tiers/base.py``.

``SecondaryTier.simulation(...)`` (what the simulator calls) hands its arguments to ``simulate`` as one
:class:`SimulationRequest`; a tier overriding ``simulate`` must see exactly what the caller passed,
and the request's helpers must name keys and build policies as the simulator's factory would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import ConfigError
from kvtier.keys import LookupResult
from kvtier.policies.base import CachePolicy
from kvtier.policies.lru import LRUPolicy
from kvtier.tiers.base import (
    UNBOUNDED_BLOCKS,
    PrimaryProfile,
    SimulationProfile,
    SimulationRequest,
    TierStats,
    whole_job,
)
from kvtier.tiers.example import ExampleTier

Call = tuple[str, int, Mapping[str, Any], str]


def _factory(calls: list[Call]) -> Any:
    def make(
        policy: str, capacity: int, options: Mapping[str, Any] | None = None, *, key_path: str = ""
    ) -> CachePolicy:
        calls.append((policy, capacity, dict(options or {}), key_path))
        return LRUPolicy(capacity)

    return make


def test_request_names_keys_under_its_path() -> None:
    calls: list[Call] = []
    assert SimulationRequest({}, 4096, _factory(calls), "secondary_tiers[1]").key("max_bytes") == (
        "secondary_tiers[1].max_bytes"
    )
    assert SimulationRequest({}, 4096, _factory(calls)).key("max_bytes") == "max_bytes"


def test_request_size_parses_and_names_the_bad_key() -> None:
    calls: list[Call] = []
    req = SimulationRequest({"max_bytes": "2MiB", "bad": "lots"}, 4096, _factory(calls), "tiers[0]")
    assert req.size("max_bytes") == 2 << 20
    assert req.size("absent") is None
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.bad"):
        req.size("bad")


def test_request_policy_uses_the_entry_policy_and_options() -> None:
    calls: list[Call] = []
    options = {"eviction_policy": "s3fifo", "policy_options": {"small_ratio": 0.2}}
    SimulationRequest(options, 4096, _factory(calls), "t[0]").policy(17)
    SimulationRequest({}, 4096, _factory(calls)).policy(5)
    assert calls == [("s3fifo", 17, {"small_ratio": 0.2}, "t[0]"), ("lru", 5, {}, "")]


@given(
    max_bytes=st.one_of(st.none(), st.integers(1, 1 << 40)),
    block_bytes=st.integers(1, 1 << 22),
    key_path=st.sampled_from(["", "secondary_tiers[0]"]),
)
def test_simulation_hands_simulate_what_it_was_given(
    max_bytes: int | None, block_bytes: int, key_path: str
) -> None:
    seen: list[SimulationRequest] = []
    primary = PrimaryProfile(8, 8192, LRUPolicy)

    class Recording(ExampleTier):
        @classmethod
        def simulate(cls, request: SimulationRequest) -> SimulationProfile:
            seen.append(request)
            return super().simulate(request)

    calls: list[Call] = []
    options = {} if max_bytes is None else {"max_bytes": max_bytes}
    profile = Recording.simulation(
        options, block_bytes=block_bytes, policy_factory=_factory(calls), key_path=key_path, primary=primary
    )
    (req,) = seen
    assert req == SimulationRequest(options, block_bytes, req.policy_factory, key_path, primary)
    # The default model: max_bytes // block_bytes blocks, the policy one larger, whole-job chunks.
    want = None if max_bytes is None else max(max_bytes // block_bytes, 1)
    assert profile.capacity_blocks == want
    assert calls[0][1] == (UNBOUNDED_BLOCKS if max_bytes is None else max_bytes // block_bytes + 1)
    assert profile.chunk_blocks is whole_job and profile.medium == Recording.medium


@given(st.lists(st.sampled_from(list(LookupResult)), max_size=50))
def test_counted_counts_every_lookup_and_each_hit(answers: list[LookupResult]) -> None:
    stats = TierStats()
    assert [stats.counted(a) for a in answers] == answers
    assert stats.lookups == len(answers)
    assert stats.hits == answers.count(LookupResult.HIT)
