"""The mooncake tier as a shared store (kvtier.testing.SharedStoreTests: behind the real engine,
two engine processes hitting each other's blocks through one store, tenants apart, damaged values
never served (and replaced despite the store's lease), a lost value a miss) on each of its three
data paths; then what only Mooncake has: the paths reading each other's objects, in-place rows,
and a full store dropping stores instead of failing the engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from mooncake_servers import MooncakeStore, loopback_env, raw_client
from needs import need_module

from kvtier.keys import BlockKey
from kvtier.testing import PrimaryBuffer, SharedStoreTests, run_job
from kvtier.tiers.remote import RemoteTier

need_module("mooncake.store", "mooncake")

from kvtier.tiers.mooncake import MooncakeTier  # noqa: E402


class TestMooncakeShared(SharedStoreTests):
    """The staged path: one piece per object through a registered staging buffer (blocks up to
    ``staging_max_block``, the default at these sizes)."""

    poison = 0xAB  # the tier zeroes a slot whose value failed verification
    path_name: ClassVar[str] = "staged"

    @pytest.fixture(autouse=True)
    def _store(self, mooncake_store: MooncakeStore) -> Iterator[None]:
        self.mc = mooncake_store  # the session's store (conftest.py)
        self.raw = raw_client(mooncake_store)
        yield
        self.raw.close()

    def tier_config(self, prefix: str, **options: Any) -> dict[str, Any]:
        return self.mc.tier_config(key_prefix=prefix, **options)

    def make_tier(self, primary: PrimaryBuffer, prefix: str, **options: Any) -> MooncakeTier:
        return _tier(primary, self.mc, prefix, **options)

    def engine_env(self) -> dict[str, str]:
        return loopback_env()

    def _name(self, tier: RemoteTier, key: BlockKey) -> str:
        assert isinstance(tier, MooncakeTier)
        return f"{tier.key_prefix}/kvtier-test/{key.hex()}"

    def raw_get(self, tier: RemoteTier, key: BlockKey) -> bytes:
        return bytes(self.raw.get(self._name(tier, key)))

    def raw_put(self, tier: RemoteTier, key: BlockKey, value: bytes) -> None:
        # The store keeps no empty value: "empty" is one byte, as short as a value can be.
        assert self.raw.upsert(self._name(tier, key), value or b"\0") == 0

    def raw_delete(self, tier: RemoteTier, key: BlockKey) -> None:
        assert self.raw.remove(self._name(tier, key), True) == 0

    def after_damage(self, tier: RemoteTier, victim: BlockKey, primary: PrimaryBuffer, block: bytes) -> None:
        # The damaged value is leased (just read), so its removal is refused: the next store of the
        # key replaces it (upsert) instead of keeping it as a plain put would.
        assert isinstance(tier, MooncakeTier)
        tier.drain()
        assert victim in tier._rewrite
        assert self.store(tier, [victim], [0], 3)
        replaced = self.raw_get(tier, victim)
        assert replaced.endswith(block) and len(replaced) == 40 + len(victim) + 5000
        primary.rows[2] = 0
        assert self.load(tier, [victim], [2], 4) == {victim}
        assert primary.block(2).tobytes() == block

    def test_the_tier_takes_this_path(self) -> None:
        tier = self.tier_on(PrimaryBuffer.heap(4, self.row_stride, 5000), self.prefix("path"))
        try:
            assert tier.config_info()["data_path"] == {"store": self.path_name, "load": self.path_name}
        finally:
            tier.shutdown()


class TestMooncakeZeroCopyShared(TestMooncakeShared):
    """Zero-copy: two pieces per object (header row + slot), no staging copy."""

    options: ClassVar[dict[str, Any]] = {"staging_max_block": 0}
    path_name = "zero-copy"


class TestMooncakeInPlaceShared(TestMooncakeShared):
    """In place: rows with header room (an engine's ``primary_row_pad``), one zero-copy piece from
    the end of the previous row through the slot."""

    engine_top: ClassVar[dict[str, Any]] = {"primary_row_pad": 4096}
    row_stride = 8192 + 4096
    path_name = "in place"


def _tier(primary: PrimaryBuffer, store: MooncakeStore, prefix: str, **kw: Any) -> MooncakeTier:
    cfg = store.tier_config(key_prefix=prefix, **kw)
    del cfg["type"]
    return MooncakeTier(primary_kv_view=primary.view, context=primary.context("mooncake"), **cfg)


def _store(tier: MooncakeTier, keys: list[BlockKey], slots: list[int], jid: int) -> bool:
    return run_job(tier, jid, keys, slots, load=False, timeout=10).success


def _load(tier: MooncakeTier, keys: list[BlockKey], slots: list[int], jid: int) -> set[BlockKey]:
    return set(run_job(tier, jid, keys, slots, load=True, timeout=10).transferred(keys))


def test_staged_and_zero_copy_tiers_read_each_others_blocks(mooncake_store: MooncakeStore) -> None:
    """Both paths write the same object (header + payload, one value): a block stored by one is a
    verified, byte-exact hit for the other, and a tier may stage its stores while loading zero-copy."""
    primary = PrimaryBuffer.heap(8, 8192, 5000)
    written = primary.fill_random([0, 1, 4], seed=11)
    staged = _tier(primary, mooncake_store, "mixed")
    zero_copy = _tier(primary, mooncake_store, "mixed", staging_max_block=0)
    split = _tier(primary, mooncake_store, "mixed", staging_max_block=0, store_staging_max_block=8192)
    tiers = (staged, zero_copy, split)
    try:
        assert split.config_info()["data_path"] == {"store": "staged", "load": "zero-copy"}
        assert zero_copy.config_info()["data_path"] == {"store": "zero-copy", "load": "zero-copy"}
        a, b, c = BlockKey(b"by-staged"), BlockKey(b"by-zero-copy"), BlockKey(b"by-split")
        assert _store(staged, [a], [0], 1) and _store(zero_copy, [b], [1], 2) and _store(split, [c], [4], 3)
        assert _load(zero_copy, [a], [2], 4) == {a} and _load(staged, [b], [3], 5) == {b}
        assert _load(split, [a], [5], 6) == {a} and _load(staged, [c], [6], 7) == {c}
        assert _load(zero_copy, [c], [7], 8) == {c}
        for slot, source in ((2, 0), (3, 1), (5, 0), (6, 4), (7, 4)):
            assert primary.block(slot).tobytes() == written[source]
        assert all(t.get_stats()["corrupt"] == 0 for t in tiers)
    finally:
        for t in tiers:
            t.shutdown()


def test_in_place_blocks_are_everyones_and_only_the_row_pad_is_written(mooncake_store: MooncakeStore) -> None:
    """Rows with header room: the object of slot s starts at the end of row s-1 (slot 0 is staged).
    Its blocks are byte-exact hits for a tier on plain rows and back; no block byte of another slot
    and no padding before the pad's pages is ever written."""
    padded = PrimaryBuffer.heap(6, 8192 + 4096, 5000)
    plain = PrimaryBuffer.heap(6, 8192, 5000)
    written = padded.fill_random(range(6), seed=21)
    padded.rows[:, 5000:] = 0xAB
    in_place = _tier(padded, mooncake_store, "inplace")
    staged = _tier(plain, mooncake_store, "inplace")
    try:
        assert in_place.config_info()["data_path"] == {"store": "in place", "load": "in place"}
        keys = [BlockKey(f"ip{i}".encode()) for i in range(3)]
        assert _store(in_place, keys, [0, 1, 2], 1)  # slot 0 staged, slots 1 and 2 in place
        assert _load(staged, keys, [3, 4, 5], 2) == set(keys)
        for i in range(3):
            assert plain.block(3 + i).tobytes() == written[i]
        other = BlockKey(b"by-plain")
        mine = plain.fill_random([0], seed=22)[0]
        assert _store(staged, [other], [0], 3)
        # Loads into slots 4, 0 and 5: the headers land at the end of rows 3 and 4, slot 0 staged.
        assert _load(in_place, [other, keys[0], keys[2]], [4, 0, 5], 4) == {other, keys[0], keys[2]}
        want = {0: written[0], 1: written[1], 2: written[2], 3: written[3], 4: mine, 5: written[2]}
        for slot, data in want.items():
            assert padded.block(slot).tobytes() == data, f"slot {slot} differs"
        assert (padded.rows[:, 5000:8192] == 0xAB).all(), "padding before the pad pages was written"
        assert in_place.get_stats()["corrupt"] == staged.get_stats()["corrupt"] == 0
    finally:
        in_place.shutdown()
        staged.shutdown()


def test_a_full_store_drops_stores_and_pauses_them(tmp_path: Path) -> None:
    small = MooncakeStore(tmp_path / "small", segment="16MB")
    primary = PrimaryBuffer.heap(24, 1 << 20, 1 << 20)
    primary.fill_random(range(24), seed=9)
    tier = _tier(primary, small, "full", full_backoff=30.0)
    try:
        keys = [BlockKey(f"f{i}".encode()) for i in range(24)]
        result_ok = _store(tier, keys, list(range(24)), 1)
        stats = tier.get_stats()
        assert not result_ok and stats["dropped_stores"] > 0, stats
        assert tier.store_gate.paused  # "insufficient space" pauses stores
        # While paused, a store is dropped at once (counted), never queued.
        before = tier.get_stats()["dropped_stores"]
        assert not _store(tier, [BlockKey(b"later")], [0], 2)
        assert tier.get_stats()["dropped_stores"] == before + 1
        assert tier.get_stats()["breaker_open"] == 0  # full is not down
    finally:
        tier.shutdown()
        small.stop()
