"""``TierContractTests``: the secondary-tier contract as a pytest mixin (see :mod:`kvtier.testing`)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing.primary import PrimaryBuffer, wait_for_jobs
from kvtier.tiers.base import SecondaryTier, TierStats

__all__ = ["TierContractTests"]

_PAD = 0xAB  # padding marker: a tier must never write past block_bytes in a row


class TierContractTests:
    """Subclass as ``TestXxx`` and implement :meth:`make_tier`; pytest then runs every contract test.

    Class attributes tune the default buffer and the patience of the suite.
    """

    num_slots: int = 16
    row_stride: int = 8192
    #: Deliberately not a multiple of anything, and smaller than ``row_stride``.
    block_bytes: int = 5000
    #: The tier may write the end of a row past its block's 4 KiB pages (the room an engine's
    #: ``primary_row_pad`` reserves; the mooncake tier keeps the next slot's block header there).
    #: The padding between the block's end and its pages' end must still never be written.
    writes_row_pad: bool = False
    #: Seconds to wait for an asynchronous tier to report a job.
    job_timeout: float = 30.0
    #: Upper bound for one ``submit_*`` call (the contract says non-blocking; this is generous).
    max_submit_seconds: float = 1.0
    #: The longest key the suite uses (a tier whose wire protocol bounds keys lowers it; the
    #: engine's keys are chained hashes of 16-32 bytes).
    max_key_bytes: int = 512

    # -- to implement --------------------------------------------------------------------------
    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> SecondaryTier:
        """Build the tier under test over ``primary.view``; keep any files under ``workdir``."""
        raise NotImplementedError("subclasses of TierContractTests implement make_tier()")

    # -- fixtures ------------------------------------------------------------------------------
    @pytest.fixture
    def primary(self) -> PrimaryBuffer:
        """The primary buffer; override to test over your own memory."""
        return PrimaryBuffer.heap(self.num_slots, self.row_stride, self.block_bytes)

    @pytest.fixture
    def workdir(self, tmp_path: Path) -> Path:
        d = tmp_path / "tier"
        d.mkdir()
        return d

    @pytest.fixture
    def tier(self, primary: PrimaryBuffer, workdir: Path) -> Iterator[SecondaryTier]:
        self._ids = itertools.count(1)
        tier = self.make_tier(primary, workdir)
        try:
            yield tier
        finally:
            tier.shutdown()

    # -- helpers -------------------------------------------------------------------------------
    @staticmethod
    def key(i: int | str) -> BlockKey:
        return BlockKey(f"kvtier-contract/{i}".encode())

    def job(self, keys: Sequence[BlockKey], slots: Sequence[int], *, promotion: bool = False) -> TransferJob:
        if not hasattr(self, "_ids"):
            self._ids = itertools.count(1)
        return TransferJob(
            next(self._ids), list(keys), np.asarray(slots, dtype=np.int32), is_promotion=promotion
        )

    def wait(self, tier: SecondaryTier, *jobs: TransferJob) -> list[JobResult]:
        got = wait_for_jobs(tier, [j.job_id for j in jobs], timeout=self.job_timeout)
        return [got[j.job_id] for j in jobs]

    def store(self, tier: SecondaryTier, keys: Sequence[BlockKey], slots: Sequence[int]) -> JobResult:
        job = self.job(keys, slots)
        tier.submit_store(job)
        return self.wait(tier, job)[0]

    def load(self, tier: SecondaryTier, keys: Sequence[BlockKey], slots: Sequence[int]) -> JobResult:
        job = self.job(keys, slots, promotion=True)
        tier.submit_load(job)
        return self.wait(tier, job)[0]

    def settled_lookup(self, tier: SecondaryTier, key: BlockKey) -> LookupResult:
        """``lookup`` repeated while it answers RETRY (a tier may still be warming up)."""
        deadline = time.monotonic() + self.job_timeout
        while True:
            answer = tier.lookup(key)
            if answer is not LookupResult.RETRY or time.monotonic() > deadline:
                return answer
            time.sleep(0.005)

    # -- the contract --------------------------------------------------------------------------
    def test_lookup_of_unknown_key_is_miss(self, tier: SecondaryTier) -> None:
        """A key never stored answers MISS (after any RETRY while warming up)."""
        assert self.settled_lookup(tier, self.key("never")) is LookupResult.MISS

    def test_store_then_load_round_trips_bytes(self, tier: SecondaryTier, primary: PrimaryBuffer) -> None:
        """Stored blocks load back byte for byte into other slots; row padding is never written."""
        keys = [self.key(i) for i in range(4)]
        written = primary.fill_random(range(4), seed=1)
        primary.rows[0:4, primary.block_bytes :] = _PAD
        result = self.store(tier, keys, [0, 1, 2, 3])
        assert result.success and result.transferred(keys) == keys
        # A tier that stores nothing of its own (p2p: the instance's block server serves the
        # primary tier) moves no bytes on a store.
        moved = 0 if getattr(type(tier), "stores_nothing", False) else 4 * primary.block_bytes
        assert result.nbytes >= moved, "JobResult.nbytes must count the bytes stored"
        dst = [primary.num_slots - 1 - i for i in range(4)]
        for slot in dst:
            primary.rows[slot, : primary.block_bytes] = 0
            primary.rows[slot, primary.block_bytes :] = _PAD
        result = self.load(tier, keys, dst)
        assert result.success and result.transferred(keys) == keys
        assert result.nbytes >= 4 * primary.block_bytes, "JobResult.nbytes must count the bytes loaded"
        kept = -(-primary.block_bytes // 4096) * 4096 if self.writes_row_pad else primary.rows.shape[1]
        for src, slot in zip(range(4), dst, strict=True):
            assert primary.block(slot).tobytes() == written[src], f"slot {slot} differs"
            assert (primary.rows[slot, primary.block_bytes : kept] == _PAD).all(), "row padding was written"
        # Storing never modifies the source slots.
        for src in range(4):
            assert primary.block(src).tobytes() == written[src]

    def test_lookup_hits_after_store_is_reported(self, tier: SecondaryTier, primary: PrimaryBuffer) -> None:
        """Once a store job is reported successful, its keys answer HIT (and lookup_many agrees)."""
        keys = [self.key(i) for i in range(3)]
        primary.fill_random(range(3), seed=2)
        assert self.store(tier, keys, [0, 1, 2]).success
        assert [self.settled_lookup(tier, k) for k in keys] == [LookupResult.HIT] * 3
        assert tier.lookup_many([*keys, self.key("absent")]) == [LookupResult.HIT] * 3 + [LookupResult.MISS]

    def test_every_job_is_reported_exactly_once(self, tier: SecondaryTier, primary: PrimaryBuffer) -> None:
        """Many jobs in flight at once: each is reported once, none twice, none invented."""
        primary.fill_random(range(primary.num_slots), seed=3)
        base = [self.key(f"base{i}") for i in range(2)]
        assert self.store(tier, base, [0, 1]).success
        jobs = [self.job([self.key(f"m{i}")], [2 + i]) for i in range(6)]
        loads = [self.job([base[i]], [10 + i], promotion=True) for i in range(2)]
        for j in jobs:
            tier.submit_store(j)
        for j in loads:
            tier.submit_load(j)
        results = self.wait(tier, *jobs, *loads)
        assert all(r.success for r in results)
        tier.drain()
        assert tier.get_finished_jobs() == []
        assert not tier.has_pending_work()

    def test_store_skips_keys_already_held(self, tier: SecondaryTier, primary: PrimaryBuffer) -> None:
        """Storing a key the tier holds succeeds and keeps the first bytes (keys name content)."""
        first = primary.fill_random([0], seed=4)[0]
        k, fresh = self.key("held"), self.key("fresh")
        assert self.store(tier, [k], [0]).success
        primary.fill_random([1, 2], seed=5)
        result = self.store(tier, [k, fresh], [1, 2])
        assert result.success and result.transferred([k, fresh]) == [k, fresh]
        assert self.load(tier, [k], [5]).success
        assert primary.block(5).tobytes() == first

    def test_load_of_missing_keys_is_partial_success(
        self, tier: SecondaryTier, primary: PrimaryBuffer
    ) -> None:
        """Missing keys are left out of ``successful_keys``; present ones are still loaded."""
        written = primary.fill_random([0, 1], seed=6)
        a, b, missing = self.key("a"), self.key("b"), self.key("missing")
        assert self.store(tier, [a, b], [0, 1]).success
        result = self.load(tier, [a, missing, b], [8, 9, 10])
        assert not result.success
        assert result.transferred([a, missing, b]) == [a, b]
        assert primary.block(8).tobytes() == written[0] and primary.block(10).tobytes() == written[1]
        nothing = self.load(tier, [self.key("x"), self.key("y")], [11, 12])
        assert not nothing.success and nothing.transferred([self.key("x"), self.key("y")]) == []

    def test_drain_waits_for_buffer_io(self, tier: SecondaryTier, primary: PrimaryBuffer) -> None:
        """After ``drain()`` no job touches the buffer: the slots may be reused at once, and the
        results are queued for the very next ``get_finished_jobs`` call."""
        keys = [self.key(f"d{i}") for i in range(4)]
        written = primary.fill_random(range(4), seed=7)
        job = self.job(keys, range(4))
        tier.submit_store(job)
        tier.drain()
        primary.rows[0:4] = 0  # the engine reuses the slots right after drain
        reported = tier.get_finished_jobs()
        assert [r.job_id for r in reported] == [job.job_id] and reported[0].success
        assert self.load(tier, keys, [8, 9, 10, 11]).success
        for i in range(4):
            assert primary.block(8 + i).tobytes() == written[i]

    def test_shutdown_is_idempotent(self, tier: SecondaryTier, primary: PrimaryBuffer) -> None:
        """``shutdown()`` twice (with an unpolled job outstanding) raises nothing."""
        primary.fill_random([0], seed=8)
        tier.submit_store(self.job([self.key("s")], [0]))
        tier.shutdown()
        tier.shutdown()

    def test_submit_does_not_block(self, tier: SecondaryTier, primary: PrimaryBuffer) -> None:
        """``submit_store``/``submit_load`` return promptly (slow work happens on jobs)."""
        n = primary.num_slots // 2
        keys = [self.key(f"nb{i}") for i in range(n)]
        primary.fill_random(range(n), seed=9)
        store = self.job(keys, range(n))
        t0 = time.perf_counter()
        tier.submit_store(store)
        assert time.perf_counter() - t0 < self.max_submit_seconds
        self.wait(tier, store)
        load = self.job(keys, range(n, 2 * n), promotion=True)
        t0 = time.perf_counter()
        tier.submit_load(load)
        assert time.perf_counter() - t0 < self.max_submit_seconds
        assert self.wait(tier, load)[0].success

    def test_stats_count_what_happened(self, tier: SecondaryTier, primary: PrimaryBuffer) -> None:
        """``get_stats()`` has every TierStats counter; stores, loads, hits and bytes add up."""
        before = tier.get_stats()
        assert set(TierStats().as_dict()) <= set(before)
        assert all(isinstance(v, int) for v in before.values())
        keys = [self.key(f"st{i}") for i in range(3)]
        primary.fill_random(range(3), seed=10)
        assert self.store(tier, keys, [0, 1, 2]).success
        assert self.load(tier, keys[:2], [5, 6]).success
        hits = sum(self.settled_lookup(tier, k) is LookupResult.HIT for k in [*keys, self.key("no")])
        after = tier.get_stats()
        delta = {k: after[k] - before[k] for k in before}
        stored = 0 if getattr(type(tier), "stores_nothing", False) else 3  # p2p: held, not stored
        assert delta["stores"] == stored and delta["loads"] == 2 and hits == 3
        assert delta["hits"] >= 3 and delta["lookups"] >= 4
        assert delta["bytes_written"] >= stored * primary.block_bytes
        assert delta["bytes_read"] >= 2 * primary.block_bytes

    def test_removals_name_every_stored_block_that_went_and_nothing_else(
        self, tier: SecondaryTier, primary: PrimaryBuffer
    ) -> None:
        """With ``removals`` enabled, every block the tier stored and no longer holds was noted (an
        eviction, a loss), and no key it never stored is. A bounded tier is driven past its capacity
        (ten buffers' worth of blocks); an unbounded one must note nothing."""
        if getattr(type(tier), "stores_nothing", False):
            pytest.skip("the tier stores nothing of its own")
        assert tier.removals.take() == [], "removals are off until a consumer enables them"
        tier.removals.enable()
        slots = list(range(self.num_slots))
        primary.fill_random(slots, seed=30)
        keys = [self.key(f"rm{i}") for i in range(10 * self.num_slots)]
        stored: set[BlockKey] = set()
        for i in range(0, len(keys), self.num_slots):
            batch = keys[i : i + self.num_slots]
            result = self.store(tier, batch, slots[: len(batch)])
            stored.update(result.transferred(batch))
        gone = {k for k in stored if self.settled_lookup(tier, k) is LookupResult.MISS}
        noted = set(tier.removals.take())
        assert noted <= set(keys), "a key never stored was noted removed"
        assert gone <= noted, f"{len(gone - noted)} block(s) went without being noted"

    def test_awkward_keys_round_trip(self, tier: SecondaryTier, primary: PrimaryBuffer) -> None:
        """Keys are arbitrary bytes: separators, NULs, dots and long keys must not collide or escape."""
        keys = [
            BlockKey(b"/"),
            BlockKey(b"../../etc/passwd"),
            BlockKey(b"\x00\x00\x00"),
            BlockKey(b"\x00\x00"),
            BlockKey(b"a/b"),
            BlockKey(b"a_b"),
            BlockKey("ключ".encode()),
            BlockKey((bytes(range(256)) * 2)[: self.max_key_bytes]),
        ]
        written = primary.fill_random(range(len(keys)), seed=11)
        assert self.store(tier, keys, range(len(keys))).success
        dst = list(range(len(keys), 2 * len(keys)))
        assert self.load(tier, keys, dst).success
        for i, slot in enumerate(dst):
            assert primary.block(slot).tobytes() == written[i], keys[i]

    def test_capabilities_and_config_info(self, tier: SecondaryTier) -> None:
        """Capabilities are plain class attributes; ``config_info()`` is a dict for ``kvtier check``."""
        cls = type(tier)
        assert cls.medium in ("CPU", "STORAGE", "REMOTE")
        for attr in ("tolerates_off_thread_polling", "persistent", "shared"):
            assert isinstance(getattr(cls, attr), bool), attr
        assert isinstance(tier.config_info(), dict)

    def test_persistent_tier_survives_restart(
        self, tier: SecondaryTier, primary: PrimaryBuffer, workdir: Path
    ) -> None:
        """A ``persistent`` tier rebuilt over the same ``workdir`` serves what was stored before."""
        if not type(tier).persistent:
            pytest.skip("tier is not persistent")
        written = primary.fill_random([0], seed=12)
        k = self.key("durable")
        assert self.store(tier, [k], [0]).success
        tier.shutdown()
        again = self.make_tier(primary, workdir)
        try:
            assert self.settled_lookup(again, k) is LookupResult.HIT
            assert self.load(again, [k], [7]).success
            assert primary.block(7).tobytes() == written[0]
        finally:
            again.shutdown()

    def test_touch_of_any_key_is_harmless(self, tier: SecondaryTier, primary: PrimaryBuffer) -> None:
        """``touch`` is a hint: unknown keys are ignored, held keys stay held."""
        primary.fill_random([0], seed=13)
        k = self.key("touched")
        assert self.store(tier, [k], [0]).success
        tier.touch([self.key("unknown"), k])
        assert self.settled_lookup(tier, k) is LookupResult.HIT

    def test_off_thread_polling(self, tier: SecondaryTier, primary: PrimaryBuffer) -> None:
        """A tier with ``tolerates_off_thread_polling`` reports jobs exactly once to a poller thread."""
        if not type(tier).tolerates_off_thread_polling:
            pytest.skip("tier does not tolerate off-thread polling")
        n = min(8, primary.num_slots)
        primary.fill_random(range(n), seed=14)
        jobs = [self.job([self.key(f"ot{i}")], [i]) for i in range(n)]
        seen: list[int] = []
        errors: list[BaseException] = []

        def poll() -> None:
            try:
                deadline = time.monotonic() + self.job_timeout
                while len(seen) < len(jobs) and time.monotonic() < deadline:
                    seen.extend(r.job_id for r in tier.get_finished_jobs())
                    time.sleep(0.001)
            except BaseException as exc:  # surfaced in the main thread below
                errors.append(exc)

        poller = threading.Thread(target=poll, name="kvtier-contract-poller")
        poller.start()
        for job in jobs:
            tier.submit_store(job)
        poller.join(self.job_timeout + 5)
        assert not errors, errors
        assert sorted(seen) == sorted(j.job_id for j in jobs), "each job must be reported exactly once"

    def test_shared_tier_is_visible_to_another_instance(
        self, tier: SecondaryTier, primary: PrimaryBuffer, workdir: Path
    ) -> None:
        """A ``shared`` tier's blocks become visible (eventually) to another instance on the same
        ``workdir``, byte for byte."""
        if not type(tier).shared:
            pytest.skip("tier is not shared")
        written = primary.fill_random([0], seed=15)
        k = self.key("shared")
        assert self.store(tier, [k], [0]).success
        other = self.make_tier(primary, workdir)
        try:
            deadline = time.monotonic() + self.job_timeout
            while other.lookup(k) is not LookupResult.HIT and time.monotonic() < deadline:
                time.sleep(0.01)
            assert other.lookup(k) is LookupResult.HIT
            assert self.load(other, [k], [9]).success
            assert primary.block(9).tobytes() == written[0]
        finally:
            other.shutdown()
