"""Touching block files without leaving the namespace directory, following a link or waiting on a FIFO.

Anyone who can write into the tree may put a symlink, a FIFO, a device node or another user's file
where a block or a shard directory belongs. Every path the fs tier opens, renames, stats or unlinks
under ``<ns>/<a>/<b>/`` goes through :class:`SafeTree`, which

* resolves the two shard levels from a descriptor of the namespace directory held for the tier's
  life, each with ``O_DIRECTORY | O_NOFOLLOW`` (a shard replaced by a symlink is ``ELOOP``, so no
  block lands outside the root and no eviction deletes outside it);
* opens block files with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO opens at once instead of blocking) and
  then ``fstat``\\ s the descriptor: anything but a regular file of an expected owner is
  :class:`ForeignFileError`;
* unlinks an entry only after an ``lstat`` through the same descriptors shows a regular file of an
  expected owner (provably a file the tier could have written), never anything else.

Shard directory descriptors are **cached** for the tier's life, like the namespace directory's: a
block operation then costs one ``fstatat`` per level (that the name still holds the cached
directory: a shard renamed away and replaced by a link or another directory is noticed, the entry
dropped and the path walked afresh) instead of an ``openat`` and a ``close`` per level. The cache
never evicts, so a descriptor is never closed while a worker uses it; it holds at most a quarter of
``RLIMIT_NOFILE`` (past that, shards are opened per operation as before).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
from collections.abc import Collection, Iterator

__all__ = ["DIR_FLAGS", "ForeignFileError", "SafeTree", "foreign_reason", "open_dir"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_O_DIRECT = getattr(os, "O_DIRECT", 0)


class ForeignFileError(OSError):
    """A path of the tree holds something the tier did not write (a link, FIFO, device, directory,
    or a file of another owner). ``reason`` is one word: ``"symlink"``, ``"special"``, ``"owner"``.

    An ``OSError`` on purpose, outside the ``KvtierError`` tree: the fs tier's own I/O paths raise and
    catch it beside the kernel's errors (a hostile file reads as a miss) and it never leaves the
    tier."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(errno.EPERM, f"not a block file of this tier ({reason})", path)
        self.reason = reason


_BAD_NAMES = frozenset(("", ".", ".."))
_NO_FDS: list[int] = []  # never appended to: _locate's "nothing to close"

#: Most shard directories cached: 256 top-level + 4096 leaf directories.
MAX_CACHED_DIRS = 256 + 256 * 16


