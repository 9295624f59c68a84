"""Touching block files without leaving the namespace directory, following a link or waiting on a FIFO.

Anyone who can write into the tree may put a symlink, a FIFO, a device node or another user's file
where a block or a shard directory belongs. Every path the fs tier opens, renames, stats or unlinks
under ``<ns>/<aa>/<b>/`` goes through :class:`SafeTree`, which

* resolves the two shard levels from a descriptor of the namespace directory held for the tier's
  life, each with ``O_DIRECTORY | O_NOFOLLOW`` (a shard replaced by a symlink is ``ELOOP``, so no
  block lands outside the root and no eviction deletes outside it);
* opens block files with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO opens at once instead of blocking) and
  then ``fstat``\\ s the descriptor: anything but a regular file of an expected owner is
  :class:`ForeignFileError`;
* unlinks an entry only after an ``lstat`` through the same descriptors shows a regular file of an
  expected owner (provably a file the tier could have written), never anything else.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Collection, Iterator

__all__ = ["DIR_FLAGS", "ForeignFileError", "SafeTree", "open_dir"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_O_DIRECT = getattr(os, "O_DIRECT", 0)


class ForeignFileError(OSError):
    """A path of the tree holds something the tier did not write (a link, FIFO, device, directory,
    or a file of another owner). ``reason`` is one word: ``"symlink"``, ``"special"``, ``"owner"``."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(errno.EPERM, f"not a block file of this tier ({reason})", path)
        self.reason = reason


def open_dir(path: str, dir_fd: int | None = None) -> int:
    """An ``O_DIRECTORY | O_NOFOLLOW`` descriptor (``ELOOP`` for a symlink, ``ENOTDIR`` otherwise)."""
    return os.open(path, DIR_FLAGS, dir_fd=dir_fd)


class SafeTree:
    """Confined access to the block files of one namespace directory (see the module doc).

    Args:
        ns_dir: the namespace directory (absolute); opened once, without following a link.
        owners: uids whose files count as the tier's own (``None``: any owner, for a shared root
            whose blocks are authenticated by a MAC instead).
    """

    def __init__(self, ns_dir: str, owners: Collection[int] | None = None) -> None:
        self.ns_dir = ns_dir
        self._prefix = ns_dir + "/"
        self.owners = None if owners is None else frozenset(owners)
        self.ns_fd = open_dir(ns_dir)
        self.foreign = 0  #: entries refused (counted; the callers log them)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.ns_fd)

    def _split(self, path: str) -> list[str]:
        if not path.startswith(self._prefix):
            raise ForeignFileError(path, "outside")
        parts = path[len(self._prefix) :].split("/")
        if not 1 <= len(parts) <= 3 or any(p in ("", ".", "..") for p in parts):
            raise ForeignFileError(path, "outside")
        return parts

    @contextlib.contextmanager
    def leaf(self, path: str) -> Iterator[tuple[int, str]]:
        """``(descriptor of the directory holding path, file name)`` for a path of the tree (a
        block path, or a stray entry up to two levels down). Raises ``FileNotFoundError`` when a
        level is missing, ``ForeignFileError`` when one is not a real directory (a link)."""
        *dirs, name = self._split(path)
        fd = self.ns_fd
        try:
            for d in dirs:
                try:
                    nxt = open_dir(d, fd)
                except OSError as exc:
                    raise self._dir_error(exc, path) from exc
                if fd != self.ns_fd:
                    os.close(fd)
                fd = nxt
            yield fd, name
        finally:
            if fd != self.ns_fd:
                os.close(fd)

    def _dir_error(self, exc: OSError, path: str) -> OSError:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            self.foreign += 1
            return ForeignFileError(path, "symlink" if exc.errno == errno.ELOOP else "special")
        return exc

    def check(self, st: os.stat_result, path: str) -> None:
        """Raise ``ForeignFileError`` unless ``st`` is a regular file of an expected owner."""
        reason = None
        if stat.S_ISLNK(st.st_mode):
            reason = "symlink"
        elif not stat.S_ISREG(st.st_mode):
            reason = "special"
        elif self.owners is not None and st.st_uid not in self.owners:
            reason = "owner"
        if reason is not None:
            self.foreign += 1
            raise ForeignFileError(path, reason)

    def open_block(self, path: str, *, direct: bool = False) -> tuple[int, int]:
        """``(descriptor, size)`` of block file ``path``, read-only (``O_DIRECT`` with ``direct``),
        checked: a regular file of an expected owner. The size comes from the check's ``fstat``.
        ``O_DIRECT`` is switched on after the check (``fcntl``): opening a FIFO or device with it
        fails with ``EINVAL`` instead of being recognised as foreign."""
        with self.leaf(path) as (leaf_fd, name):
            try:
                fd = os.open(name, os.O_RDONLY | FILE_FLAGS, dir_fd=leaf_fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    self.foreign += 1
                    raise ForeignFileError(path, "symlink") from exc
                raise
        try:
            st = os.fstat(fd)
            self.check(st, path)
            if direct:
                # The status flags are the open's (F_SETFL changes only O_APPEND, O_ASYNC,
                # O_DIRECT, O_NOATIME and O_NONBLOCK): no F_GETFL round trip needed.
                fcntl.fcntl(fd, fcntl.F_SETFL, os.O_NONBLOCK | _O_DIRECT)
        except BaseException:
            os.close(fd)
            raise
        return fd, st.st_size

    def lstat(self, path: str) -> os.stat_result:
        """``lstat`` of ``path`` through the confined leaf (``FileNotFoundError`` if absent)."""
        with self.leaf(path) as (leaf_fd, name):
            return os.stat(name, dir_fd=leaf_fd, follow_symlinks=False)

    def lexists(self, path: str) -> bool:
        try:
            self.lstat(path)
        except FileNotFoundError:
            return False
        except ForeignFileError:
            return True  # something is there (not ours): never replaced by a rename
        return True

    def unlink_own(self, path: str) -> int:
        """Unlink block file ``path`` if it is provably the tier's (regular, expected owner);
        return its size. Raises ``FileNotFoundError`` or ``ForeignFileError`` (left in place)."""
        with self.leaf(path) as (leaf_fd, name):
            st = os.stat(name, dir_fd=leaf_fd, follow_symlinks=False)
            self.check(st, path)
            os.unlink(name, dir_fd=leaf_fd)
            return st.st_size

    def rename_in(self, tmp_fd: int, tmp_name: str, final: str) -> None:
        """Rename temp file ``tmp_name`` (in directory ``tmp_fd``) to block path ``final``."""
        with self.leaf(final) as (leaf_fd, name):
            os.rename(tmp_name, name, src_dir_fd=tmp_fd, dst_dir_fd=leaf_fd)

    def make_dirs(self, path: str, *, top_exists: bool = False) -> None:
        """Create the two shard levels above block path ``path`` (0700), never through a link.
        ``top_exists``: the top level is known to exist (its ``mkdir`` is skipped; it is still
        opened without following a link)."""
        parts = self._split(path)
        if len(parts) != 3:
            raise ForeignFileError(path, "outside")
        top, mid = parts[0], parts[1]
        if not top_exists:
            with contextlib.suppress(FileExistsError):
                os.mkdir(top, 0o700, dir_fd=self.ns_fd)
        try:
            top_fd = open_dir(top, self.ns_fd)
        except OSError as exc:
            raise self._dir_error(exc, path) from exc
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(mid, 0o700, dir_fd=top_fd)
        finally:
            os.close(top_fd)
