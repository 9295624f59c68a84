"""Damaged, truncated, empty, foreign and random files are never served; each is counted and removed."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import pytest

from kvtier import codec
from kvtier.errors import ConfigError
from kvtier.keys import LookupResult
from kvtier.tiers.fs import safe

BLOCK = 16 * 1024


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def test_every_kind_of_damage_is_a_counted_removed_miss(tmp_path: Path) -> None:
    root = tmp_path / "root"
    primary = h.aligned_primary(16, BLOCK)
    keys = [h.key_of(f"k{i}") for i in range(12)]
    a = h.make_tier(primary, root)
    assert h.store(a, primary, keys).success
    a.shutdown()
    # The same keys in another namespace, with different bytes (a different model, say).
    b = h.make_tier(primary, root, namespace="other-model")
    for slot in range(len(keys)):
        primary.block(slot)[:] = 7
    job = h.TransferJob(999, list(keys), h.np.arange(len(keys), dtype=h.np.int32))
    b.submit_store(job)
    assert h.wait_for_jobs(b, [999])[999].success
    other = {k: b.layout.path_of(k) for k in keys}
    b.shutdown()

    layout = a.layout
    path = {k: layout.path_of(k) for k in keys}
    hdr = codec.header_size(len(keys[0]), 4096)
    os.truncate(path[keys[0]], hdr + BLOCK // 2)  # truncated (scan sees the size)
    os.truncate(path[keys[1]], 0)  # zero-length (scan)
    _flip(path[keys[2]], hdr + 1234)  # payload bit flip (load: checksum)
    _flip(path[keys[3]], 20)  # header bit flip (load: header check)
    shutil.copyfile(other[keys[4]], path[keys[4]])  # foreign namespace, same size (load)
    os.replace(path[keys[6]], path[keys[5]])  # another key's valid block under this name (load)
    # Random files: a valid-looking name with random bytes of the right size, junk names in a shard
    # and at the top of the namespace.
    rogue = h.key_of("never-stored")
    os.makedirs(layout.dir_of(rogue), exist_ok=True)
    Path(layout.path_of(rogue)).write_bytes(os.urandom(hdr + BLOCK))
    Path(os.path.dirname(path[keys[7]]), "junk.bin").write_bytes(b"hello")
    Path(layout.ns_dir, "stray.dat").write_bytes(os.urandom(100))

    tier = h.make_tier(primary, root)
    try:
        assert tier.wait_scan(30)
        assert tier.stats.corrupt == 4  # truncated, zero-length, junk.bin, stray.dat
        for k in (keys[0], keys[1]):
            assert tier.lookup(k) is LookupResult.MISS
            assert not os.path.exists(path[k])
        damaged = [keys[2], keys[3], keys[4], keys[5], rogue]
        res = h.load(tier, primary, [*damaged, keys[8]])
        assert not res.success
        assert res.transferred([*damaged, keys[8]]) == [keys[8]]
        assert primary.block(5).tobytes() == h.payload_of(keys[8], BLOCK).tobytes()
        assert tier.stats.corrupt == 9
        for k in damaged:
            assert not os.path.exists(layout.path_of(k)), k
            assert tier.lookup(k) is LookupResult.MISS
        assert not os.path.exists(os.path.join(layout.ns_dir, "stray.dat"))
        # Untouched blocks still load exactly.
        good = [keys[7], *keys[8:]]
        res = h.load(tier, primary, good)
        assert res.success
        for slot, k in enumerate(good):
            assert primary.block(slot).tobytes() == h.payload_of(k, BLOCK).tobytes()
        st = tier.usage()
        assert st.published == sum(h.block_files(layout.ns_dir).values())
    finally:
        tier.shutdown()


def test_verify_never_still_checks_header_and_length(tmp_path: Path) -> None:
    primary = h.aligned_primary(4, BLOCK)
    k = [h.key_of("a"), h.key_of("b")]
    t = h.make_tier(primary, tmp_path, verify="never")
    try:
        assert h.store(t, primary, k).success
        _flip(t.layout.path_of(k[0]), 8)
        os.truncate(t.layout.path_of(k[1]), 4096 + 10)
        res = h.load(t, primary, k)
        assert res.transferred(k) == []
        assert t.stats.corrupt == 2
    finally:
        t.shutdown()


def test_layout_mismatch_is_a_one_line_error_naming_the_file(tmp_path: Path) -> None:
    t = h.make_tier(h.aligned_primary(2, BLOCK), tmp_path)
    t.shutdown()
    with pytest.raises(ConfigError) as exc:
        h.make_tier(h.aligned_primary(2, 2 * BLOCK), tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "config.json" in msg and "block_bytes" in msg and "root_dir" in msg


def test_files_and_directories_are_private(tmp_path: Path) -> None:
    primary = h.aligned_primary(2, BLOCK)
    t = h.make_tier(primary, tmp_path)
    try:
        k = h.key_of("private")
        assert h.store(t, primary, [k]).success
        p = Path(t.layout.path_of(k))
        assert p.stat().st_mode & 0o777 == 0o600
        for d in (p.parent, p.parent.parent, Path(t.layout.ns_dir)):
            assert d.stat().st_mode & 0o077 == 0, d
    finally:
        t.shutdown()


def test_shard_directories_are_precreated_private_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A budget of our own: the process's one depends on its descriptor limit and on other tiers.
    monkeypatch.setattr(safe, "BUDGET", safe.DescriptorBudget(1000))
    primary = h.aligned_primary(2, BLOCK)
    t = h.make_tier(primary, tmp_path, precreate_dirs=True)
    try:
        assert t.tree_ready.wait(60), "shard directories were not pre-created"
        ns = Path(t.layout.ns_dir)
        assert len(list(ns.glob("?/?"))) == 16 * 16  # a new tree: 16 tops of 16 leaves
        for d in [*ns.glob("?"), *ns.glob("?/?")][::7]:
            assert d.stat().st_mode & 0o777 == 0o700, d
        k = h.key_of("after-precreate")
        assert os.path.dirname(t.layout.path_of(k)) in t.shard_dirs.made  # no mkdir on the store path
        # ... and every leaf is open in the tree's descriptor cache: no walk on the first store there.
        tree = t.shard_dirs.tree
        assert all(tree.cached_leaf(str(leaf / "x")) is not None for leaf in ns.glob("?/?"))
        assert h.store(t, primary, [k]).success
    finally:
        t.shutdown()
    # A small budget (a low descriptor limit, or other tiers holding it): leaves past it are
    # walked on use instead of cached, and stores and loads still work.
    monkeypatch.setattr(safe, "BUDGET", safe.DescriptorBudget(40))
    t = h.make_tier(primary, tmp_path, precreate_dirs=True)
    try:
        assert t.tree_ready.wait(60) and t.wait_scan(30)
        tree = t.shard_dirs.tree
        cached = sum(tree.cached_leaf(str(leaf / "x")) is not None for leaf in ns.glob("?/?"))
        assert 0 < cached <= 40 - 1
        keys = [h.key_of(f"small-budget-{i}") for i in range(2)]
        assert h.store(t, primary, keys).success and h.load(t, primary, keys).success
    finally:
        t.shutdown()
    assert all(safe.BUDGET.take() for _ in range(40)) and not safe.BUDGET.take()  # all given back
    # The next start finds every directory (one failed mkdir each) and the block.
    t = h.make_tier(primary, tmp_path, precreate_dirs=True)
    try:
        assert t.tree_ready.wait(60)
        assert t.wait_scan(30) and t.lookup(h.key_of("after-precreate")) is LookupResult.HIT
    finally:
        t.shutdown()


def test_a_tree_of_the_older_layout_keeps_it(tmp_path: Path) -> None:
    # A tree written by an earlier version records 256 top-level shards of 16 leaves in its
    # config.json: a new tier keeps that layout (its blocks stay where they are, warm restart
    # finds them) and does not pre-create 4,352 directories once every top exists.
    primary = h.aligned_primary(2, BLOCK)
    t = h.make_tier(primary, tmp_path)
    cfg = Path(t.layout.config_path)
    t.shutdown()
    doc = json.loads(cfg.read_text())
    doc["shard_hex_chars"] = [2, 1]
    cfg.write_text(json.dumps(doc))
    keys = [h.key_of(f"old{i}") for i in range(3)]
    t = h.make_tier(primary, tmp_path)
    try:
        assert (t.layout.top_chars, t.layout.top_count) == (2, 256)
        for k in keys:
            assert h.store(t, primary, [k]).success
            assert re.search(r"/[0-9a-f]{2}/[0-9a-f]/[0-9a-f]+$", t.layout.path_of(k))
            assert os.path.exists(t.layout.path_of(k))
    finally:
        t.shutdown()
    ns = Path(t.layout.ns_dir)
    for top in range(256):
        (ns / f"{top:02x}").mkdir(mode=0o700, exist_ok=True)
    t = h.make_tier(primary, tmp_path, precreate_dirs=True)
    try:
        assert t.precreate_dirs is False  # every top exists: leaves appear on demand
        assert t.wait_scan(30) and all(t.lookup(k) is LookupResult.HIT for k in keys)
        assert json.loads(cfg.read_text())["shard_hex_chars"] == [2, 1]
    finally:
        t.shutdown()
    # Its record deleted by hand: the older top-level shards still say which layout it is.
    cfg.unlink()
    t = h.make_tier(primary, tmp_path)
    try:
        assert t.layout.top_chars == 2
        assert t.wait_scan(30) and all(t.lookup(k) is LookupResult.HIT for k in keys)
        assert json.loads(cfg.read_text())["shard_hex_chars"] == [2, 1]
    finally:
        t.shutdown()


def test_missing_parents_of_root_dir_are_created_private(tmp_path: Path) -> None:
    # os.makedirs(mode=0o700) would leave the parents it creates at the umask's 0755.
    root = tmp_path / "a" / "b"
    primary = h.aligned_primary(2, BLOCK)
    t = h.make_tier(primary, root)
    try:
        for d in (tmp_path / "a", root, Path(t.layout.ns_dir)):
            assert d.stat().st_mode & 0o777 == 0o700, d
    finally:
        t.shutdown()


def test_a_top_shard_removed_behind_the_tiers_back_is_made_again(tmp_path: Path) -> None:
    """The tier remembers which top-level shard directories exist (a new leaf under one skips its
    mkdir); one deleted from outside is recreated by the next store under it, not a failure."""
    primary = h.aligned_primary(2, 4096)
    tier = h.make_tier(primary, tmp_path)
    try:
        assert tier.wait_scan(10)
        first = h.key_of("top-0")
        top, leaf = tier.layout.path_of(first).split("/")[-3:-1]
        second = next(
            k for k in (h.key_of(f"top-{i}") for i in range(1, 100_000))
            if tier.layout.path_of(k).split("/")[-3:-1][0] == top
            and tier.layout.path_of(k).split("/")[-3:-1][1] != leaf
        )  # fmt: skip
        assert h.store(tier, primary, [first]).success
        shutil.rmtree(os.path.join(tier.layout.ns_dir, top))
        primary.block(1)[:] = h.payload_of(second, 4096)
        assert h.store(tier, primary, [second]).success
        assert os.path.isfile(tier.layout.path_of(second))
    finally:
        tier.shutdown()
