"""One foreign call per chunk of fs loads: the system calls and checksums of many block reads,
made without the GIL (``batchread.c``, compiled on first use by :mod:`kvtier.native`).

Why: a Python worker releases the GIL around every system call and must take it back after. In
an engine whose scheduler loop holds the GIL between steps (vLLM's, waiting for exactly these
loads), each retake waits for the loop to yield, so a load made of ~7 calls per block ran at a
twentieth of its I/O speed inside a running vLLM while it ran at full speed alone. vLLM's own fs
tier avoids it the same way (its batched loads are one C call).

Contract of :meth:`BatchReader.read`: for each ``(path, slot, key, touch, direct)`` it answers
``True`` when the block's file was opened through the shard's cached directory chain (re-checked
with ``fstatat``), found to be a regular file of an expected owner and of exactly header + payload
bytes, read with one ``preadv`` (header into this reader's buffer, payload straight into the
slot), and its checksums computed (:meth:`header_check`, :meth:`payload_digest`); and ``False``
for anything else: the caller redoes that block on its Python path, which classifies the failure
as it always has (missing, foreign, corrupt, I/O error). So this module adds speed and no
behaviour; it never decides that a block is good (the caller compares the header).

:func:`open_reader` gives ``None`` (the caller keeps its Python path) when no C compiler is found,
``KVTIER_FS_BATCHREAD=python`` is set, or the ``xxhash`` module exports no
``XXH3_64bits_withSeed``.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from kvtier import codec
from kvtier.native import load_library
from kvtier.tiers.fs.layout import HEADER_ALIGN
from kvtier.tiers.fs.safe import SafeTree

__all__ = ["BatchItem", "BatchReader", "BlockFormat", "open_reader"]

_SOURCE = Path(__file__).with_name("batchread.c")
_P = ctypes.c_void_p


class BatchItem(NamedTuple):
    """One block to read: its file, primary slot, key, whether to refresh its mtime, O_DIRECT."""

    path: str
    slot: int
    key: bytes
    touch: bool
    direct: bool


def _xxh3_address() -> int | None:
    """Address of ``XXH3_64bits_withSeed`` in the loaded ``xxhash`` extension, or ``None``."""
    try:
        import xxhash._xxhash as ext

        fn = ctypes.CDLL(ext.__file__).XXH3_64bits_withSeed
    except (ImportError, OSError, AttributeError):
        return None
    return ctypes.cast(fn, _P).value


def _function() -> tuple[Callable[..., int], int] | None:
    lib = load_library(_SOURCE, disable_env="KVTIER_FS_BATCHREAD")
    xxh3 = _xxh3_address()
    if lib is None or xxh3 is None:
        return None
    fn = lib.kvt_read_blocks
    i64 = ctypes.c_int64
    # n, leaf_fd, name, chk_n, chk_fd, chk_name, chk_ino, hdr, hlen, dst, plen, direct, touch,
    # keys, key_off, key_len, tail, n_owners, owners, verify, abandon_epoch, epoch0, xxh3,
    # status, hcheck, pcheck
    fn.argtypes = [i64, _P, _P, _P, _P, _P, _P, _P, i64, _P, i64, _P, _P, _P, _P, _P, _P,
                   ctypes.c_int, _P, ctypes.c_int, _P, i64, _P, _P, _P, _P]  # fmt: skip
    fn.restype = i64
    return fn, xxh3


_resolved: tuple[Callable[..., int], int] | None = None
_resolve_lock = threading.Lock()
_resolved_once = False


@dataclass(frozen=True, slots=True)
class BlockFormat:
    """What every block file of one tier looks like: header and payload bytes, the namespace tag
    its checksums are seeded with, whether payloads are verified, and the owners it accepts."""

    header_len: int
    payload_len: int
    ns_tag: int
    verify: bool
    owners: Collection[int] | None


def open_reader(tree: SafeTree, rows: npt.NDArray[np.uint8], fmt: BlockFormat) -> BatchReader | None:
    """A reader for one fs tier's loads (see the module doc), or ``None`` where there is none."""
    global _resolved, _resolved_once
    with _resolve_lock:
        if not _resolved_once:
            _resolved_once = True
            _resolved = _function()
    if _resolved is None or rows.ndim != 2 or not rows.flags.c_contiguous:
        return None
    fn, xxh3 = _resolved
    return BatchReader(fn, xxh3, tree, rows, fmt)


