"""FsTier passes the reusable conformance suite for AsyncTier-based tiers (kvtier.testing), on real
files, on both paths (one file per block, and small blocks in segments); a chunk that raises leaves
no reservation behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.testing import AsyncTierContractTests, PrimaryBuffer
from kvtier.tiers.async_tier import ChunkOutcome, JobState
from kvtier.tiers.fs import FsTier


class TestFsTierContract(AsyncTierContractTests):
    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> FsTier:
        return FsTier(
            primary_kv_view=primary.view, context=primary.context("fs"), root_dir=str(workdir),
            small_block_bytes=0,
        )  # fmt: skip

    def test_a_raising_store_chunk_leaves_no_reservation(
        self, tier: FsTier, primary: PrimaryBuffer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Reserved bytes of blocks a raising chunk never wrote are given back (bounded tiers
        would otherwise shrink until restart)."""
        primary.fill_random(range(4), seed=30)
        tier.batch_blocks = 1
        real = tier._store_chunk
        bad = self.key("raise-after-reserve")

        def half(state: JobState, items: list[tuple[object, int]]) -> ChunkOutcome:
            if any(k == bad for k, _ in items):
                tier._store._job_grant(state)  # reserve like a real chunk, then fail before writing
                raise RuntimeError("injected after reserving")
            return real(state, items)  # type: ignore[arg-type]

        monkeypatch.setattr(tier, "_store_chunk", half)
        keys = [self.key("r0"), bad, self.key("r2")]
        result = self.store(tier, keys, [0, 1, 2])
        assert result.transferred(keys) == [keys[0], keys[2]]
        st = tier.usage()
        assert st.reserved == 0 and st.published == 2 * tier.layout.file_size(len(keys[0]))


class TestFsTierContractBounded(AsyncTierContractTests):
    """Same suite with a small byte limit, fsync on and checksum verification off."""

    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> FsTier:
        return FsTier(
            primary_kv_view=primary.view,
            context=primary.context("fs"),
            root_dir=str(workdir),
            max_bytes="1MiB",
            fsync=True,
            verify="never",
            threads=2,
            small_block_bytes=0,
        )


class TestFsSegmentsContract(AsyncTierContractTests):
    """The small-block path (the suite's blocks are below the default ``small_block_bytes``)."""

    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> FsTier:
        tier = FsTier(primary_kv_view=primary.view, context=primary.context("fs"), root_dir=str(workdir))
        assert tier.segments is not None
        return tier


class TestFsSegmentsContractBounded(AsyncTierContractTests):
    """The small-block path with a small byte limit (compaction runs), fsync on, verify off."""

    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> FsTier:
        tier = FsTier(
            primary_kv_view=primary.view, context=primary.context("fs"), root_dir=str(workdir),
            max_bytes="2MiB", fsync=True, verify="never", threads=2,
        )  # fmt: skip
        assert tier.segments is not None
        return tier
