"""P2PTier passes the shared tier conformance suite (kvtier.testing) against a real block server on
127.0.0.1, talking to it over real TCP with the tier's own protocol client.

A p2p tier stores nothing of its own: a block it "stores" is one another instance (the peer) holds
in its primary tier. The peer here is a real :class:`~kvtier.engine.Engine` in this process behind a
real :class:`~kvtier.tiers.p2p.server.BlockServer`; what cannot happen inside one test, another
instance computing the same blocks, is stood in for by copying each stored job's blocks into the
peer's engine as the store is submitted (``store_blocks``, the engine's public API). Lookups,
loads, checksums, the handshake and the breaker all run for real.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvtier.engine import Engine
from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing import PrimaryBuffer, TierContractTests
from kvtier.tiers.base import SecondaryTier
from kvtier.tiers.p2p import P2PTier
from kvtier.tiers.p2p.server import BlockServer

SECRET = "p2p-contract-secret"


class TestP2PContract(TierContractTests):
    max_key_bytes = 255  # the p2p protocol's bound (docs/p2p.md)

    @pytest.fixture(autouse=True)
    def _peer(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        monkeypatch.setenv("KVTIER_P2P_CONTRACT_SECRET", SECRET)
        # The peer's primary tier holds every block the suite stores (at most ten buffers' worth).
        self.held: set[BlockKey] = set()
        self.peer = Engine({"block_bytes": self.block_bytes, "cpu_bytes_to_use": 4096 * 1024})
        self.server = BlockServer(self.peer, secret=SECRET.encode(), host="127.0.0.1", port=0)
        try:
            yield
        finally:
            self.server.close()
            self.peer.close()

    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> P2PTier:
        tier = P2PTier(
            primary_kv_view=primary.view,
            context=primary.context("p2p", namespace=self.peer.namespace),
            peers=[self.server.address],
            secret_env="KVTIER_P2P_CONTRACT_SECRET",
            breaker_failures=3,
        )
        submit = tier.submit_store

        def held_by_the_peer(job: TransferJob) -> None:
            # The peer instance computed the same blocks: they are in its primary tier.
            if len(job.keys):
                self.peer.store_blocks(
                    list(job.keys), np.stack([primary.block(int(s)) for s in job.slot_ids])
                )
                self.held.update(job.keys)
            submit(job)

        tier.submit_store = held_by_the_peer  # type: ignore[method-assign]
        return tier

    def settled_lookup(self, tier: SecondaryTier, key: BlockKey) -> LookupResult:
        """A p2p tier learns where a block is from its peers: a key a peer holds answers HIT once
        the background check (started by the first lookup) has asked them, a MISS until then."""
        deadline = time.monotonic() + self.job_timeout
        while True:
            answer = super().settled_lookup(tier, key)
            if answer is LookupResult.HIT or key not in self.held or time.monotonic() > deadline:
                return answer
            time.sleep(0.005)

    def test_loads_come_from_the_peer_over_tcp(self, tier: Any, primary: PrimaryBuffer) -> None:
        """The bytes of a load were served by the block server (its fetch counter moved)."""
        written = primary.fill_random([0], seed=40)
        k = self.key("served")
        assert self.store(tier, [k], [0]).success
        before = self.server.stats["blocks_sent"]
        assert self.load(tier, [k], [5]).success
        assert primary.block(5).tobytes() == written[0]
        assert self.server.stats["blocks_sent"] == before + 1
