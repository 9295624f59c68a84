"""Hypothesis state machine over a real FsTier: stores, loads, damage, restarts, in any order.

Invariants after every step: a load never yields bytes other than those stored under the key; the
shared accounting equals the bytes of the block files on disk, which never exceed ``max_bytes``; the
index is exactly the set of files in the tree.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import fs_helpers as h  # tests/integration is on pytest's pythonpath
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvtier.keys import BlockKey, LookupResult
from kvtier.tiers.fs.layout import Layout

BLOCK = 8192
KEYS = [h.key_of(f"s{i}") for i in range(12)]
CAPACITY_BLOCKS = 5


class FsTierMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.root = tempfile.mkdtemp(prefix="kvtier-fs-stateful-")
        self.primary = h.aligned_primary(len(KEYS), BLOCK)
        self.tier = h.make_tier(self.primary, self.root, max_bytes=self._max_bytes(), threads=2)
        assert self.tier.wait_scan(30)

    def _max_bytes(self) -> int:
        return CAPACITY_BLOCKS * Layout(self.root, h.NAMESPACE, BLOCK).file_size(16)

    def teardown(self) -> None:
        if hasattr(self, "tier"):
            self.tier.shutdown()
            shutil.rmtree(self.root, ignore_errors=True)

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6, unique=True))
    def store(self, keys: list[BlockKey]) -> None:
        res = h.store(self.tier, self.primary, keys)
        if res.success and len(keys) <= CAPACITY_BLOCKS:  # a bigger job evicts its own blocks
            for k in keys:
                assert self.tier.lookup(k) is LookupResult.HIT

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6, unique=True))
    def load(self, keys: list[BlockKey]) -> None:
        held = [k for k in keys if self.tier.lookup(k) is LookupResult.HIT]
        res = h.load(self.tier, self.primary, keys)
        got = res.transferred(keys)
        assert set(held) >= set(got)
        for slot, k in enumerate(keys):
            if k in got:
                assert self.primary.block(slot).tobytes() == h.payload_of(k, BLOCK).tobytes()

    @rule(k=st.sampled_from(KEYS), how=st.sampled_from(["flip", "truncate", "empty", "delete"]))
    def damage(self, k: BlockKey, how: str) -> None:
        if k not in self.tier.indexed_keys():
            return
        path = self.tier.layout.path_of(k)
        if how == "flip":
            with open(path, "r+b") as f:
                f.seek(4096 + 100)
                b = f.read(1)
                f.seek(4096 + 100)
                f.write(bytes([b[0] ^ 1]))
        elif how == "truncate":
            os.truncate(path, 5000)
        elif how == "empty":
            os.truncate(path, 0)
        else:
            os.unlink(path)
        res = h.load(self.tier, self.primary, [k])
        assert not res.success  # never served
        assert self.tier.lookup(k) is LookupResult.MISS
        assert not os.path.exists(path)
        # A hand-deleted file was accounted as present: a restart repairs the totals (alone).
        self.restart()

    @rule()
    def restart(self) -> None:
        self.tier.shutdown()
        self.tier = h.make_tier(self.primary, self.root, max_bytes=self._max_bytes(), threads=2)
        assert self.tier.wait_scan(30)

    @invariant()
    def accounting_is_the_disk(self) -> None:
        if not hasattr(self, "tier"):
            return
        on_disk = h.block_files(self.tier.layout.ns_dir)
        st_ = self.tier.usage()
        assert st_.reserved == 0
        assert st_.published == sum(on_disk.values()) <= self._max_bytes()
        assert {k.hex() for k in self.tier.indexed_keys()} == {os.path.basename(p) for p in on_disk}


FsTierMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)
TestFsTierStateful = FsTierMachine.TestCase