class BatchReader:
    """Batched block reads of one fs tier (worker threads; each call uses its own buffers)."""

    def __init__(
        self, fn: Callable[..., int], xxh3: int, tree: SafeTree, rows: npt.NDArray[np.uint8], fmt: BlockFormat
    ) -> None:
        self._fn, self._xxh3, self._tree = fn, xxh3, tree
        self._base, self._stride = rows.ctypes.data, rows.strides[0]
        self.header_len, self.payload_len = fmt.header_len, fmt.payload_len
        self._tail = codec.payload_seed_tail(fmt.ns_tag, fmt.payload_len)
        self._verify = fmt.verify
        owner_list = sorted(fmt.owners) if fmt.owners is not None else []
        self._owners = np.asarray(owner_list, dtype=np.int64)
        self._n_owners = -1 if fmt.owners is None else len(owner_list)
        #: Bumped by :meth:`note_abandon`; a call that sees it move stops before its next read.
        self.abandon_epoch = ctypes.c_int64(0)
        self._tls = threading.local()

    def note_abandon(self) -> None:
        """A job was given up: reads in progress stop before touching another slot."""
        self.abandon_epoch.value += 1

    def epoch(self) -> int:
        """The abandon count now: read it before checking a job's flag, pass it to :meth:`read`."""
        return int(self.abandon_epoch.value)

    def _headers(self, n: int) -> npt.NDArray[np.uint8]:
        """This thread's page-aligned header buffer of ``n`` headers (O_DIRECT reads need it)."""
        need = n * self.header_len
        buf: npt.NDArray[np.uint8] | None = getattr(self._tls, "hdr", None)
        if buf is None or buf.size < need:
            raw = np.empty(need + HEADER_ALIGN, dtype=np.uint8)
            skip = -raw.ctypes.data % HEADER_ALIGN
            buf = raw[skip : skip + need]
            self._tls.hdr = buf
        return buf

    def read(
        self, items: Sequence[BatchItem], epoch0: int
    ) -> tuple[list[bool], npt.NDArray[np.uint8], list[int], list[int]]:
        """``(done, headers, header checks, payload digests)`` for ``items`` (see the module doc).

        ``epoch0``: :meth:`epoch` as the caller saw it before it checked that the job was not
        abandoned; once the count differs, no further block is read (those answer ``False``).

        ``headers[i * header_len : (i + 1) * header_len]`` holds block ``i``'s header when
        ``done[i]``; the digests are meaningful only then (payload digests only with ``verify``).
        """
        n = len(items)
        located = [self._tree.cached_leaf(it.path) for it in items]
        leaf_fd = np.full(n, -1, dtype=np.int32)
        names: list[bytes | None] = [None] * n
        chk_n = np.zeros(2 * n, dtype=np.int32)
        chk_fd: list[int] = []
        chk_name: list[bytes] = []
        chk_ino: list[int] = []
        for i, loc in enumerate(located):
            if loc is None:
                continue  # not cached: the Python path walks the tree (status stays "redo")
            leaf_fd[i] = loc[0]
            names[i] = loc[1].encode()
            chk_n[2 * i], chk_n[2 * i + 1] = len(loc[2]), len(chk_fd)
            for parent, part, ino in loc[2]:
                chk_fd.append(parent)
                chk_name.append(part.encode())
                chk_ino.append(ino)
        todo = [i for i in range(n) if names[i] is not None]
        status = np.ones(n, dtype=np.uint8)
        hcheck = np.zeros(n, dtype=np.uint64)
        pcheck = np.zeros(n, dtype=np.uint64)
        hdr = self._headers(n)
        if todo:
            name_arr = (ctypes.c_char_p * n)(*names)
            cfd = np.asarray(chk_fd or [0], dtype=np.int32)
            cname = (ctypes.c_char_p * max(1, len(chk_name)))(*chk_name)
            cino = np.asarray(chk_ino or [0], dtype=np.uint64)
            dst = np.asarray([self._base + it.slot * self._stride for it in items], dtype=np.uint64)
            direct = np.asarray([it.direct for it in items], dtype=np.uint8)
            touch = np.asarray([it.touch for it in items], dtype=np.uint8)
            keys = b"".join(it.key for it in items)
            key_len = np.asarray([len(it.key) for it in items], dtype=np.int32)
            key_off = np.zeros(n, dtype=np.int64)
            np.cumsum(key_len[:-1], out=key_off[1:])
            keys_buf = ctypes.create_string_buffer(keys, max(1, len(keys)))
            tail = ctypes.create_string_buffer(self._tail, len(self._tail))
            self._fn(
                n, leaf_fd.ctypes.data, ctypes.addressof(name_arr), chk_n.ctypes.data, cfd.ctypes.data,
                ctypes.addressof(cname), cino.ctypes.data, hdr.ctypes.data, self.header_len,
                dst.ctypes.data, self.payload_len, direct.ctypes.data, touch.ctypes.data,
                ctypes.addressof(keys_buf), key_off.ctypes.data, key_len.ctypes.data,
                ctypes.addressof(tail), self._n_owners, self._owners.ctypes.data, int(self._verify),
                ctypes.addressof(self.abandon_epoch), epoch0, self._xxh3,
                status.ctypes.data, hcheck.ctypes.data, pcheck.ctypes.data,
            )  # fmt: skip
        return [s == 0 for s in status.tolist()], hdr, hcheck.tolist(), pcheck.tolist()
