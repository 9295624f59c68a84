"""MooncakeTier passes the shared tier conformance suite against a real Mooncake Store: a
``mooncake_master`` and a separate ``mooncake_client`` holder on loopback (see mooncake_servers)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, ClassVar

import pytest
from mooncake_servers import MooncakeStore
from needs import need_module

from kvtier.testing import AsyncTierContractTests, PrimaryBuffer

need_module("mooncake.store", "mooncake")

from kvtier.tiers.mooncake import MooncakeTier  # noqa: E402


def prefix(workdir: Path) -> str:
    """One key prefix per test (same workdir = same prefix: shared/persistent tests rebuild the
    tier over the same data)."""
    return "t" + hashlib.sha1(str(workdir).encode()).hexdigest()[:12]


class TestMooncakeContract(AsyncTierContractTests):
    @pytest.fixture(autouse=True)
    def _store(self, mooncake_store: MooncakeStore) -> None:
        self.mc = mooncake_store

    #: Extra tier options (the zero-copy subclass below turns staging off).
    options: ClassVar[dict[str, Any]] = {}

    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> MooncakeTier:
        cfg = self.mc.tier_config(key_prefix=prefix(workdir), **self.options)
        del cfg["type"]
        return MooncakeTier(primary_kv_view=primary.view, context=primary.context("mooncake"), **cfg)  # type: ignore[arg-type]


class TestMooncakeZeroCopyContract(TestMooncakeContract):
    """The same suite on the zero-copy path (two pieces per object, no staging copy): the suite's
    blocks are small, so the class above runs the staged one."""

    options: ClassVar[dict[str, Any]] = {"staging_max_block": 0}


class TestMooncakeInPlaceContract(TestMooncakeContract):
    """The same suite on rows with header room (an engine's ``primary_row_pad``): objects move in
    place, one zero-copy piece from the end of the previous row through the slot (slot 0 staged)."""

    row_stride = 8192 + 4096
    writes_row_pad = True

    def test_objects_move_in_place(self, tier: MooncakeTier) -> None:
        assert tier.config_info()["data_path"] == {"store": "in place", "load": "in place"}
