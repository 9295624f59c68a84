"""The ``<ns>/seg/`` directory of the small-block path, touched under the hostile-tree rules.

* The directory is created 0700 and opened once with ``O_DIRECTORY | O_NOFOLLOW`` (a ``seg`` that
  is a symlink is refused); every file is opened relative to that descriptor with
  ``O_NOFOLLOW | O_NONBLOCK`` (no link followed, no FIFO waited on) and then ``fstat``-checked:
  anything but a regular file of an expected owner is :class:`~kvtier.tiers.fs.safe.ForeignFileError`.
* Only names of the fixed segment shape (:func:`~kvtier.tiers.fs.segment_index.parse_name`) are
  listed, opened or removed; a file is unlinked only after an ``lstat`` shows a regular file of an
  expected owner.
* Read descriptors are cached per segment and reference-counted, so a descriptor is never closed
  (and its number reused) while another thread reads through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Collection
from dataclasses import dataclass

from kvtier.tiers.fs.safe import FILE_FLAGS, ForeignFileError, foreign_reason, open_dir
from kvtier.tiers.fs.segment_index import SEG_DIR, SegmentName, parse_name

__all__ = ["SegmentDir"]


@dataclass(slots=True)
class _Rfd:
    """A cached read descriptor, its current readers, and whether its segment is gone."""

    fd: int
    users: int
    dropped: bool = False


class SegmentDir:
    """Confined access to the segment files of one namespace directory (see the module doc).

    Args:
        ns_dir: the namespace directory; ``seg/`` is created under it (0700) when missing.
        owners: uids whose files count as the tier's own (``None``: any owner, a shared root).
    """

    def __init__(self, ns_dir: str, owners: Collection[int] | None) -> None:
        self.path = os.path.join(ns_dir, SEG_DIR)
        self.owners = None if owners is None else frozenset(owners)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.path, 0o700)
        self.fd = open_dir(self.path)  # ELOOP for a symlinked seg/
        self._check(os.fstat(self.fd), self.path, directory=True)
        self._lock = threading.Lock()
        self._rfds: dict[str, _Rfd] = {}
        #: Entries refused (links, special files, other owners' files).
        self.foreign = 0

    def _check(self, st: os.stat_result, path: str, *, directory: bool = False) -> None:
        reason = foreign_reason(st, self.owners, directory=directory)
        if reason is not None:
            self.foreign += 1
            raise ForeignFileError(path, reason)

    def listing(self) -> dict[SegmentName, set[str]]:
        """Segments present now -> which of their files (``"dat"``, ``"idx"``) exist."""
        out: dict[SegmentName, set[str]] = {}
        with os.scandir(self.fd) as it:
            for e in it:
                parsed = parse_name(e.name)
                if parsed is not None:
                    out.setdefault(parsed[0], set()).add(parsed[1])
        return out

    def open(self, name: str, flags: int) -> int:
        """Open segment file ``name`` (no link, no FIFO wait) and check it is a regular file of
        an expected owner. ``flags`` may add ``O_CREAT | O_EXCL`` (files are created 0600)."""
        if parse_name(name) is None:
            raise ForeignFileError(f"{self.path}/{name}", "name")
        try:
            fd = os.open(name, flags | FILE_FLAGS, 0o600, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self.foreign += 1
                raise ForeignFileError(f"{self.path}/{name}", "symlink") from exc
            raise
        try:
            self._check(os.fstat(fd), f"{self.path}/{name}")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def unlink(self, name: str) -> bool:
        """Remove segment file ``name`` if it is provably ours; whether it was removed."""
        if parse_name(name) is None:
            return False
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            self._check(st, f"{self.path}/{name}")
            os.unlink(name, dir_fd=self.fd)
        except OSError:  # gone already, or not ours (left in place, counted in ``foreign``)
            return False
        return True

    # -- cached read descriptors -------------------------------------------------------------------
    def acquire(self, seg: SegmentName) -> int:
        """A read descriptor of ``seg``'s data file; give it back with :meth:`release`."""
        with self._lock:
            entry = self._rfds.get(seg.stem)
            if entry is not None:
                entry.users += 1
                return entry.fd
        fd = self.open(seg.dat, os.O_RDONLY)
        with self._lock:
            entry = self._rfds.get(seg.stem)
            if entry is None:
                self._rfds[seg.stem] = _Rfd(fd, 1)
                return fd
            entry.users += 1  # another thread opened it meanwhile
        os.close(fd)
        return entry.fd

    def release(self, seg: SegmentName, fd: int) -> None:
        with self._lock:
            entry = self._rfds.get(seg.stem)
            if entry is None or entry.fd != fd:
                return  # dropped meanwhile: the last user closes it below
            entry.users -= 1
            if entry.users > 0 or not entry.dropped:
                return
            del self._rfds[seg.stem]
        os.close(fd)

    def drop(self, seg: SegmentName) -> None:
        """The segment is gone: close its cached descriptor once no reader uses it."""
        with self._lock:
            entry = self._rfds.get(seg.stem)
            if entry is None:
                return
            if entry.users > 0:
                entry.dropped = True
                return
            del self._rfds[seg.stem]
        os.close(entry.fd)

    def close(self) -> None:
        with self._lock:
            fds = [e.fd for e in self._rfds.values()]
            self._rfds.clear()
        for fd in (*fds, self.fd):
            with contextlib.suppress(OSError):
                os.close(fd)
