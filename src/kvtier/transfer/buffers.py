"""Host buffers behind the primary tier: heap, POSIX shared memory, torch, none, or external.

Every backing exposes the same two things: ``rows``, a C-contiguous ``uint8`` numpy array of shape
``(num_slots, row_stride)``, and ``view``, a zero-copy 2-D ``memoryview`` of the same memory (what
secondary tiers receive as ``primary_kv_view``).

Shared memory (``shm``) protocol, so several processes map one buffer by name and a crashed owner's
segment is cleaned at the next start:

* files live in ``/dev/shm`` (Linux POSIX shared memory), mode ``0600``: the segment ``<name>``, a
  users file ``<name>.kvtier-users`` and an init lock ``<name>.kvtier-lock``;
* every process holds a *shared* ``flock`` on the users file for as long as it maps the segment;
  the kernel drops it when the process dies, however it dies;
* opening takes the init lock, then tries an *exclusive* non-blocking lock on the users file: if it
  gets it, no live process maps the segment, so an existing one is stale and is replaced; otherwise it
  attaches to the live one (sizes must match);
* closing drops the shared lock; the last user (exclusive lock succeeds) unlinks the segment and the
  users file. The 0-byte init lock file stays, so that concurrent starts keep serialising on one inode.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import re
import secrets
from typing import Any

import numpy as np
import numpy.typing as npt

from kvtier.errors import ConfigError

__all__ = ["SHM_DIR", "HostBuffer", "ShmBuffer", "aligned_empty", "attach_buffer", "open_buffer"]

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
ALIGN = 4096
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")


def aligned_empty(nbytes: int, align: int = ALIGN) -> npt.NDArray[np.uint8]:
    """Uninitialised ``uint8`` array whose first byte is ``align``-aligned (pages stay untouched)."""
    raw = np.empty(nbytes + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off : off + nbytes]


class HostBuffer:
    """A buffer of ``num_slots`` rows of ``row_stride`` bytes (heap or metadata-only)."""

    kind = "heap"

    def __init__(self, rows: npt.NDArray[np.uint8], keepalive: Any = None) -> None:
        self.rows = rows
        self.view = rows.data
        self._keepalive = keepalive

    def close(self) -> None:
        """Drop this object's references (memory goes when the last view does). Idempotent."""
        self._keepalive = None


def _heap(num_slots: int, row_stride: int) -> HostBuffer:
    return HostBuffer(aligned_empty(num_slots * row_stride).reshape(num_slots, row_stride))


def _none(num_slots: int) -> HostBuffer:
    buf = HostBuffer(np.zeros((num_slots, 0), dtype=np.uint8))
    buf.kind = "none"
    return buf


def _torch(num_slots: int, row_stride: int) -> HostBuffer:
    try:
        import torch
    except ImportError as exc:
        raise ConfigError(
            "primary_backing", "'torch' needs PyTorch: pip install 'kvtier[torch]' (or use heap)"
        ) from exc
    # Pinned (page-locked) memory only helps, and only works, with a CUDA device to DMA to/from.
    pin = bool(torch.cuda.is_available())
    tensor = torch.empty((num_slots, row_stride), dtype=torch.uint8, pin_memory=pin)
    buf = HostBuffer(tensor.numpy(), keepalive=tensor)
    buf.kind = "torch"
    buf.tensor = tensor  # type: ignore[attr-defined]
    return buf


