"""Per-disk health of a striped fs tier: a full disk (a real tiny tmpfs filled by someone else), a
failed disk (a real ext4 on a loop device, shut down so every I/O is EIO), a disk error of each kind
and a stalled disk are fenced within their deadline, serve no wrong byte, never block the caller,
and are probed and readmitted once healthy.

Mounting needs root (CI runs as root; ``needs.need`` skips locally, fails under ``CI=true``); every
mount is unmounted in a ``finally``. Two failures are **injected** and say so: the stall (a root's
block open or temp-file write waits on an event; this machine has no device-mapper ``delay`` target
and no FUSE library to freeze a mount with), and EROFS (``mount -o remount,ro`` is refused by the
kernel while a file on the mount is open for writing, which a live tier's accounting file is).
What they show is the tier's side: the deadline, fencing, abandoned reads that never land in a
slot, probes and readmission.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import numpy as np
import pytest
from needs import need

from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing.primary import wait_for_jobs
from kvtier.tiers.base import TierContext
from kvtier.tiers.fs import FsTier
from kvtier.tiers.fs.striped import StripedFsTier

BLOCK = 64 * 1024
FILE = 4096 + BLOCK


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` at ``path`` (mode 0700), unmounted at the end whatever happens."""
    path.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], capture_output=True
    )
    need(r.returncode == 0, f"cannot mount a tmpfs (needs root): {r.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount(path: Path, how: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{how}", str(path)], check=True, capture_output=True)


def striped(primary: Any, roots: list[Any], cls: type[FsTier] = FsTier, **options: Any) -> StripedFsTier:
    options.setdefault("precreate_dirs", False)
    options.setdefault("small_block_bytes", 0)
    options.setdefault("io_timeout", 1.0)
    options.setdefault("probe_interval", 0.2)
    ctx = TierContext(name="fs", block_bytes=BLOCK, namespace=h.NAMESPACE)
    tier = cls(primary_kv_view=primary.view, context=ctx, root_dirs=roots, **options)
    assert isinstance(tier, StripedFsTier)
    return tier


def submit(tier: StripedFsTier, primary: Any, keys: list[BlockKey], *, load: bool) -> tuple[int, float]:
    """Submit one job over slots 0..n-1; returns its id and how long the submit call took."""
    job = TransferJob(next(h._job_ids), keys, np.arange(len(keys), dtype=np.int32), is_promotion=load)
    if load:
        for slot in range(len(keys)):
            primary.block(slot)[:] = 0xEE
    else:
        for slot, k in enumerate(keys):
            primary.block(slot)[:] = h.payload_of(k, BLOCK)
    t0 = time.perf_counter()
    (tier.submit_load if load else tier.submit_store)(job)
    return job.job_id, time.perf_counter() - t0


def on_root(tier: StripedFsTier, root: int, n: int, prefix: str) -> list[BlockKey]:
    """``n`` keys that placement sends to ``root`` when every root is admitted."""
    out, i = [], 0
    everyone = list(range(len(tier.roots)))
    while len(out) < n:
        k = h.key_of(f"{prefix}-{i}")
        if tier.placement.choose(bytes(k), everyone) == root:
            out.append(k)
        i += 1
    return out


