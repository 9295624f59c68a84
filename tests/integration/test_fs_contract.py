"""FsTier passes the reusable tier conformance suite (kvtier.testing), on real files."""

from __future__ import annotations

from pathlib import Path

from kvtier.testing import PrimaryBuffer, TierContractTests
from kvtier.tiers.fs import FsTier


class TestFsTierContract(TierContractTests):
    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> FsTier:
        return FsTier(primary_kv_view=primary.view, context=primary.context("fs"), root_dir=str(workdir))


class TestFsTierContractBounded(TierContractTests):
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
        )
