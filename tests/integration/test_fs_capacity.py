"""Capacity: two processes storing into one root_dir never exceed max_bytes (+ one block) on disk."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import pytest
from polling import wait_for

from kvtier.keys import LookupResult

BLOCK = 64 * 1024


META = ("accounting.json", "events.log", "config.json")


@contextlib.contextmanager
def own_filesystem(path: Path) -> Iterator[bool]:
    """Mount a tmpfs at ``path`` so the bytes in use can be read atomically (``statvfs``).

    Yields False where mounting is refused; the test then sums a directory walk (files deduplicated
    by inode, so a file renamed mid-walk counts once), which is a close but not atomic measure.
    """
    path.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(path)], capture_output=True
    )
    try:
        yield r.returncode == 0
    finally:
        if r.returncode == 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


def _used_by_blocks(root: Path, ns_dir: str, atomic: bool) -> int:
    """Bytes that block and temp files occupy right now."""
    if atomic:
        st = os.statvfs(root)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        for name in META:  # the tier's own bookkeeping files are not blocks
            with contextlib.suppress(FileNotFoundError):
                used -= -(-os.stat(os.path.join(ns_dir, name)).st_size // 4096) * 4096
        return used
    seen: dict[int, int] = {}
    for dirpath, _, files in os.walk(ns_dir):
        if os.path.basename(dirpath) == "procs" or dirpath == ns_dir:
            continue
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(os.path.join(dirpath, f))
                seen[st.st_ino] = st.st_size
    return sum(seen.values())


def test_two_processes_share_one_bounded_root(tmp_path: Path) -> None:
    with own_filesystem(tmp_path / "fs") as atomic:
        _two_writers(tmp_path, tmp_path / "fs", atomic)


def _two_writers(tmp_path: Path, root: Path, atomic: bool) -> None:
    primary = h.aligned_primary(4, BLOCK)
    probe = h.make_tier(primary, root)  # creates the namespace; shut before the writers start
    ns_dir, file_size = probe.layout.ns_dir, probe.layout.file_size(16)
    probe.shutdown()
    base = _used_by_blocks(root, ns_dir, atomic)  # tmpfs: directories, empty files
    max_bytes = 24 * file_size
    outs = [tmp_path / "w0.json", tmp_path / "w1.json"]
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        subprocess.Popen(h.spawn_args("writer", {
            "root": str(root), "block_bytes": BLOCK, "max_bytes": max_bytes, "batch": 4, "count": 120,
            "prefix": f"w{i}", "out": str(outs[i]), "threads": 2, "barrier": str(barrier), "writers": 2,
        }), stdout=subprocess.DEVNULL)
        for i in range(2)
    ]  # fmt: skip
    peak = 0
    samples = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak, samples
        while not stop.is_set():
            # Every file under the namespace that holds block bytes: blocks and temp files.
            peak = max(peak, _used_by_blocks(root, ns_dir, atomic) - base)
            samples += 1

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for p in procs:
            assert p.wait(timeout=120) == 0
    finally:
        stop.set()
        watcher.join()
    assert samples > 10
    print(f"peak {peak} bytes of block files for max_bytes {max_bytes} ({'statvfs' if atomic else 'walk'})")
    assert peak <= max_bytes + file_size, (peak, max_bytes)

    results = [json.loads(o.read_text()) for o in outs]
    on_disk = {os.path.basename(p) for p in h.block_files(ns_dir)}
    index = [set(r["index"]) for r in results]
    assert sum(r["evictions"] for r in results) > 0  # 240 blocks into room for 24
    # Through the shared event log each process's index follows the other's stores and
    # evictions: after both finished, both indexes are exactly the disk.
    assert index[0] == on_disk
    assert index[1] == on_disk
    for r in results:
        evicted = set(r["stored"]) - on_disk
        assert evicted  # each wrote far more than fits
        assert len(r["stored"]) > 40  # neither writer was starved
    # The shared accounting equals the bytes on disk, and a restarted tier's index is the disk.
    tier = h.make_tier(primary, root, max_bytes=max_bytes)
    try:
        assert tier.wait_scan(30)
        st = tier.usage()
        assert st.published == sum(h.block_files(ns_dir).values()) <= max_bytes
        assert {k.hex() for k in tier.indexed_keys()} == on_disk
    finally:
        tier.shutdown()


def test_lru_eviction_order_and_warm_restart_keeps_access_order(tmp_path: Path) -> None:
    primary = h.aligned_primary(4, BLOCK)
    t = h.make_tier(primary, tmp_path)
    size = t.layout.file_size(16)
    keys = [h.key_of(f"o{i}") for i in range(4)]
    for k in keys:
        assert h.store(t, primary, [k]).success
    t.shutdown()
    # Access order on disk = mtime: make o2 the oldest and o0 the newest.
    now = time.time()
    for age, k in zip([10, 40, 50, 20], keys, strict=True):
        os.utime(t.layout.path_of(k), (now - age, now - age))
    t = h.make_tier(primary, tmp_path, max_bytes=4 * size)
    try:
        assert t.wait_scan(30)
        new = h.key_of("fresh")
        assert h.store(t, primary, [new]).success  # needs one victim: the least recently used
        assert t.lookup(keys[2]) is LookupResult.MISS
        assert not os.path.exists(t.layout.path_of(keys[2]))
        assert all(t.lookup(k) is LookupResult.HIT for k in (keys[0], keys[1], keys[3], new))
        assert t.stats.evictions == 1
    finally:
        t.shutdown()


@pytest.mark.parametrize("policy", ["lru", "sieve", "arc", "s3fifo"])
def test_any_registered_policy_bounds_the_tier(tmp_path: Path, policy: str) -> None:
    primary = h.aligned_primary(4, BLOCK)
    probe = h.make_tier(primary, tmp_path)
    size = probe.layout.file_size(16)
    probe.shutdown()
    t = h.make_tier(primary, tmp_path, max_bytes=6 * size, eviction_policy=policy)
    try:
        for i in range(0, 20, 2):
            assert h.store(t, primary, [h.key_of(f"p{i}"), h.key_of(f"p{i + 1}")]).success
            assert sum(h.tree_files(t.layout.ns_dir).values()) <= 6 * size
        assert len(t.indexed_keys()) == 6
        assert t.stats.evictions == 14
    finally:
        t.shutdown()


def test_tiers_sharing_a_root_see_each_others_stores_and_evictions(tmp_path: Path) -> None:
    pa, pb = h.aligned_primary(4, BLOCK), h.aligned_primary(4, BLOCK)
    probe = h.make_tier(pa, tmp_path)
    size = probe.layout.file_size(16)
    probe.shutdown()
    a = h.make_tier(pa, tmp_path, max_bytes=3 * size, refresh_interval=0.05)
    b = h.make_tier(pb, tmp_path, max_bytes=3 * size, refresh_interval=0.05)
    try:
        k = h.key_of("shared")
        assert h.store(a, pa, [k]).success
        # No explicit refresh: b's maintenance thread picks up a's event within refresh_interval.
        assert wait_for(lambda: b.lookup(k) is LookupResult.HIT)
        res = h.load(b, pb, [k])
        assert res.success and pb.block(0).tobytes() == h.payload_of(k, BLOCK).tobytes()
        # b fills the shared capacity; the least recently used block (k, loaded before these) goes,
        # and a learns it is gone.
        others = [h.key_of(f"b{i}") for i in range(3)]
        assert h.store(b, pb, others).success
        assert not os.path.exists(b.layout.path_of(k))
        assert wait_for(lambda: a.lookup(k) is LookupResult.MISS)
        assert wait_for(lambda: all(a.lookup(o) is LookupResult.HIT for o in others))
        assert a.usage().published == 3 * size == sum(h.block_files(a.layout.ns_dir).values())
    finally:
        a.shutdown()
        b.shutdown()


def test_lowering_max_bytes_shrinks_the_tree_on_restart(tmp_path: Path) -> None:
    primary = h.aligned_primary(6, BLOCK)
    t = h.make_tier(primary, tmp_path)
    size = t.layout.file_size(16)
    keys = [h.key_of(f"shrink{i}") for i in range(6)]
    assert h.store(t, primary, keys).success
    t.shutdown()
    now = time.time()
    for age, k in enumerate(reversed(keys)):  # keys[0] oldest ... keys[5] newest
        os.utime(t.layout.path_of(k), (now - 10 * age, now - 10 * age))
    t = h.make_tier(primary, tmp_path, max_bytes=3 * size)
    try:
        assert t.wait_scan(30)
        assert wait_for(lambda: t.usage().published <= 3 * size)
        assert sum(h.block_files(t.layout.ns_dir).values()) == t.usage().published == 3 * size
        assert [t.lookup(k) for k in keys] == [LookupResult.MISS] * 3 + [LookupResult.HIT] * 3
    finally:
        t.shutdown()
