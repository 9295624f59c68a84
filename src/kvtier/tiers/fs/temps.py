"""The temp files of one fs namespace: ``tmp/`` and its shard directories ``tmp/0`` .. ``tmp/f``.

A block is written to a temp file named ``<token>.<seq>`` and renamed into its leaf by a journaled
publication (see :mod:`.accounting`), so no reader ever sees half a block. The temp file lives in
shard ``seq % 16`` of ``tmp/``, not in ``tmp/`` itself. Why: every temp file is created in, and
renamed out of, its directory, and Linux serialises both on that directory's inode lock. With one
``tmp/`` that lock was held by every store of every worker: the bare ``safe_raw`` loop of
``benchmarks/bench_fs_peers.py`` (checksum + create + write + rename of 256 KiB blocks) ran at
0.75-0.81 x raw at 16 threads with one temp directory and 0.88-1.08 with 16 (no difference at
4 threads; docs/fs.md has the commands).

Contract:
* names have one shape, ``<ns>/tmp/<hex digit>/<token>.<seq>``; :meth:`TempDirs.path` makes them
  and :meth:`TempDirs.locate` accepts only them (and the flat ``<ns>/tmp/<token>.<seq>`` of
  earlier versions, whose crash intents may still name one). Nothing read from the tree is joined
  into a path: a name is parsed against these shapes and used relative to a descriptor opened once;
* the shard directories are made (0700) and opened ``O_NOFOLLOW`` when the namespace is opened,
  and kept for its life: a shard later replaced by a link is never followed. A shard name held by
  something else at start (a link, a file) is left alone and that shard's temp files go to
  ``tmp/`` itself (:attr:`TempDirs.unusable` counts them, for the caller to log);
* cleaning up after a dead process (:meth:`remove_owned`, :meth:`remove_stale`) lists ``tmp/`` and
  each shard and unlinks only entries of the temp-file shape whose token matches.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Callable, Iterator

from kvtier.tiers.fs.safe import open_dir

__all__ = ["TEMP_SHARDS", "TMP_DIR", "TempDirs", "is_token", "temp_owner"]

TMP_DIR = "tmp"
#: Shard directories of ``tmp/`` (one hex digit each).
TEMP_SHARDS = 16
#: A process token as :class:`~kvtier.tiers.fs.tier.FsTier` makes it: ``<pid>-<8 hex>``. Anything
#: else read from the tree (accounting entries, ``procs/`` names, temp-file names) is forged or
#: foreign: never joined into a path, never unlinked.
_TOKEN = re.compile(r"\A[0-9]{1,10}-[0-9a-f]{8}\Z")
_TEMP_NAME = re.compile(r"\A([0-9]{1,10}-[0-9a-f]{8})\.[0-9]{1,20}\Z")


def is_token(name: object) -> bool:
    """Whether ``name`` has the fixed shape of a process token (see ``_TOKEN``)."""
    return isinstance(name, str) and _TOKEN.match(name) is not None


def temp_owner(name: str) -> str | None:
    """The token that owns temp file ``name`` (``<token>.<n>``), or ``None`` if it is not one."""
    m = _TEMP_NAME.match(name)
    return m.group(1) if m else None


class TempDirs:
    """``<ns_dir>/tmp`` and its shards, opened once (see the module doc).

    Raises ``OSError`` when ``tmp/`` cannot be made or opened (``ELOOP``: a planted link), or a
    shard fails for another reason than a foreign entry in its place.
    """

    def __init__(self, ns_dir: str) -> None:
        self.dir = os.path.join(ns_dir, TMP_DIR)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.dir, 0o700)
        self.fd = open_dir(self.dir)
        #: Shards whose name was held by something else at start: their temp files go to tmp/.
        self.unusable = 0
        # Per shard, the directory part of its temp names (flat tmp/ for an unusable shard).
        self._prefixes: list[str] = []
        # Directory path -> descriptor, for the two name shapes locate() accepts (tmp/ first): the
        # one record of what is open.
        self._fds = {self.dir: self.fd}
        try:
            for i in range(TEMP_SHARDS):
                fd = self._open_shard(f"{i:x}")
                if fd is None:
                    self.unusable += 1
                    self._prefixes.append(f"{self.dir}/")
                    continue
                self._prefixes.append(f"{self.dir}/{i:x}/")
                self._fds[f"{self.dir}/{i:x}"] = fd
        except OSError:
            self.close()
            raise

    def _open_shard(self, name: str) -> int | None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=self.fd)
        try:
            return open_dir(name, self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return None  # a link or a file holds the name: never followed, never removed
            raise

    def path(self, token: str, seq: int) -> str:
        """The temp file name for ``token``'s ``seq``-th block (in shard ``seq % 16``)."""
        return f"{self._prefixes[seq % TEMP_SHARDS]}{token}.{seq}"

    def locate(self, tmp: str) -> tuple[int, str]:
        """``(directory descriptor, file name)`` of temp path ``tmp``; ``ValueError`` when ``tmp``
        is not of a temp file's shape (see the module doc)."""
        head, _, name = tmp.rpartition("/")
        fd = self._fds.get(head)
        if fd is None or temp_owner(name) is None:
            raise ValueError(f"not a temp file of {self.dir}: {tmp!r}")
        return fd, name

    def owned_by(self, tmp: str, token: str) -> bool:
        """Whether string ``tmp`` names a temp file of ``token`` (compared, never resolved)."""
        head, _, name = tmp.rpartition("/")
        return head in self._fds and temp_owner(name) == token

    def exists(self, tmp: str) -> bool:
        """Whether temp file ``tmp`` is there (``lstat``; never follows a link)."""
        try:
            fd, name = self.locate(tmp)
            os.stat(name, dir_fd=fd, follow_symlinks=False)
        except (OSError, ValueError):
            return False
        return True

    def unlink(self, tmp: str) -> bool:
        """Remove temp file ``tmp`` (by name, never through a link); whether it was there."""
        try:
            fd, name = self.locate(tmp)
            os.unlink(name, dir_fd=fd)
        except (OSError, ValueError):
            return False
        return True

    def remove_owned(self, token: str) -> int:
        """Delete every temp file of ``token`` (a dead process); how many were removed."""
        if not is_token(token):
            return 0
        return self._remove(lambda owner: owner == token)

    def remove_stale(self, live: Callable[[str], bool]) -> int:
        """Delete temp files whose owner is not ``live``; how many were removed."""
        return self._remove(lambda owner: not live(owner))

    def _remove(self, doomed: Callable[[str], bool]) -> int:
        removed = 0
        for fd, name in self._entries():
            owner = temp_owner(name)
            if owner is not None and doomed(owner):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=fd)
                    removed += 1
        return removed

    def _entries(self) -> Iterator[tuple[int, str]]:
        for fd in list(self._fds.values()):  # the flat tmp/ holds earlier versions' temp files
            names: list[str] = []
            with contextlib.suppress(OSError), os.scandir(fd) as it:
                names = [e.name for e in it]
            yield from ((fd, n) for n in names)

    def close(self) -> None:
        """Close the descriptors. Idempotent."""
        fds, self._fds = list(self._fds.values()), {}  # a late call finds no directory, not a reused fd
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fd = -1
