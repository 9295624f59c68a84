"""The mooncake tier when its segment holder dies mid-run and comes back (kvtier.testing.RemoteFaultTests).

The master keeps a dead holder's objects listed (``is_exist`` says yes) for ``client_ttl`` (~10 s)
and its ``health_check`` stays fine, so the tier must find the death from job outcomes: loads fail
within a few deadlines, the breaker opens, lookups answer MISS long before the master notices, no
call on the engine's thread blocks, and once the holder is back new blocks round-trip again."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from mooncake_servers import LOOPBACK_ENV, MooncakeStore, raw_client
from needs import need_module

from kvtier.keys import BlockKey
from kvtier.testing import PrimaryBuffer
from kvtier.testing.faults import RemoteFaultTests
from kvtier.tiers.remote import RemoteTier

need_module("mooncake.store", "mooncake")

from kvtier.tiers.mooncake import MooncakeTier  # noqa: E402


class TestMooncakeFaults(RemoteFaultTests):
    faults = ("kill_holder",)
    deadline = 1.0
    options: ClassVar[dict[str, Any]] = {"breaker_failures": 2, "breaker_reset": 0.5, "threads": 2}
    engine_call = 0.05  # seconds: an engine-thread call never waits on the store
    notice_within = 8.0
    recover_within = 20.0  # the master forgets the dead segment within client_ttl
    job_deadlines = 3.0
    job_slack = 1.0

    @pytest.fixture(autouse=True)
    def _store(self, tmp_path: Path) -> Iterator[None]:
        os.environ.update(LOOPBACK_ENV)
        self.store = MooncakeStore(tmp_path / "mc", segment="64MB")
        yield
        self.store.stop()

    def make_tier(self, primary: PrimaryBuffer, **options: Any) -> MooncakeTier:
        cfg = self.store.tier_config(key_prefix="faults", **options)
        del cfg["type"]
        return MooncakeTier(primary_kv_view=primary.view, context=primary.context("mooncake"), **cfg)

    def break_service(self, fault: str) -> None:
        self.store.kill_holder()

    def restore_service(self, fault: str) -> None:
        self.store.start_holder()

    def while_down(self, tier: RemoteTier, held: list[BlockKey]) -> None:
        # The master had not noticed yet: its answer is the phantom the tier must not trust.
        raw = raw_client(self.store)
        try:
            assert raw.is_exist(f"faults/kvtier-test/{held[0].hex()}") == 1
        finally:
            raw.close()
