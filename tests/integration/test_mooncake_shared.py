"""The mooncake tier behind the real engine and shared between real processes: byte-exact round
trips, two engine processes hitting each other's blocks through one store, tenants (cache_salt)
never sharing, damaged values never served (and replaced despite the store's lease), and a full
store dropping stores instead of failing the engine."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mooncake_servers import MooncakeStore, loopback_env, raw_client
from needs import need_module

from kvtier.engine import Engine
from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing import PrimaryBuffer, wait_for_jobs

need_module("mooncake.store", "mooncake")

from kvtier.tiers.mooncake import MooncakeTier  # noqa: E402

BLOCK = 256 * 1024
PROC = Path(__file__).with_name("remote_engine_proc.py")


#: The tier's data paths (same object format): one piece through a registered staging buffer
#: (blocks up to ``staging_max_block``, the default at these sizes), zero-copy as two pieces, and in
#: place (rows with header room, ``ROW_PAD``: one zero-copy piece from the end of the previous row).
PATHS: dict[str, dict[str, Any]] = {"staged": {}, "zero_copy": {"staging_max_block": 0}, "in_place": {}}
ROW_PAD = {"in_place": 4096}
NAMES = {"staged": "staged", "zero_copy": "zero-copy", "in_place": "in place"}


def config(
    store: MooncakeStore, prefix: str, tier: dict[str, Any] | None = None, **top: Any
) -> dict[str, Any]:
    return {
        "block_bytes": BLOCK,
        "cpu_bytes_to_use": 16 * BLOCK,
        "model": "mooncake-shared-test",
        "secondary_tiers": [store.tier_config(key_prefix=prefix, **(tier or {}))],
        **top,
    }


def engine_proc(cfg: dict[str, Any], mode: str, n: int, seed: int, timeout: float = 10.0) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(PROC), json.dumps(cfg), mode, str(n), str(seed), str(timeout)],
        capture_output=True, text=True, timeout=120, check=True, env=loopback_env(),
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_two_engine_processes_share_blocks_and_tenants_never_do(mooncake_store: MooncakeStore) -> None:
    cfg = config(mooncake_store, "share")
    assert engine_proc(cfg, "store", 12, seed=7) == {"stored": 12, "tier_stores": 12}
    assert engine_proc(cfg, "load", 12, seed=7) == {"hits": 12, "exact": 12}
    other_tenant = config(mooncake_store, "share", cache_salt="tenant-b")
    assert engine_proc(other_tenant, "load", 12, seed=7, timeout=1.5)["hits"] == 0


@pytest.mark.parametrize("path", list(PATHS))
def test_engine_round_trip_is_byte_exact(mooncake_store: MooncakeStore, path: str) -> None:
    keys = [BlockKey(f"e{i}".encode()) for i in range(8)]
    data = np.random.default_rng(3).integers(0, 256, (8, BLOCK), dtype=np.uint8)
    out = np.zeros_like(data)
    cfg = config(mooncake_store, f"engine-rt-{path}", PATHS[path], primary_row_pad=ROW_PAD.get(path, 0))
    with Engine(cfg) as eng:
        assert isinstance(eng.tiers[0], MooncakeTier)
        assert eng.row_stride == BLOCK + ROW_PAD.get(path, 0)
        want = NAMES[path]
        assert eng.tiers[0].config_info()["data_path"] == {"store": want, "load": want}
        assert eng.store_blocks(keys, data) == 8
        eng.drain()
        eng.reset()
        deadline = time.monotonic() + 10
        while eng.lookup(keys).num_hits < 8:
            assert time.monotonic() < deadline
            eng.poll()
            time.sleep(0.005)
        assert eng.load_blocks(keys, out) == 8
        assert np.array_equal(out, data)


def _tier(primary: PrimaryBuffer, store: MooncakeStore, prefix: str, **kw: Any) -> MooncakeTier:
    cfg = store.tier_config(key_prefix=prefix, **kw)
    del cfg["type"]
    return MooncakeTier(primary_kv_view=primary.view, context=primary.context("mooncake"), **cfg)  # type: ignore[arg-type]


def _store(tier: MooncakeTier, keys: list[BlockKey], slots: list[int], jid: int) -> bool:
    job = TransferJob(jid, keys, np.asarray(slots, dtype=np.int32))
    tier.submit_store(job)
    return wait_for_jobs(tier, [jid], timeout=10)[jid].success


def _load(tier: MooncakeTier, keys: list[BlockKey], slots: list[int], jid: int) -> set[BlockKey]:
    job = TransferJob(jid, keys, np.asarray(slots, dtype=np.int32), is_promotion=True)
    tier.submit_load(job)
    return set(wait_for_jobs(tier, [jid], timeout=10)[jid].transferred(keys))


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


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(
    "damage", ["truncate", "flip_payload", "flip_header", "other_key", "empty", "extend"]
)
def test_damaged_values_are_never_served_and_are_replaced(
    mooncake_store: MooncakeStore, damage: str, path: str
) -> None:
    primary = PrimaryBuffer.heap(4, 8192 + ROW_PAD.get(path, 0), 5000)
    written = primary.fill_random([0, 1], seed=5)
    a, b = BlockKey(b"victim"), BlockKey(b"donor")
    prefix = f"corrupt-{damage}-{path}"
    tier = _tier(primary, mooncake_store, prefix, **PATHS[path])
    raw = raw_client(mooncake_store)
    try:
        assert _store(tier, [a, b], [0, 1], 1)
        name = f"{prefix}/kvtier-test/{a.hex()}"
        value = raw.get(name)
        assert value.endswith(written[0])
        if damage == "truncate":
            value = value[:-100]
        elif damage == "flip_payload":
            value = value[:-1] + bytes([value[-1] ^ 1])
        elif damage == "flip_header":
            value = value[:10] + bytes([value[10] ^ 0xFF]) + value[11:]
        elif damage == "other_key":
            value = raw.get(f"{prefix}/kvtier-test/{b.hex()}")
        elif damage == "empty":
            value = b"\0"
        else:
            value = value + b"\0"
        assert raw.upsert(name, value) == 0
        primary.rows[2] = 0xAB
        assert _load(tier, [a, b], [2, 3], 2) == {b}
        assert not primary.block(2).any(), "a bad value must not stay in the slot"
        assert primary.block(3).tobytes() == written[1]
        assert tier.get_stats()["corrupt"] == 1
        assert tier.lookup(a) is LookupResult.MISS  # forgotten, not served again
        # The damaged value is leased (just read), so its removal is refused: the next store of the
        # key replaces it (upsert) instead of keeping it as a plain put would.
        tier.drain()
        assert a in tier._rewrite
        assert _store(tier, [a], [0], 3)
        replaced = raw.get(name)
        assert replaced.endswith(written[0]) and len(replaced) == 40 + len(a) + 5000
        primary.rows[2] = 0
        assert _load(tier, [a], [2], 4) == {a}
        assert primary.block(2).tobytes() == written[0]
    finally:
        raw.close()
        tier.shutdown()


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


def test_a_key_the_store_lost_is_a_miss_not_an_error(mooncake_store: MooncakeStore) -> None:
    primary = PrimaryBuffer.heap(4, 8192, 5000)
    primary.fill_random([0], seed=6)
    tier = _tier(primary, mooncake_store, "evicted")
    raw = raw_client(mooncake_store)
    try:
        k = BlockKey(b"gone")
        assert _store(tier, [k], [0], 1) and tier.lookup(k) is LookupResult.HIT
        assert raw.remove(f"evicted/kvtier-test/{k.hex()}", True) == 0
        assert _load(tier, [k], [1], 2) == set()
        assert tier.lookup(k) is LookupResult.MISS and tier.get_stats()["failed_jobs"] == 1
        assert tier.get_stats()["breaker_open"] == 0
    finally:
        raw.close()
        tier.shutdown()


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