def _sole_user(users_fd: int) -> bool:
    """Take the users lock exclusively if no other process holds it (then the caller is the only
    user: the first to map the segment, or the last to unmap it); else leave it as it was."""
    try:
        fcntl.flock(users_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class ShmBuffer(HostBuffer):
    """POSIX shared memory mapped by name (see the module docstring for the protocol)."""

    kind = "shm"

    def __init__(
        self,
        name: str,
        num_slots: int,
        row_stride: int,
        directory: str = SHM_DIR,
        *,
        private: bool = False,
        owner: bool = False,
    ) -> None:
        if not _NAME_RE.match(name):
            raise ConfigError(
                "shm_name", f"{name!r} is not a valid name; use letters, digits, '_', '.', '-' (no '/')"
            )
        if not os.path.isdir(directory):
            raise ConfigError("primary_backing", f"'shm' needs {directory} (Linux); use 'heap' instead")
        self.name = name
        self.size = num_slots * row_stride
        self.path = os.path.join(directory, name)
        self._users_path = self.path + ".kvtier-users"
        self._lock_path = self.path + ".kvtier-lock"
        # The slot index (states, pins, policy) lives in one process: the owner. Two indexes over one
        # segment would hand the same slot to different keys, so a second owner is refused; other
        # processes attach with owner=False and only read/write bytes the owner tells them about.
        self._owner_path = self.path + ".kvtier-owner"
        self.owner = owner
        self._owner_fd = -1
        self.created = False
        # A generated per-process name is never opened by anyone else: its lock file can go too.
        self.private = private
        try:
            self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ConfigError("shm_name", f"{self._lock_path}: cannot open ({exc.strerror})") from exc
        self._users_fd = -1
        try:
            mm = self._open_locked()
        except BaseException:
            self._close_fds()
            raise
        self._mmap: mmap.mmap | None = mm
        rows = np.frombuffer(mm, dtype=np.uint8, count=self.size).reshape(num_slots, row_stride)
        super().__init__(rows)

    def _take_ownership(self) -> None:
        self._owner_fd = os.open(self._owner_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._owner_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                "shm_name",
                f"{self.name!r} is already owned by another engine (only one engine may own a segment's "
                "slot index); give each engine its own shm_name, or attach worker processes to the bytes "
                "with kvtier.transfer.buffers.ShmBuffer(name, num_slots, row_stride)",
            ) from None

    def _open_locked(self) -> mmap.mmap:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            if self.owner:
                self._take_ownership()
            self._users_fd = os.open(self._users_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            # The users lock is shared by every process mapping the segment: exclusive means none does.
            first = _sole_user(self._users_fd)
            if first:
                if os.path.exists(self.path):
                    log.warning(
                        "kvtier: removing stale shared memory %s (no live process maps it)", self.path
                    )
                    os.unlink(self.path)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                self.created = True
                # Safe to convert EX -> SH non-atomically: every other opener holds the init lock first.
                fcntl.flock(self._users_fd, fcntl.LOCK_SH)
            else:
                fcntl.flock(self._users_fd, fcntl.LOCK_SH)
                fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            try:
                if first:
                    os.ftruncate(fd, self.size)
                have = os.fstat(fd).st_size
                if have != self.size:
                    raise ConfigError(
                        "shm_name",
                        f"{self.path} holds {have} bytes but this engine needs {self.size}; use the same "
                        "cpu_bytes_to_use and block_bytes in every process, or another shm_name",
                    )
                return mmap.mmap(fd, self.size)
            finally:
                os.close(fd)
        except OSError as exc:
            raise ConfigError("shm_name", f"{self.path}: cannot map shared memory ({exc.strerror})") from exc
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _close_fds(self) -> None:
        for fd in (self._owner_fd, self._users_fd, self._lock_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._owner_fd = self._users_fd = self._lock_fd = -1

    def close(self) -> None:
        """Unmap (when no view is left) and, as the last user, unlink the segment. Idempotent."""
        if self._lock_fd < 0:
            return
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._users_fd, fcntl.LOCK_UN)
            last = _sole_user(self._users_fd)
            if last:
                paths = (self.path, self._users_path, self._owner_path)
                for p in (*paths, *((self._lock_path,) if self.private else ())):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(p)
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            self._close_fds()
        with contextlib.suppress(BufferError):
            self.view.release()
        mm, self._mmap = self._mmap, None
        del self.rows
        if mm is not None:
            # Tiers may still hold numpy views of the rows; then the mapping goes with the last one.
            with contextlib.suppress(BufferError):
                mm.close()


def open_buffer(backing: str, num_slots: int, row_stride: int, shm_name: str | None = None) -> HostBuffer:
    """Allocate the primary buffer for ``backing`` (``heap``, ``shm``, ``torch`` or ``none``)."""
    if backing == "heap":
        return _heap(num_slots, row_stride)
    if backing == "none":
        return _none(num_slots)
    if backing == "torch":
        return _torch(num_slots, row_stride)
    if backing == "shm":
        # The primary tier holds the slot index, so it opens the segment as its owner.
        if shm_name:
            return ShmBuffer(shm_name, num_slots, row_stride, owner=True)
        name = f"kvtier-{os.getpid()}-{secrets.token_hex(4)}"
        return ShmBuffer(name, num_slots, row_stride, private=True, owner=True)
    raise ConfigError("primary_backing", f"expected heap, shm, torch or none, got {backing!r}")


def attach_buffer(memory: Any, num_slots: int, row_stride: int) -> HostBuffer:
    """Use caller-owned ``memory`` (any writable C-contiguous buffer of ``num_slots * row_stride``
    bytes) as the primary buffer, zero-copy (backing ``external``).

    The caller allocated it and frees it: ``close`` only drops kvtier's references, so the caller
    must keep the memory mapped until the engine is closed. This is how an inference engine that
    owns the host buffer itself (vLLM's shared offload region, which its GPU workers copy into) lets
    kvtier keep the slot index and run the secondary tiers on the same bytes.
    """
    try:
        view = memoryview(memory)
    except TypeError as exc:
        raise ConfigError("primary_buffer", f"expected a buffer (memoryview, numpy array): {exc}") from exc
    if view.readonly or not view.c_contiguous:
        raise ConfigError("primary_buffer", "must be writable and C-contiguous (pass the whole buffer)")
    need = num_slots * row_stride
    if view.nbytes != need:
        raise ConfigError(
            "primary_buffer",
            f"holds {view.nbytes} bytes but {num_slots} slots of {row_stride} bytes need {need}; "
            "size cpu_bytes_to_use and block_bytes to the buffer",
        )
    rows = np.frombuffer(view.cast("B"), dtype=np.uint8).reshape(num_slots, row_stride)
    buf = HostBuffer(rows, keepalive=view)
    buf.kind = "external"
    return buf
