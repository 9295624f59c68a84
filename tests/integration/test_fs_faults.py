"""Faults: a full disk (a real 4 MiB tmpfs, 3 MiB of it taken, when the machine lets us mount
one) and EIO become failed store jobs, dropped stores and log lines, never an exception into the caller."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import pytest

from kvtier.errors import ConfigError
from kvtier.keys import LookupResult
from kvtier.tiers.fs import FsTier

BLOCK = 256 * 1024


@contextlib.contextmanager
def small_disk(path: Path) -> Iterator[bool]:
    """Mount a 4 MiB tmpfs at ``path``; yields False (nothing mounted) where the sandbox refuses."""
    path.mkdir()
    if os.environ.get("KVTIER_TEST_NO_MOUNT"):  # exercise the fallback on machines that can mount
        yield False
        return
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(path)], capture_output=True
        )
    except OSError:
        yield False
        return
    if r.returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


class _FullDiskTier(FsTier):
    """Fallback when no tmpfs can be mounted: the file system reports ENOSPC once ~2 MiB is used,
    exactly where a real small disk would (checked against the bytes already in the tree)."""

    _used = 0
    _used_lock = threading.Lock()

    def _write_file(self, tmp: str, key: bytes, slot: int) -> None:  # type: ignore[override]
        size = self.layout.file_size(len(key))
        with self._used_lock:  # worker threads write concurrently: count bytes as a disk would
            if self._used + size > (2 << 20) - 64 * 1024:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
            self._used += size
        super()._write_file(tmp, key, slot)  # type: ignore[arg-type]


def test_full_disk_drops_stores_and_never_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mnt = tmp_path / "small"
    primary = h.aligned_primary(8, BLOCK)
    with small_disk(mnt) as mounted:
        cls = FsTier if mounted else _FullDiskTier
        print(f"full disk: {'real tmpfs, 1 MiB free' if mounted else 'injected ENOSPC (mount refused)'}")
        ctx = h.TierContext(name="fs", block_bytes=BLOCK, namespace=h.NAMESPACE)
        # Another user of the disk holds 3 of its 4 MiB, and max_bytes is the whole disk (a larger
        # max_bytes is refused): the disk, not the accounting, is what fills up.
        if mounted:
            (mnt / "ballast").write_bytes(b"\1" * (3 << 20))
        tier = cls(primary_kv_view=primary.view, context=ctx, root_dir=str(mnt), max_bytes="4MiB",
                   full_backoff=2.0, direct_io="auto")  # fmt: skip
        try:
            caplog.set_level(logging.WARNING, logger="kvtier.tiers.fs")
            keys = [h.key_of(f"full{i}") for i in range(8)]
            first = h.store(tier, primary, keys)  # 8 x 260 KiB > the free 1 MiB: part of it cannot fit
            assert not first.success
            stored = first.transferred(keys)
            assert 0 < len(stored) < len(keys)
            assert "disk full" in (first.error or "") or "ENOSPC" in (first.error or "")
            # While the disk is full, stores are dropped at once (back-pressure) and counted.
            # (back-off is 2 s so a loaded CI box still lands inside the window)
            dropped_before = tier.stats.dropped_stores
            again = h.store(tier, primary, [h.key_of("more")])
            assert not again.success
            assert tier.stats.dropped_stores > dropped_before
            assert tier.stats.dropped_stores >= 1
            assert tier.stats.failed_jobs >= 2
            assert any("disk full" in r.getMessage() for r in caplog.records)
            # What did fit is intact, and the accounting equals the bytes in the tree.
            res = h.load(tier, primary, stored)
            assert res.success
            for slot, k in enumerate(stored):
                assert primary.block(slot).tobytes() == h.payload_of(k, BLOCK).tobytes()
            assert tier.usage().published == sum(h.block_files(tier.layout.ns_dir).values())
            assert not h.temp_files(tier.layout.ns_dir)
            # After the back-off, stores are tried again (and fail cleanly again: still full).
            time.sleep(2.1)
            late = h.store(tier, primary, [h.key_of("late")])
            assert late.error is None or "disk full" in late.error or "ENOSPC" in late.error
        finally:
            tier.shutdown()


class _EioTier(FsTier):
    fail_reads = False

    def _write_file(self, tmp: str, key: bytes, slot: int) -> None:  # type: ignore[override]
        if key.endswith(b"!"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), tmp)
        super()._write_file(tmp, key, slot)  # type: ignore[arg-type]


def test_eio_is_a_failed_job_not_an_exception(tmp_path: Path) -> None:
    primary = h.aligned_primary(4, BLOCK)
    ctx = h.TierContext(name="fs", block_bytes=BLOCK, namespace=h.NAMESPACE)
    tier = _EioTier(primary_kv_view=primary.view, context=ctx, root_dir=str(tmp_path))
    try:
        good, bad = h.key_of("good"), h.key_of("bad") + b"!"
        res = h.store(tier, primary, [good, bad])
        assert not res.success
        assert res.transferred([good, bad]) == [good]
        assert "EIO" in (res.error or "")
        assert tier.lookup(good) is LookupResult.HIT and tier.lookup(bad) is LookupResult.MISS
        # EIO does not switch on back-pressure (only a full disk does).
        assert h.store(tier, primary, [h.key_of("next")]).success
        # A directory where a block file should be: reading it fails -> partial load, no raise.
        os.makedirs(tier.layout.path_of(h.key_of("dir")))
        res = h.load(tier, primary, [good, h.key_of("dir")])
        assert res.transferred([good, h.key_of("dir")]) == [good]
        assert tier.usage().reserved == 0
    finally:
        tier.shutdown()


def test_closed_tier_fails_jobs_instead_of_raising(tmp_path: Path) -> None:
    primary = h.aligned_primary(2, BLOCK)
    tier = h.make_tier(primary, tmp_path)
    tier.shutdown()
    tier.shutdown()
    assert not h.store(tier, primary, [h.key_of("x")]).success
    assert not h.load(tier, primary, [h.key_of("x")]).success


def test_failed_publish_gives_back_its_reservation(tmp_path: Path) -> None:
    primary = h.aligned_primary(2, BLOCK)
    tier = h.make_tier(primary, tmp_path, max_bytes="10MiB")
    try:
        assert tier.wait_scan(30)
        k = h.key_of("blocked")
        # A regular file where the key's shard directory must go: mkdir fails (ENOTDIR).
        top = os.path.dirname(os.path.dirname(tier.layout.path_of(k)))
        Path(top).write_bytes(b"in the way")
        res = h.store(tier, primary, [k])
        assert not res.success and res.error
        st = tier.usage()
        assert st.reserved == 0 and st.published == 0
        assert not h.temp_files(tier.layout.ns_dir)
        os.unlink(top)
        assert h.store(tier, primary, [k]).success  # and the tier carries on
    finally:
        tier.shutdown()


def test_without_o_direct_auto_falls_back_and_always_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvtier.tiers.fs.namespace as ns_mod

    monkeypatch.setattr(ns_mod, "probe_direct_io", lambda _dir: False)  # a file system without it
    primary = h.aligned_primary(2, BLOCK)
    tier = h.make_tier(primary, tmp_path, direct_io="auto")
    try:
        assert tier.direct_io is False
        assert h.store(tier, primary, [h.key_of("buffered")]).success
        assert h.load(tier, primary, [h.key_of("buffered")]).success
    finally:
        tier.shutdown()
    with pytest.raises(ConfigError) as exc:
        h.make_tier(primary, tmp_path, direct_io="always")
    assert "direct_io" in str(exc.value) and "O_DIRECT" in str(exc.value)
