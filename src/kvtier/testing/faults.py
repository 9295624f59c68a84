"""``RemoteFaultTests``: a network tier against its server's real faults, as a pytest mixin.

The scenario every network tier must survive, written once: the server (or the process holding the
data) dies or stalls mid-run, then comes back. Subclass with a real server the test owns (it is
damaged) and implement the hooks::

    class TestMyStoreFaults(RemoteFaultTests):
        faults = ("kill", "stall")

        @pytest.fixture(autouse=True)
        def _server(self, tmp_path):
            self.server = MyServer(tmp_path)
            yield
            self.server.stop()

        def make_tier(self, primary, **options):
            return MyTier(primary_kv_view=primary.view, context=primary.context("mine"),
                          url=self.server.url, **options)

        def break_service(self, fault): ...   # kill or pause it
        def restore_service(self, fault): ... # start or resume it

What is checked: jobs are reported within a few deadlines whatever the server does; loads of held
keys fail until the breaker opens and lookups answer MISS (never a phantom hit); while it is open
stores are dropped at once and counted and loads fail at once; no call on the engine's thread
waits on the server; the tier recovers by itself (half-open trials, through jobs or through
lookups alone) and new blocks round-trip byte-exact; what the server lost is a miss, never wrong
bytes. :class:`EngineDriver` (jobs submitted like an engine, engine-thread calls timed) serves
backend-specific fault tests too.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import pytest

from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing.primary import PrimaryBuffer, wait_for_jobs
from kvtier.tiers.remote.base import RemoteTier

__all__ = ["EngineDriver", "RemoteFaultTests", "block_keys"]


def block_keys(tag: str, n: int) -> list[BlockKey]:
    """``n`` distinct keys named after ``tag``."""
    return [BlockKey(f"{tag}{i}".encode()) for i in range(n)]


class EngineDriver:
    """Submits jobs to ``tier`` like an engine and times every call made on the "engine thread".

    ``job_limit``: seconds within which every job must be reported, whatever the server does.
    """

    def __init__(self, tier: RemoteTier, *, job_limit: float, patience: float = 30.0) -> None:
        self.tier = tier
        self.job_limit = job_limit
        self.patience = patience
        self.ids = itertools.count(1)
        #: The slowest engine-thread call so far, in seconds.
        self.slowest = 0.0

    def timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self.slowest = max(self.slowest, time.perf_counter() - t0)
        return out

    def run(self, keys: list[BlockKey], slots: list[int], *, load: bool) -> JobResult:
        """Submit one store (or load) job and wait for its result."""
        job = TransferJob(next(self.ids), keys, np.asarray(slots, dtype=np.int32), is_promotion=load)
        t0 = time.monotonic()
        self.timed(self.tier.submit_load if load else self.tier.submit_store, job)
        result = wait_for_jobs(self.tier, [job.job_id], timeout=self.patience)[job.job_id]
        took = time.monotonic() - t0
        assert took < self.job_limit, f"a job took {took:.2f} s (limit {self.job_limit:.2f} s)"
        return result

    def lookup(self, key: BlockKey) -> LookupResult:
        answer: LookupResult = self.timed(self.tier.lookup, key)
        return answer


class RemoteFaultTests:
    """Subclass as ``TestXxx``, implement the hooks; pytest runs every scenario once per ``faults``."""

    #: Fault kinds :meth:`break_service` / :meth:`restore_service` understand ("kill": the data is
    #: gone when it comes back; "stall": it is kept).
    faults: ClassVar[tuple[str, ...]] = ("kill",)
    #: Seconds: the tier's ``op_timeout``.
    deadline: ClassVar[float] = 0.3
    #: Tier options besides ``op_timeout`` (a quick breaker, two workers).
    options: ClassVar[dict[str, Any]] = {"breaker_failures": 2, "breaker_reset": 0.3, "threads": 2}
    #: Seconds one engine-thread call may take (it never waits on the server).
    engine_call: ClassVar[float] = 0.3
    #: Seconds the tier may take to notice the fault from job outcomes.
    notice_within: ClassVar[float] = 3.0
    #: Seconds the tier may take to recover once the service is back.
    recover_within: ClassVar[float] = 10.0
    #: Every job is reported within ``job_deadlines * deadline + job_slack`` seconds.
    job_deadlines: ClassVar[float] = 4.0
    job_slack: ClassVar[float] = 0.5

    # -- to implement ------------------------------------------------------------------------
    def make_tier(self, primary: PrimaryBuffer, **options: Any) -> RemoteTier:
        """The tier under test over ``primary``, on the service the test damages."""
        raise NotImplementedError("subclasses of RemoteFaultTests implement make_tier()")

    def break_service(self, fault: str) -> None:
        """Inflict ``fault`` on the service (kill it, stop it, kill the data holder)."""
        raise NotImplementedError

    def restore_service(self, fault: str) -> None:
        """Undo ``fault`` (start it again on the same address, resume it)."""
        raise NotImplementedError

    def while_down(self, tier: RemoteTier, held: list[BlockKey]) -> None:
        """Backend checks once the tier noticed the fault (default: none)."""

    # -- fixtures ------------------------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "fault" in metafunc.fixturenames:
            metafunc.parametrize("fault", self.faults)

    @pytest.fixture
    def primary(self) -> PrimaryBuffer:
        return PrimaryBuffer.heap(16, 8192, 5000)

    @pytest.fixture
    def tier(self, primary: PrimaryBuffer) -> Iterator[RemoteTier]:
        tier = self.make_tier(primary, op_timeout=self.deadline, **self.options)
        try:
            yield tier
        finally:
            tier.shutdown()

    @pytest.fixture
    def driver(self, tier: RemoteTier) -> EngineDriver:
        return EngineDriver(tier, job_limit=self.job_deadlines * self.deadline + self.job_slack)

    # -- the scenarios ---------------------------------------------------------------------------
    def _notice(self, d: EngineDriver, held: list[BlockKey]) -> None:
        """Load held keys until the breaker opens: every load fails meanwhile (no phantom hit)."""
        t0 = time.monotonic()
        while d.lookup(held[0]) is LookupResult.HIT:
            assert not d.run(held[:1], [8], load=True).success, "a load from a down service succeeded"
            assert time.monotonic() - t0 < self.notice_within, "the fault was not noticed from job outcomes"

    def test_service_down_then_back(
        self, tier: RemoteTier, driver: EngineDriver, primary: PrimaryBuffer, fault: str
    ) -> None:
        """Loads fail until the breaker opens; then lookups miss, stores are dropped at once and
        counted, loads fail at once; once the service is back the tier recovers by itself and new
        blocks round-trip byte-exact; what the service lost is never served as wrong bytes."""
        d = driver
        written = primary.fill_random(range(4), seed=21)
        held = block_keys("held", 4)
        assert d.run(held, [0, 1, 2, 3], load=False).success
        assert all(d.lookup(k) is LookupResult.HIT for k in held)
        self.break_service(fault)
        self._notice(d, held)
        self.while_down(tier, held)
        stats = tier.get_stats()
        assert stats["breaker_open"] >= 1 and stats["breaker_opens"] >= 1, stats
        assert all(d.lookup(k) is LookupResult.MISS for k in held)
        before = tier.get_stats()["dropped_stores"]
        dropped = d.run(block_keys("down", 2), [4, 5], load=False)
        assert not dropped.success
        if "breaker" in (dropped.error or ""):  # dropped at once and counted
            assert tier.get_stats()["dropped_stores"] == before + 2
        else:  # ``breaker_reset`` passed meanwhile: this store was the half-open trial, and failed
            assert (
                tier.get_stats()["breaker_opens"] > stats["breaker_opens"] or tier.get_stats()["breaker_open"]
            )
        assert not d.run(held[:1], [10], load=True).success
        self.restore_service(fault)
        fresh, data = block_keys("fresh", 4), primary.fill_random([4, 5, 6, 7], seed=22)
        deadline = time.monotonic() + self.recover_within
        while not d.run(fresh, [4, 5, 6, 7], load=False).success:
            assert time.monotonic() < deadline, "the tier did not recover after the service came back"
            time.sleep(0.1)
        assert d.lookup(fresh[0]) is LookupResult.HIT
        primary.rows[8:12] = 0
        assert d.run(fresh, [8, 9, 10, 11], load=True).success
        assert [primary.block(s).tobytes() for s in (8, 9, 10, 11)] == [data[s] for s in (4, 5, 6, 7)]
        assert tier.get_stats()["breaker_open"] == 0
        primary.rows[12] = 0
        kept = d.run(held[:1], [12], load=True)
        assert not kept.success or primary.block(12).tobytes() == written[0]
        assert d.slowest < self.engine_call, f"an engine-thread call took {d.slowest:.3f} s"

    def test_lookups_alone_close_the_breaker(
        self, tier: RemoteTier, driver: EngineDriver, primary: PrimaryBuffer, fault: str
    ) -> None:
        """With no jobs at all once the breaker is open, lookups start the half-open trial (a real
        data-path operation, not a health call) and the breaker closes once the service is back."""
        d = driver
        primary.fill_random([0], seed=23)
        held = block_keys("probe", 1)
        assert d.run(held, [0], load=False).success
        self.break_service(fault)
        self._notice(d, held)
        self.restore_service(fault)
        deadline = time.monotonic() + self.recover_within
        while tier.get_stats()["breaker_open"]:
            assert time.monotonic() < deadline, "lookups did not close the breaker"
            d.lookup(held[0])
            time.sleep(0.05)
        assert d.slowest < self.engine_call, f"an engine-thread call took {d.slowest:.3f} s"
