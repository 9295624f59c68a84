"""Conformance suites for plug-in authors, shipped in the wheel.

Run kvtier's own secondary-tier contract tests against your tier in a few lines (pytest)::

    # tests/test_my_tier_contract.py
    from pathlib import Path

    from kvtier.testing import PrimaryBuffer, TierContractTests
    from my_package.tiers import MyTier


    class TestMyTierContract(TierContractTests):
        def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> MyTier:
            return MyTier(primary_kv_view=primary.view, context=primary.context("mine"),
                          root_dir=str(workdir / "store"))

A tier built on :class:`kvtier.tiers.async_tier.AsyncTier` (the base for I/O-doing tiers)
subclasses :class:`AsyncTierContractTests` instead, the same way: it runs the whole tier contract
plus the base's guarantees (failed chunks, jobs after shutdown, back-pressure).

``make_tier`` gets a :class:`PrimaryBuffer` (a heap buffer by default) and a per-test directory;
persistent tiers must keep their data under it, because the persistence test calls ``make_tier``
twice with the same directory. To test with a buffer of your own (shared memory, a torch tensor),
override the ``primary`` fixture and return ``PrimaryBuffer.from_view(your_2d_memoryview,
block_bytes)``; to change only its geometry, set the class attributes ``num_slots``, ``row_stride``
and ``block_bytes``. Asynchronous tiers are polled until ``job_timeout`` seconds; ``max_submit_seconds``
bounds how long a ``submit_*`` call may take (the contract says non-blocking).

The suite needs pytest (``pip install 'kvtier[dev]'`` or just ``pytest``); :class:`PrimaryBuffer`
and :func:`wait_for_jobs` are plain helpers usable from any test runner (``kvtier.testing.primary``).

Network tiers (:class:`kvtier.tiers.remote.RemoteTier`) also have scenario suites run against a
real server: :class:`RemoteFaultTests` (``kvtier.testing.faults``: the server killed or stalled
mid-run, then back) and :class:`SharedStoreTests` (``kvtier.testing.shared``: two engine processes
sharing blocks, tenants apart, damaged values never served, a lost value a miss). A subclass says
how to build the tier and how to reach or damage its server.

Eviction-policy authors subclass :class:`PolicyContractTests` and implement
``make_policy(capacity)`` the same way.

What the suite checks is written in each test's docstring; together they are the contract of
:class:`kvtier.tiers.base.SecondaryTier` as kvtier's engine relies on it.
"""

from __future__ import annotations

from kvtier.testing.async_tier_contract import AsyncTierContractTests
from kvtier.testing.faults import EngineDriver, RemoteFaultTests, block_keys
from kvtier.testing.policy_contract import PolicyContractTests
from kvtier.testing.primary import PrimaryBuffer, run_job, wait_for_jobs
from kvtier.testing.shared import SharedStoreTests
from kvtier.testing.tier_contract import TierContractTests

__all__ = [
    "AsyncTierContractTests",
    "EngineDriver",
    "PolicyContractTests",
    "PrimaryBuffer",
    "RemoteFaultTests",
    "SharedStoreTests",
    "TierContractTests",
    "block_keys",
    "run_job",
    "wait_for_jobs",
]
