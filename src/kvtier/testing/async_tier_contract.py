"""``AsyncTierContractTests``: the tier contract plus :class:`~kvtier.tiers.async_tier.AsyncTier`'s
own guarantees, for any tier built on that base (see :mod:`kvtier.testing`)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kvtier.keys import BlockKey
from kvtier.testing.primary import PrimaryBuffer
from kvtier.testing.tier_contract import TierContractTests
from kvtier.tiers.async_tier import AsyncTier, ChunkOutcome, JobState
from kvtier.tiers.base import SecondaryTier

__all__ = ["AsyncTierContractTests"]


class AsyncTierContractTests(TierContractTests):
    """Subclass as ``TestXxx`` and implement :meth:`make_tier` returning an :class:`AsyncTier`.

    Runs every :class:`TierContractTests` test, then checks what the base promises: a job
    submitted after shutdown is a failed job, a chunk that raises fails only its own keys and the
    tier carries on, a paused store gate drops and counts stores, and finished stores feed the gate.
    Failures are injected by replacing the tier's chunk methods on the instance (the real I/O runs
    for every other chunk).
    """

    @pytest.fixture
    def async_tier(self, tier: SecondaryTier) -> Iterator[AsyncTier]:
        assert isinstance(tier, AsyncTier), "AsyncTierContractTests.make_tier must return an AsyncTier"
        yield tier

    def test_jobs_after_shutdown_are_failed_jobs(self, async_tier: AsyncTier, primary: PrimaryBuffer) -> None:
        """After ``shutdown()``, ``submit_*`` raise nothing; each job is reported once, failed."""
        primary.fill_random([0], seed=20)
        async_tier.shutdown()
        store = self.job([self.key("late-s")], [0])
        load = self.job([self.key("late-l")], [1], promotion=True)
        async_tier.submit_store(store)
        async_tier.submit_load(load)
        got = {r.job_id: r for r in async_tier.get_finished_jobs()}
        assert set(got) == {store.job_id, load.job_id}
        assert not got[store.job_id].success and not got[load.job_id].success
        assert "shut down" in (got[store.job_id].error or "")
        assert async_tier.get_finished_jobs() == [] and not async_tier.has_pending_work()

    def test_a_raising_chunk_fails_its_job_and_the_tier_carries_on(
        self, async_tier: AsyncTier, primary: PrimaryBuffer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A chunk that raises is a failed job (reported once, counted), never a dead worker."""
        primary.fill_random(range(2), seed=21)
        keys = [self.key("boom0"), self.key("boom1")]

        def boom(state: JobState, items: list[tuple[BlockKey, int]]) -> ChunkOutcome:
            raise RuntimeError("injected failure")

        failed_before = async_tier.get_stats()["failed_jobs"]
        monkeypatch.setattr(async_tier, "_store_chunk", boom)
        result = self.store(async_tier, keys, [0, 1])
        assert not result.success and "injected failure" in (result.error or "")
        monkeypatch.undo()
        assert async_tier.get_stats()["failed_jobs"] == failed_before + 1
        assert self.store(async_tier, keys, [0, 1]).success  # the same keys, now for real
        monkeypatch.setattr(async_tier, "_load_chunk", boom)
        assert not self.load(async_tier, keys, [5, 6]).success
        monkeypatch.undo()
        assert self.load(async_tier, keys, [5, 6]).success

    def test_one_failing_chunk_is_partial_success(
        self, async_tier: AsyncTier, primary: PrimaryBuffer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With one block per chunk, a load whose chunk for one key raises still loads the others,
        and reports exactly them in ``successful_keys``."""
        if type(async_tier).runs_inline:
            pytest.skip("an inline tier runs each job as one chunk")
        written = primary.fill_random(range(4), seed=22)
        keys = [self.key(f"part{i}") for i in range(4)]
        assert self.store(async_tier, keys, range(4)).success
        async_tier.batch_blocks = async_tier.load_batch_blocks = 1  # one chunk per key
        real = async_tier._load_chunk

        def flaky(state: JobState, items: list[tuple[BlockKey, int]]) -> ChunkOutcome:
            if any(k == keys[1] for k, _ in items):
                raise OSError("injected read failure")
            return real(state, items)

        monkeypatch.setattr(async_tier, "_load_chunk", flaky)
        result = self.load(async_tier, keys, [8, 9, 10, 11])
        assert not result.success
        assert result.transferred(keys) == [keys[0], keys[2], keys[3]]
        for src, slot in ((0, 8), (2, 10), (3, 11)):
            assert primary.block(slot).tobytes() == written[src]

    def test_paused_store_gate_drops_and_counts_stores(
        self, async_tier: AsyncTier, primary: PrimaryBuffer
    ) -> None:
        """While the store gate is paused, stores fail at once and count in ``dropped_stores``;
        loads are unaffected; after the pause stores work again."""
        primary.fill_random(range(3), seed=23)
        held = self.key("gate-held")
        assert self.store(async_tier, [held], [0]).success
        before = async_tier.get_stats()["dropped_stores"]
        async_tier.store_gate.pause(0.3, "paused by the contract test")
        t0 = time.monotonic()
        result = self.store(async_tier, [self.key("gate1"), self.key("gate2")], [1, 2])
        assert not result.success and result.error == "paused by the contract test"
        assert async_tier.get_stats()["dropped_stores"] == before + 2
        assert self.load(async_tier, [held], [6]).success
        time.sleep(max(0.0, 0.35 - (time.monotonic() - t0)))
        assert self.store(async_tier, [self.key("gate1")], [1]).success

    def test_finished_stores_feed_the_gate(self, async_tier: AsyncTier, primary: PrimaryBuffer) -> None:
        """Every store job that moved bytes reports its latency to ``store_gate.observe``."""
        seen: list[tuple[int, float]] = []
        gate = async_tier.store_gate
        real = gate.observe

        def observe(nbytes: int, seconds: float) -> None:
            seen.append((nbytes, seconds))
            real(nbytes, seconds)

        gate.observe = observe  # type: ignore[method-assign]
        primary.fill_random([0], seed=24)
        assert self.store(async_tier, [self.key("lat")], [0]).success
        assert seen and seen[-1][0] >= primary.block_bytes and seen[-1][1] >= 0

    def test_misuse_raises_at_once(self, async_tier: AsyncTier) -> None:
        """Engine bugs raise ``MisuseError`` from ``submit_*`` (a slot outside the buffer)."""
        from kvtier.errors import MisuseError

        with pytest.raises(MisuseError, match="outside"):
            async_tier.submit_store(self.job([self.key("bad")], [self.num_slots_of(async_tier)]))
        assert not async_tier.has_pending_work()

    @staticmethod
    def num_slots_of(tier: SecondaryTier) -> int:
        return int(tier.rows.shape[0])