def wait_until(cond: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


def check_loaded(primary: Any, keys: list[BlockKey], done: list[BlockKey]) -> None:
    """Loaded keys hold their own bytes; the others' slots were never written (still poisoned)."""
    for slot, k in enumerate(keys):
        if k in done:
            assert (primary.block(slot) == h.payload_of(k, BLOCK)).all()
        else:
            assert (primary.block(slot) == 0xEE).all(), "a missed key's slot was written"


def test_a_full_disk_is_fenced_stores_go_elsewhere_and_it_is_readmitted(tmp_path: Path) -> None:
    primary = h.aligned_primary(16, BLOCK)
    with tmpfs(tmp_path / "small", "2m") as small:
        # Someone else's file takes most of the small disk: the disk, not max_bytes, fills up.
        (small / "ballast").write_bytes(b"\1" * (1700 << 10))
        roots = [
            {"path": str(small), "max_bytes": "2MiB"},
            {"path": str(tmp_path / "big"), "max_bytes": "2MiB"},
        ]
        tier = striped(primary, roots, full_backoff=0.2)
        try:
            keys = on_root(tier, 0, 8, "full")
            results = [h.store(tier, primary, [k]) for k in keys]
            assert not all(r.success for r in results)  # the small disk ran out of room
            assert tier.fenced_roots() == [0]
            assert "full" in tier.health[0].reason
            # Fenced: stores meant for it go to the other root and succeed.
            later = on_root(tier, 0, 4, "after")
            assert h.store(tier, primary, later).success
            assert all(k in tier.roots[1].indexed_keys() for k in later)
            stored = [k for k, r in zip(keys, results, strict=True) if r.success] + later
            res = h.load(tier, primary, stored)
            check_loaded(primary, stored, res.transferred(stored))
            assert set(later) <= set(res.transferred(stored))
            stats = tier.get_stats()
            assert stats["root0_fenced"] == 1 and stats["root0_errors"] >= 1 and stats["roots_fenced"] == 1
            # The other user frees its file: the next probe passes and the root is readmitted.
            (small / "ballast").unlink()
            assert wait_until(lambda: not tier.fenced_roots(), 5.0)
            assert tier.get_stats()["root0_readmits"] == 1
            fresh = on_root(tier, 0, 2, "again")
            assert h.store(tier, primary, fresh).success
            assert all(k in tier.roots[0].indexed_keys() for k in fresh)
        finally:
            tier.shutdown()


@contextlib.contextmanager
def ext4_disk(path: Path, image: Path) -> Iterator[Path]:
    """A real ext4 file system on a loop device (a 32 MiB sparse image), mounted at ``path``."""
    path.mkdir()
    tools = all(shutil.which(t) for t in ("mkfs.ext4", "xfs_io", "losetup"))
    need(tools, "mkfs.ext4, xfs_io and losetup are needed for the failed-disk test (e2fsprogs, xfsprogs)")
    with image.open("wb") as f:
        f.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    r = subprocess.run(["mount", "-o", "loop", str(image), str(path)], capture_output=True)
    need(r.returncode == 0, f"cannot mount a loop device (needs root): {r.stderr.decode().strip()}")
    os.chmod(path, 0o700)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_failed_disk_is_fenced_serves_no_wrong_byte_and_never_hangs(tmp_path: Path) -> None:
    """A real failed disk: ext4 on a loop device, then the file system's shutdown ioctl (``xfs_io -x
    -c shutdown``, what ext4 does on a fatal device error): every later I/O on it is ``EIO``.

    Why not ``mount -o remount,ro``: the kernel refuses it (EBUSY) while any file on the mount is open
    for writing, and a live tier keeps its accounting file open; a read-only remount of a live disk
    only comes from the kernel itself (``errors=remount-ro``). EROFS is covered with the write seam in
    :func:`test_a_disk_error_fences_at_once_and_a_passing_probe_readmits`."""
    primary = h.aligned_primary(16, BLOCK)
    with ext4_disk(tmp_path / "disk", tmp_path / "disk.img") as disk:
        roots = [
            {"path": str(disk), "max_bytes": "16MiB"},
            {"path": str(tmp_path / "other"), "max_bytes": "16MiB"},
        ]
        tier = striped(primary, roots)
        try:
            dead, alive = on_root(tier, 0, 4, "eio-a"), on_root(tier, 1, 4, "eio-b")
            assert h.store(tier, primary, dead + alive).success
            subprocess.run(["xfs_io", "-x", "-c", "shutdown", str(disk)], check=True, capture_output=True)
            keys = dead + alive
            res = h.load(tier, primary, keys, timeout=10)  # the dead disk's reads fail: misses
            check_loaded(primary, keys, res.transferred(keys))
            assert set(alive) <= set(res.transferred(keys))
            new = on_root(tier, 0, 2, "eio-new")
            t0 = time.monotonic()
            first = h.store(tier, primary, new, timeout=10)
            assert time.monotonic() - t0 < 2.0
            assert tier.fenced_roots() == [0], tier.health[0]
            assert "eio" in tier.health[0].reason or not first.success
            assert tier.lookup_many(dead) == [LookupResult.MISS] * 4
            assert h.store(tier, primary, new).success  # now on the healthy root
            assert all(k in tier.roots[1].indexed_keys() for k in new)
            time.sleep(0.5)  # probes keep failing on the dead disk: it stays fenced
            assert tier.fenced_roots() == [0] and tier.health[0].probes >= 1
            res = h.load(tier, primary, alive)
            assert res.success
            check_loaded(primary, alive, alive)
        finally:
            t0 = time.monotonic()
            tier.shutdown()
            assert time.monotonic() - t0 < 10


class _StallingTier(FsTier):
    """A root whose I/O can be made to hang (injected in the I/O layer: see the module doc)."""

    stall: threading.Event | None = None  # set on the instance: cleared = stalled

    def _write_file(self, tmp: str, key: BlockKey, slot: int) -> None:
        if self.stall is not None:
            self.stall.wait()
        super()._write_file(tmp, key, slot)


def _stall_opens(tier: FsTier, gate: threading.Event) -> None:
    """Make the root's block opens wait for ``gate`` (a hung metadata read on a failing disk).

    The stall is injected into the Python load path's ``open_block``; the batched reader
    (``kvtier.tiers.fs.batchread``, one C call per chunk) cannot be stalled from Python, so this
    root reads on the Python path, which keeps the same contract (the job's abandon flag is checked
    after each open, before anything lands in a slot; the C path checks the same flag there)."""
    tier._load._batch = None
    tree = tier.accounting.tree
    real = tree.open_block

    def slow(path: str, **kw: Any) -> Any:
        gate.wait()
        return real(path, **kw)

    tree.open_block = slow  # type: ignore[method-assign]


def test_a_stalled_root_turns_into_misses_within_its_deadline_and_no_late_byte_lands(tmp_path: Path) -> None:
    primary = h.aligned_primary(16, BLOCK)
    roots = [str(tmp_path / "a"), str(tmp_path / "b")]
    tier = striped(primary, roots, cls=_StallingTier, io_timeout=0.5)
    gate = threading.Event()
    try:
        slow_keys, fast_keys = on_root(tier, 0, 4, "stall-a"), on_root(tier, 1, 4, "stall-b")
        keys = slow_keys + fast_keys
        assert h.store(tier, primary, keys).success
        _stall_opens(tier.roots[0], gate)
        job_id, took = submit(tier, primary, keys, load=True)
        assert took < 0.1  # submitting never waits for a disk
        t0 = time.monotonic()
        res = wait_for_jobs(tier, [job_id], timeout=5)[job_id]
        waited = time.monotonic() - t0
        assert 0.3 < waited < 0.5 + 0.6, waited  # reported at the deadline, not after the stall
        assert res.transferred(keys) == fast_keys
        assert tier.fenced_roots() == [0] and "stalled" in tier.health[0].reason
        assert tier.get_stats()["root0_timeouts"] >= 1
        check_loaded(primary, keys, fast_keys)
        gate.set()  # the disk comes back: the abandoned reads must not land in the slots
        assert wait_until(lambda: not tier.fenced_roots(), 5.0)  # probed and readmitted
        time.sleep(0.2)
        check_loaded(primary, keys, fast_keys)
        res = h.load(tier, primary, keys)
        assert res.success
        check_loaded(primary, keys, keys)
        # A stalled store: failed at its deadline, the root fenced, then stores go to the other root.
        stall = threading.Event()
        tier.roots[0].stall = stall  # type: ignore[attr-defined]
        new = on_root(tier, 0, 2, "stall-store")
        job_id, took = submit(tier, primary, new, load=False)
        assert took < 0.1
        t0 = time.monotonic()
        res = wait_for_jobs(tier, [job_id], timeout=5)[job_id]
        assert not res.success and time.monotonic() - t0 < 1.2
        assert tier.fenced_roots() == [0]
        t0 = time.monotonic()
        tier.drain()  # never hangs on the stalled root
        assert time.monotonic() - t0 < 1.5
        assert h.store(tier, primary, new).success
        assert all(k in tier.roots[1].indexed_keys() for k in new)
        stall.set()
    finally:
        gate.set()
        t0 = time.monotonic()
        tier.shutdown()
        assert time.monotonic() - t0 < 10


class _BrokenTier(FsTier):
    """A root whose block writes fail with ``broken`` (an errno; injected at the write seam: a
    tmpfs cannot be made to return EIO, and a live mount cannot be remounted read-only)."""

    broken = 0

    def _write_file(self, tmp: str, key: BlockKey, slot: int) -> None:
        if self.broken:
            raise OSError(self.broken, os.strerror(self.broken), tmp)
        super()._write_file(tmp, key, slot)


@pytest.mark.parametrize(
    ("err", "kind"), [(errno.EIO, "eio"), (errno.EROFS, "readonly"), (errno.ENOSPC, "full")]
)
def test_a_disk_error_fences_at_once_and_a_passing_probe_readmits(
    tmp_path: Path, err: int, kind: str
) -> None:
    primary = h.aligned_primary(8, BLOCK)
    tier = striped(primary, [str(tmp_path / "a"), str(tmp_path / "b")], cls=_BrokenTier, full_backoff=0.1)
    try:
        held = on_root(tier, 0, 2, f"held-{kind}")
        assert h.store(tier, primary, held).success
        tier.roots[0].broken = err  # type: ignore[attr-defined]
        keys = on_root(tier, 0, 2, kind)
        assert not h.store(tier, primary, keys).success
        assert tier.fenced_roots() == [0] and tier.health[0].reason.startswith(kind)
        assert tier.lookup_many(held) == [LookupResult.MISS] * 2
        # The probe does its own I/O (not the broken seam): it passes and readmits the root.
        tier.roots[0].broken = 0  # type: ignore[attr-defined]
        assert wait_until(lambda: not tier.fenced_roots(), 5.0)
        assert tier.lookup_many(held) == [LookupResult.HIT] * 2
        assert wait_until(lambda: h.store(tier, primary, keys).success, 5.0)
    finally:
        tier.shutdown()


def test_other_errors_fence_after_fence_errors_in_a_row(tmp_path: Path) -> None:
    primary = h.aligned_primary(8, BLOCK)
    tier = striped(primary, [str(tmp_path / "a"), str(tmp_path / "b")], cls=_BrokenTier, fence_errors=2)
    try:
        tier.roots[0].broken = errno.EACCES  # type: ignore[attr-defined]
        keys = on_root(tier, 0, 3, "eacces")
        assert not h.store(tier, primary, keys[:1]).success
        assert tier.fenced_roots() == []  # one error is not a failing disk
        assert not h.store(tier, primary, keys[1:2]).success
        assert tier.fenced_roots() == [0] and tier.get_stats()["root0_errors"] == 2
    finally:
        tier.shutdown()


def test_a_root_whose_lock_a_stalled_worker_holds_never_blocks_the_caller(tmp_path: Path) -> None:
    """A worker of the fs tier holds its lock across a few system calls (an eviction's unlink, an
    event-log append); a disk that hangs there keeps the lock. Injected: a thread takes root 0's
    lock and waits, as such a worker would. Submits, polls, touches and stats must not wait for it."""
    primary = h.aligned_primary(16, BLOCK)
    tier = striped(primary, [str(tmp_path / "a"), str(tmp_path / "b")], io_timeout=0.5)
    gate, held = threading.Event(), threading.Event()
    lock = tier.roots[0]._lock

    def stalled_worker() -> None:
        with lock:
            held.set()
            gate.wait()

    worker = threading.Thread(target=stalled_worker, daemon=True)
    try:
        slow, fast = on_root(tier, 0, 3, "lock-a"), on_root(tier, 1, 3, "lock-b")
        assert h.store(tier, primary, slow + fast).success
        worker.start()
        assert held.wait(5)
        t0 = time.monotonic()
        job_id, took = submit(tier, primary, slow + fast, load=True)
        res = wait_for_jobs(tier, [job_id], timeout=5)[job_id]
        assert took < 0.5 and time.monotonic() - t0 < 1.5
        assert res.transferred(slow + fast) == fast
        check_loaded(primary, slow + fast, fast)
        assert tier.fenced_roots() == [0] and "stalled" in tier.health[0].reason
        t0 = time.monotonic()
        tier.touch(fast)
        stats = tier.get_stats()
        assert time.monotonic() - t0 < 0.5 and stats["root0_fenced"] == 1
        new = on_root(tier, 0, 2, "lock-new")
        assert h.store(tier, primary, new, timeout=5).success  # placed on the other root
        assert all(k in tier.roots[1].indexed_keys() for k in new)
    finally:
        gate.set()
        worker.join(5)
    assert wait_until(lambda: not tier.fenced_roots(), 5.0)
    assert h.load(tier, primary, slow).success
    tier.shutdown()
