"""The example tier passes kvtier's own conformance suite for AsyncTier-based tiers (as every later
tier must)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvtier.testing import AsyncTierContractTests, PrimaryBuffer
from kvtier.tiers.example import ExampleTier


class TestExampleTierContract(AsyncTierContractTests):
    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> ExampleTier:
        return ExampleTier(primary_kv_view=primary.view, context=primary.context("example"))


class TestBoundedExampleTierContract(AsyncTierContractTests):
    """Same contract with a capacity that every test fits in, over a buffer the test provides."""

    @pytest.fixture
    def primary(self) -> PrimaryBuffer:
        # A view over a larger allocation (rows of 12 KiB, block 4 KiB + 1): a caller-chosen buffer.
        backing = np.zeros((20, 12 * 1024), dtype=np.uint8)
        return PrimaryBuffer.from_view(memoryview(backing), 4097)

    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> ExampleTier:
        return ExampleTier(
            primary_kv_view=primary.view, context=primary.context("bounded"), capacity_blocks=64
        )