def _cache_room() -> int:
    """Shard descriptors this process's trees may keep open together: a quarter of the soft
    descriptor limit (the rest stays the engine's: sockets, files, other tiers)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # pragma: no cover - non-POSIX
        return 64
    if soft == resource.RLIM_INFINITY:
        return MAX_CACHED_DIRS
    return max(0, min(MAX_CACHED_DIRS, soft // 4))


class DescriptorBudget:
    """The shard descriptors every :class:`SafeTree` of the process may still cache, together.

    Why one budget for the process: a striped tier opens one tree per root, and a quarter of the
    descriptor limit per tree would let four roots take all of it. ``room`` is read on first use.
    """

    def __init__(self, room: int | None = None) -> None:
        self._lock = threading.Lock()
        self._left = room

    def take(self) -> bool:
        """Claim one descriptor; ``False`` (nothing claimed) when the budget is spent."""
        with self._lock:
            if self._left is None:
                self._left = _cache_room()
            if self._left <= 0:
                return False
            self._left -= 1
            return True

    def give(self, n: int) -> None:
        """Return ``n`` claimed descriptors (closed by their tree)."""
        with self._lock:
            if self._left is not None:
                self._left += n


#: The process's budget (tests may swap it).
BUDGET = DescriptorBudget()


def foreign_reason(
    st: os.stat_result, owners: Collection[int] | None, *, directory: bool = False
) -> str | None:
    """Why ``st`` is not the tier's own entry (``"symlink"``, ``"special"``, ``"owner"``), or
    ``None``: a regular file (a directory with ``directory``) of an expected owner."""
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if not (stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)):
        return "special"
    if owners is not None and st.st_uid not in owners:
        return "owner"
    return None


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
        # "aa" / "aa/b" -> (descriptor, st_dev, st_ino) of the shard directory (see the module doc).
        self._dirs: dict[str, tuple[int, int, int]] = {}
        # "aa/b" -> (descriptor, ((parent fd, name, st_ino) per level)): the fast path of _locate.
        self._leaves: dict[str, tuple[int, tuple[tuple[int, str, int], ...]]] = {}
        self._plen = len(self._prefix)
        self._retired: list[int] = []  # dropped entries: closed only by close() (a worker may use one)
        self._lock = threading.Lock()
        self._room = MAX_CACHED_DIRS  # this tree's own cap; 0 once it stops caching (see _retire)
        self._budget = BUDGET
        self._taken = 0  # descriptors claimed from the budget, cached or retired: given back at close

    def close(self) -> None:
        """Close every descriptor (the tier's workers have stopped)."""
        with self._lock:
            fds = [fd for fd, _, _ in self._dirs.values()] + self._retired
            self._dirs.clear()
            self._retired = []
            taken, self._taken = self._taken, 0
        self._budget.give(taken)
        for fd in (*fds, self.ns_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _split(self, path: str) -> list[str]:
        if not path.startswith(self._prefix):
            raise ForeignFileError(path, "outside")
        parts = path[len(self._prefix) :].split("/")
        if not 1 <= len(parts) <= 3 or not _BAD_NAMES.isdisjoint(parts):
            raise ForeignFileError(path, "outside")
        return parts

    def _locate(self, path: str) -> tuple[int, str, list[int]]:
        """``(directory fd, file name, descriptors to close after use)`` for ``path``.

        Fast path: the directory part is a cached shard whose names still hold the cached
        directories (one ``fstatat`` per level). Otherwise the path is split, checked and walked."""
        if path.startswith(self._prefix):
            d, _, name = path[self._plen :].rpartition("/")
            hit = self._leaves.get(d)
            if hit is not None and name not in _BAD_NAMES:
                st = os.stat
                try:
                    if all(st(n, dir_fd=p, follow_symlinks=False).st_ino == i for p, n, i in hit[1]):
                        return hit[0], name, _NO_FDS
                except OSError:
                    pass
                with self._lock:  # swapped under our feet: the walk below re-checks every level
                    self._leaves.pop(d, None)
        *dirs, name = self._split(path)
        fd = self.ns_fd
        temp: list[int] = []  # descriptors not cached: closed after use
        checks: list[tuple[int, str, int]] = []
        try:
            rel = ""
            for part in dirs:
                rel = f"{rel}/{part}" if rel else part
                parent, fd = fd, self._walk(fd, rel, part, path, temp)
                hit_ = self._dirs.get(rel)
                if hit_ is not None and hit_[0] == fd:
                    checks.append((parent, part, hit_[2]))
        except BaseException:
            for t in temp:
                os.close(t)
            raise
        if dirs and not temp and len(checks) == len(dirs):
            self._leaves[rel] = (fd, tuple(checks))
        return fd, name, temp

    def cached_leaf(self, path: str) -> tuple[int, str, tuple[tuple[int, str, int], ...]] | None:
        """``(directory fd, file name, checks)`` of ``path`` when its shard is cached, else ``None``;
        no system call. ``checks`` are the ``(parent fd, name, st_ino)`` levels :meth:`_locate`'s
        fast path verifies with ``fstatat`` before trusting the descriptor: the caller must do
        the same (the batched reader does, in C). Descriptors are retired, never closed, before
        :meth:`close`, so they stay valid while a worker uses them."""
        if not path.startswith(self._prefix):
            return None
        d, _, name = path[self._plen :].rpartition("/")
        hit = self._leaves.get(d)
        if hit is None or name in _BAD_NAMES:
            return None
        return hit[0], name, hit[1]

    def warm(self, path: str) -> None:
        """Open and cache the shard directories above block path ``path`` now (while the process's
        descriptor budget lasts), so the first store or load of a young tree into that leaf skips
        the walk. Raises as :meth:`leaf` does."""
        with self.leaf(path):
            pass

    @contextlib.contextmanager
    def leaf(self, path: str) -> Iterator[tuple[int, str]]:
        """``(descriptor of the directory holding path, file name)`` for a path of the tree (a
        block path, or a stray entry up to two levels down). Raises ``FileNotFoundError`` when a
        level is missing, ``ForeignFileError`` when one is not a real directory (a link)."""
        fd, name, temp = self._locate(path)
        try:
            yield fd, name
        finally:
            for t in temp:
                os.close(t)

    def _walk(self, parent: int, rel: str, name: str, path: str, temp: list[int]) -> int:
        """The descriptor of shard ``rel`` (entry ``name`` of ``parent``): cached, or opened."""
        hit = self._dirs.get(rel)
        if hit is not None:
            fd, dev, ino = hit
            if self._still(parent, name, dev, ino):
                return fd
            with self._lock:  # swapped under our feet: forget it, walk afresh
                if self._dirs.get(rel) is hit:
                    del self._dirs[rel]
                    self._leaves = {k: v for k, v in self._leaves.items() if v[0] != fd}
                    self._retire(fd)
        try:
            fd = open_dir(name, parent)
        except OSError as exc:
            raise self._dir_error(exc, path) from exc
        if len(self._dirs) < self._room and self._budget.take():
            try:
                st = os.fstat(fd)
            except OSError:
                os.close(fd)
                self._budget.give(1)
                raise
            with self._lock:
                if rel not in self._dirs and len(self._dirs) < self._room:
                    self._dirs[rel] = (fd, st.st_dev, st.st_ino)
                    self._taken += 1
                    return fd
            self._budget.give(1)
        temp.append(fd)
        return fd

    @staticmethod
    def _still(parent: int, name: str, dev: int, ino: int) -> bool:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            return False
        return st.st_ino == ino and st.st_dev == dev and stat.S_ISDIR(st.st_mode)

    def forget(self, path: str) -> None:
        """Drop the cached shards above ``path`` (a rename found its directory gone: the next
        operation walks afresh and finds the one recreated)."""
        parts = self._split(path)[:-1]
        with self._lock:
            self._leaves.clear()
            for i in range(len(parts), 0, -1):
                hit = self._dirs.pop("/".join(parts[:i]), None)
                if hit is not None:
                    self._retire(hit[0])

    def _retire(self, fd: int) -> None:
        """Keep a dropped descriptor until close() (lock held). Someone who keeps swapping shard
        directories would make these pile up: past 64, this tree stops caching."""
        self._retired.append(fd)
        if len(self._retired) > 64:
            self._room = 0

    def _dir_error(self, exc: OSError, path: str) -> OSError:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            self.foreign += 1
            return ForeignFileError(path, "symlink" if exc.errno == errno.ELOOP else "special")
        return exc

    def check(self, st: os.stat_result, path: str) -> None:
        """Raise ``ForeignFileError`` unless ``st`` is a regular file of an expected owner."""
        reason = foreign_reason(st, self.owners)
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
        leaf_fd, name, temp = self._locate(path)
        try:
            return os.stat(name, dir_fd=leaf_fd, follow_symlinks=False)
        finally:
            for t in temp:
                os.close(t)

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
        leaf_fd, name, temp = self._locate(final)
        try:
            os.rename(tmp_name, name, src_dir_fd=tmp_fd, dst_dir_fd=leaf_fd)
        except FileNotFoundError:
            self.forget(final)
            raise
        finally:
            for t in temp:
                os.close(t)

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
