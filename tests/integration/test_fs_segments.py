"""The fs tier's small-block path on real files: segments round-trip, survive a restart (a torn index
tail included), stay under ``max_bytes`` with eviction by segment and compaction of live blocks, are
shared between two real processes, and keep the hostile-tree, checksum and MAC rules."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import pytest

from kvtier.errors import ConfigError
from kvtier.keys import BlockKey, LookupResult
from kvtier.tiers.fs import FsTier
from kvtier.tiers.fs.segment_index import SEG_DIR, decode_records, parse_name

BLOCK = 4096
SEG = 64 * 1024  # small segments: a few dozen blocks each, so tests roll and compact often
SMALL = {"small_block_bytes": 65536, "segment_bytes": SEG}


def seg_tier(primary: h.PrimaryBuffer, root: Path, **options: object) -> FsTier:
    tier = h.make_tier(primary, root, **{**SMALL, **options})
    assert tier.segments is not None
    return tier


def seg_files(ns_dir: str) -> dict[str, int]:
    d = os.path.join(ns_dir, SEG_DIR)
    out = {}
    for name in os.listdir(d):
        try:
            out[name] = os.stat(os.path.join(d, name), follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
    return out


def check_loads(tier: FsTier, primary: h.PrimaryBuffer, keys: list[BlockKey]) -> None:
    """Every key loads, with exactly the bytes stored under it."""
    n = primary.rows.shape[0]
    for i in range(0, len(keys), n):
        chunk = keys[i : i + n]
        res = h.load(tier, primary, chunk)
        assert res.success, res
        for slot, k in enumerate(chunk):
            assert primary.block(slot).tobytes() == h.payload_of(k, BLOCK).tobytes()


def test_small_blocks_live_in_private_segments_not_in_block_files(tmp_path: Path) -> None:
    primary = h.aligned_primary(8, BLOCK)
    tier = seg_tier(primary, tmp_path)
    try:
        keys = [h.key_of(f"a{i}") for i in range(40)]
        for i in range(0, 40, 8):
            assert h.store(tier, primary, keys[i : i + 8]).success
        check_loads(tier, primary, keys)
        assert h.block_files(tier.layout.ns_dir).keys() <= {
            os.path.join(tier.layout.ns_dir, SEG_DIR, n) for n in seg_files(tier.layout.ns_dir)
        }  # no one-file-per-block file anywhere
        seg_dir = os.path.join(tier.layout.ns_dir, SEG_DIR)
        assert stat.S_IMODE(os.stat(seg_dir).st_mode) == 0o700
        names = seg_files(tier.layout.ns_dir)
        assert len(names) >= 4  # 40 records of ~4.2 KiB do not fit one 64 KiB segment
        for n in names:
            assert parse_name(n) is not None
            assert stat.S_IMODE(os.stat(os.path.join(seg_dir, n)).st_mode) == 0o600
        assert tier.lookup(keys[0]) is LookupResult.HIT
        assert tier.config_info()["small_blocks"] is True
    finally:
        tier.shutdown()


def test_warm_restart_recovers_the_index_and_drops_a_torn_tail(tmp_path: Path) -> None:
    primary = h.aligned_primary(8, BLOCK)
    tier = seg_tier(primary, tmp_path)
    keys = [h.key_of(f"r{i}") for i in range(24)]
    for i in range(0, 24, 8):
        assert h.store(tier, primary, keys[i : i + 8]).success
    ns_dir = tier.layout.ns_dir
    tier.shutdown()
    # Tear the last index record of the newest segment (as a crash mid-append would).
    seg_dir = os.path.join(ns_dir, SEG_DIR)
    idx = max((n for n in os.listdir(seg_dir) if n.endswith(".idx")), key=lambda n: parse_name(n)[0].seq)  # type: ignore[index]
    path = os.path.join(seg_dir, idx)
    recs, _ = decode_records(Path(path).read_bytes())
    blocks = [r for r in recs if r.key]
    torn = BlockKey(blocks[-1].key)
    size = os.path.getsize(path)
    tail = size - (26 + len(torn)) - 26  # before the last block record, whose seal follows it
    with open(path, "r+b") as f:
        f.truncate(tail + 10)
    again = seg_tier(primary, tmp_path)
    try:
        assert torn not in again.indexed_keys()
        assert again.lookup(torn) is LookupResult.MISS  # authoritative at once: no RETRY
        survivors = [k for k in keys if k != torn]
        assert set(survivors) <= again.indexed_keys()
        check_loads(again, primary, survivors)
        assert again.stats.corrupt == 0
        # The torn block can be stored again and is then served.
        assert h.store(again, primary, [torn]).success
        check_loads(again, primary, [torn])
    finally:
        again.shutdown()


def test_max_bytes_holds_and_eviction_compacts_the_live_blocks(tmp_path: Path) -> None:
    primary = h.aligned_primary(8, BLOCK)
    max_bytes = 8 * SEG
    tier = seg_tier(primary, tmp_path, max_bytes=max_bytes)
    ns_dir = tier.layout.ns_dir
    hot = [h.key_of(f"hot{i}") for i in range(8)]
    try:
        assert h.store(tier, primary, hot).success
        peak = 0
        for b in range(60):  # 480 blocks of ~4.2 KiB into room for ~120
            keys = [h.key_of(f"s{b}-{i}") for i in range(8)]
            assert h.store(tier, primary, keys).success
            check_loads(tier, primary, hot)  # in use: the policy keeps them, compaction copies them
            used = sum(seg_files(ns_dir).values())
            peak = max(peak, used)
            assert used <= max_bytes, (b, used)
            assert tier.segments is not None and tier.segments.usage_bytes() <= max_bytes
        stats = tier.get_stats()
        assert stats["seg_compactions"] > 0 and stats["seg_carried"] > 0 and stats["evictions"] > 0
        assert set(hot) <= tier.indexed_keys()
        assert peak > max_bytes // 2
        # What the tier says it holds is all there, byte for byte.
        check_loads(tier, primary, sorted(tier.indexed_keys()))
        assert tier.stats.corrupt == 0
    finally:
        tier.shutdown()
    # A restarted tier sees the same blocks (the compacted copies included), still within the bound.
    again = seg_tier(primary, tmp_path, max_bytes=max_bytes)
    try:
        assert set(hot) <= again.indexed_keys()
        check_loads(again, primary, sorted(again.indexed_keys()))
    finally:
        again.shutdown()


def test_two_processes_share_small_blocks_within_one_bound(tmp_path: Path) -> None:
    root = tmp_path / "root"
    primary = h.aligned_primary(8, BLOCK)
    probe = seg_tier(primary, root)
    ns_dir = probe.layout.ns_dir
    probe.shutdown()
    max_bytes = 10 * SEG
    outs = [tmp_path / "w0.json", tmp_path / "w1.json"]
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        subprocess.Popen(h.spawn_args("writer", {
            "root": str(root), "block_bytes": BLOCK, "max_bytes": max_bytes, "batch": 4, "count": 160,
            "prefix": f"w{i}", "out": str(outs[i]), "threads": 2, "barrier": str(barrier), "writers": 2,
            "options": SMALL,
        }), stdout=subprocess.DEVNULL)
        for i in range(2)
    ]  # fmt: skip
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, sum(seg_files(ns_dir).values()))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for p in procs:
            assert p.wait(timeout=120) == 0
    finally:
        stop.set()
        watcher.join()
    assert peak <= max_bytes, (peak, max_bytes)
    results = [json.loads(o.read_text()) for o in outs]
    on_disk = set()
    seg_dir = os.path.join(ns_dir, SEG_DIR)
    for n in os.listdir(seg_dir):
        if n.endswith(".idx") and os.path.exists(os.path.join(seg_dir, n[:-4] + ".dat")):
            on_disk |= {r.key.hex() for r in decode_records(Path(seg_dir, n).read_bytes())[0] if r.key}
    index = [set(r["index"]) for r in results]
    for me in (0, 1):
        # Each index follows the other's removals: it names only blocks whose segment is still there.
        assert index[me] <= on_disk, f"writer {me} indexes blocks whose segment was removed"
        assert len(results[me]["stored"]) > 60  # neither writer was starved
    # Each process's own policy evicts (logically) what it does not use, so the writer that ran on
    # longer may have evicted the other's blocks; but the other's index follows its later stores.
    seen = [len(index[me] & set(results[1 - me]["stored"])) for me in (0, 1)]
    assert max(seen) > 0, f"no writer saw a block of the other ({seen})"
    # Whatever either process indexed and is still on disk loads byte for byte in a third one.
    tier = seg_tier(primary, root, max_bytes=max_bytes)
    try:
        keys = sorted(tier.indexed_keys())
        assert keys
        assert {k.hex() for k in keys} & set(results[0]["stored"])
        assert {k.hex() for k in keys} & set(results[1]["stored"])
        check_loads(tier, primary, keys)
        assert tier.stats.corrupt == 0
    finally:
        tier.shutdown()


def test_an_in_process_peer_sees_stores_and_removals_after_refresh(tmp_path: Path) -> None:
    primary = h.aligned_primary(8, BLOCK)
    a = seg_tier(primary, tmp_path, max_bytes=6 * SEG)
    b = seg_tier(primary, tmp_path, max_bytes=6 * SEG)
    try:
        first = [h.key_of(f"p{i}") for i in range(8)]
        assert h.store(a, primary, first).success
        b.refresh()
        assert set(first) <= b.indexed_keys()
        check_loads(b, primary, first)
        for r in range(40):  # a fills the bound: a's compactions remove a's old segments
            assert h.store(a, primary, [h.key_of(f"q{r}-{i}") for i in range(8)]).success
        b.refresh()
        on_disk = set(seg_files(a.layout.ns_dir))
        for k in b.indexed_keys():
            assert b.segments is not None
            name = b.segments.map.locs[k][0]
            assert name.dat in on_disk  # b forgot what a removed
        check_loads(b, primary, sorted(b.indexed_keys()))
    finally:
        a.shutdown()
        b.shutdown()


def test_corrupt_records_are_misses_never_wrong_bytes(tmp_path: Path) -> None:
    primary = h.aligned_primary(8, BLOCK)
    tier = seg_tier(primary, tmp_path)
    keys = [h.key_of(f"c{i}") for i in range(8)]
    try:
        assert h.store(tier, primary, keys).success
        assert tier.segments is not None
        name, off, length = tier.segments.map.locs[keys[3]]
        path = os.path.join(tier.layout.ns_dir, SEG_DIR, name.dat)
        with open(path, "r+b") as f:
            f.seek(off + length - 7)
            byte = f.read(1)
            f.seek(off + length - 7)
            f.write(bytes([byte[0] ^ 0x40]))
        res = h.load(tier, primary, keys)
        assert not res.success and "checksum" in (res.error or "")
        assert set(res.transferred(keys)) == set(keys) - {keys[3]}
        assert tier.stats.corrupt == 1 and keys[3] not in tier.indexed_keys()
    finally:
        tier.shutdown()


def test_a_shared_root_serves_only_blocks_with_a_valid_mac(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary = h.aligned_primary(8, BLOCK)
    keys = [h.key_of(f"m{i}") for i in range(8)]
    monkeypatch.setenv("KVTIER_FS_SECRET", "a" * 32)
    writer = seg_tier(primary, tmp_path, shared_root=True)
    assert h.store(writer, primary, keys).success
    check_loads(writer, primary, keys)
    writer.shutdown()
    monkeypatch.setenv("KVTIER_FS_SECRET", "b" * 32)  # a writer without our secret
    other = seg_tier(primary, tmp_path, shared_root=True)
    try:
        res = h.load(other, primary, keys)
        assert res.transferred(keys) == [] and "mac" in (res.error or "")
        assert other.stats.corrupt == len(keys)
    finally:
        other.shutdown()


def test_hostile_entries_in_seg_are_never_followed_or_removed(tmp_path: Path) -> None:
    primary = h.aligned_primary(8, BLOCK)
    tier = seg_tier(primary, tmp_path)
    keys = [h.key_of(f"h{i}") for i in range(8)]
    assert h.store(tier, primary, keys).success
    ns_dir = tier.layout.ns_dir
    seg_dir = os.path.join(ns_dir, SEG_DIR)
    tier.shutdown()
    real = sorted(n for n in os.listdir(seg_dir) if n.endswith(".idx"))[0]
    outside = tmp_path / "outside.idx"
    outside.write_bytes(Path(seg_dir, real).read_bytes())
    # A link and a FIFO with segment names, and a stray name: never read, waited on or removed.
    os.symlink(outside, os.path.join(seg_dir, "1-deadbeef.0.65536.idx"))
    os.symlink(Path(seg_dir, real.replace(".idx", ".dat")), os.path.join(seg_dir, "1-deadbeef.0.65536.dat"))
    os.mkfifo(os.path.join(seg_dir, "2-deadbeef.0.65536.idx"))
    Path(seg_dir, "2-deadbeef.0.65536.dat").write_bytes(b"")
    Path(seg_dir, "notes.txt").write_text("not ours")
    again = seg_tier(primary, tmp_path, max_bytes=40 * SEG)
    try:
        check_loads(again, primary, keys)
        assert again.segments is not None and again.segments.dir.foreign >= 2
        for r in range(60):  # compaction runs: the planted entries are not segments it may remove
            assert h.store(again, primary, [h.key_of(f"hh{r}-{i}") for i in range(8)]).success
        left = set(os.listdir(seg_dir))
        assert {
            "1-deadbeef.0.65536.idx",
            "1-deadbeef.0.65536.dat",
            "2-deadbeef.0.65536.idx",
            "notes.txt",
        } <= left
        assert outside.exists()
    finally:
        again.shutdown()


def test_a_symlinked_segment_directory_is_refused(tmp_path: Path) -> None:
    primary = h.aligned_primary(2, BLOCK)
    tier = seg_tier(primary, tmp_path)
    ns_dir = tier.layout.ns_dir
    tier.shutdown()
    seg_dir = os.path.join(ns_dir, SEG_DIR)
    for n in os.listdir(seg_dir):
        os.unlink(os.path.join(seg_dir, n))
    os.rmdir(seg_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, seg_dir)
    with pytest.raises(ConfigError, match="seg"):
        seg_tier(primary, tmp_path)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"small_block_bytes": "lots"}, "small_block_bytes"),
        ({"small_block_bytes": "2GiB"}, "small_block_bytes"),
        ({"segment_bytes": 4096}, "segment_bytes"),
        ({"segment_bytes": SEG, "max_bytes": SEG}, "segment_bytes"),
    ],
)
def test_bad_small_block_options_are_one_line_errors(
    tmp_path: Path, options: dict[str, object], match: str
) -> None:
    primary = h.aligned_primary(2, BLOCK)
    with pytest.raises(ConfigError, match=match) as info:
        h.make_tier(primary, tmp_path, **{**SMALL, **options})
    assert "\n" not in str(info.value)
    assert not (tmp_path / h.NAMESPACE).exists()  # checked before anything touched the disk


def test_a_capacity_too_small_for_two_segments_keeps_one_file_per_block(tmp_path: Path) -> None:
    primary = h.aligned_primary(2, BLOCK)
    tier = h.make_tier(primary, tmp_path, small_block_bytes=65536, max_bytes=40 * 1024)
    try:
        assert tier.segments is None  # two default segments (1 MiB each) do not fit in 40 KiB
        assert h.store(tier, primary, [h.key_of("tiny")]).success
        assert len(h.block_files(tier.layout.ns_dir)) == 1
    finally:
        tier.shutdown()


def test_blocks_above_the_threshold_keep_one_file_each(tmp_path: Path) -> None:
    primary = h.aligned_primary(2, BLOCK)
    tier = h.make_tier(primary, tmp_path, small_block_bytes=BLOCK - 1)
    try:
        assert tier.segments is None
        assert h.store(tier, primary, [h.key_of("big")]).success
        assert len(h.block_files(tier.layout.ns_dir)) == 1
    finally:
        tier.shutdown()
