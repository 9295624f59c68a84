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
slot), and its header passed every check :func:`kvtier.codec.parse_header` makes for this key,
namespace and lengths (and, with ``verify``, its payload checksum matched): the block is loaded;
``False`` when it was read but the header or checksum disagrees (the caller parses the header in
Python, which names the corruption); ``None`` for anything else: the caller redoes that block on
its Python path, which classifies the failure as it always has (missing, foreign, corrupt, I/O
error). The C checks are the Python parser's, done where the GIL is not held; a block the C side
doubts is always judged by the Python side.

:func:`open_reader` gives ``None`` (the caller keeps its Python path) when no C compiler is found,
``KVTIER_FS_BATCHREAD=python`` is set, or the ``xxhash`` module exports no
``XXH3_64bits_withSeed``.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from kvtier import codec
from kvtier.tiers.fs.ccall import CCall
from kvtier.tiers.fs.layout import HEADER_ALIGN
from kvtier.tiers.fs.safe import SafeTree

__all__ = ["BatchItem", "BatchReader", "BlockFormat", "open_reader"]

_SOURCE = Path(__file__).with_name("batchread.c")
_P = ctypes.c_void_p
#: ``struct item`` and ``struct level`` of batchread.c.
_ITEM = struct.Struct("<iiiIIIBB6xQ")
_LEVEL = struct.Struct("<iIQ")
#: A block's status from the C call: loaded and verified (True), read but its header disagrees
#: (False: the caller names the corruption), not read (None: the caller's Python path reads it).
_STATUS: dict[int, bool | None] = {0: True, 2: False, 1: None}


class BatchItem(NamedTuple):
    """One block to read: its file, primary slot, key, whether to refresh its mtime, O_DIRECT."""

    path: str
    slot: int
    key: bytes
    touch: bool
    direct: bool


_I64 = ctypes.c_int64
# n, items, chk, blob, hdr, hlen, plen, tail, ns_tag, n_owners, owners, verify, abandon_epoch,
# epoch0, xxh3, out (see batchread.c)
_CALL = CCall(
    _SOURCE,
    "kvt_read_blocks",
    [_I64, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, _P, _I64, _I64, _P, ctypes.c_uint64,
     ctypes.c_int, _P, ctypes.c_int, _P, _I64, _P, _P],
    disable_env="KVTIER_FS_BATCHREAD",
)  # fmt: skip


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
    resolved = _CALL.get()
    if resolved is None or rows.ndim != 2 or not rows.flags.c_contiguous:
        return None
    fn, xxh3 = resolved
    return BatchReader(fn, xxh3, tree, rows, fmt)


class BatchReader:
    """Batched block reads of one fs tier (worker threads; each call uses its own buffers)."""

    def __init__(
        self, fn: Callable[..., int], xxh3: int, tree: SafeTree, rows: npt.NDArray[np.uint8], fmt: BlockFormat
    ) -> None:
        self._fn, self._xxh3, self._tree = fn, xxh3, tree
        self._base, self._stride = rows.ctypes.data, rows.strides[0]
        self.header_len, self.payload_len = fmt.header_len, fmt.payload_len
        self._ns_tag = fmt.ns_tag
        self._tail = ctypes.create_string_buffer(
            codec.payload_seed_tail(fmt.ns_tag, fmt.payload_len), 16
        )  # fmt: skip
        self._verify = int(fmt.verify)
        owner_list = sorted(fmt.owners) if fmt.owners is not None else []
        self._owners = (ctypes.c_int64 * max(1, len(owner_list)))(*owner_list)
        self._n_owners = -1 if fmt.owners is None else len(owner_list)
        #: Bumped by :meth:`note_abandon`; a call that sees it move stops before its next read.
        self.abandon_epoch = ctypes.c_int64(0)
        # Addresses of what every call passes unchanged (taken once: ``addressof`` is not free).
        self._fixed = (ctypes.addressof(self._tail), self._n_owners, ctypes.addressof(self._owners),
                       self._verify, ctypes.addressof(self.abandon_epoch))  # fmt: skip
        self._tls = threading.local()

    def note_abandon(self) -> None:
        """A job was given up: reads in progress stop before touching another slot."""
        self.abandon_epoch.value += 1

    def epoch(self) -> int:
        """The abandon count now: read it before checking a job's flag, pass it to :meth:`read`."""
        return int(self.abandon_epoch.value)

    def _headers(self, n: int) -> tuple[npt.NDArray[np.uint8], int]:
        """This thread's page-aligned header buffer of ``n`` headers (O_DIRECT reads need it) and
        its address."""
        need = n * self.header_len
        got: tuple[npt.NDArray[np.uint8], int] | None = getattr(self._tls, "hdr", None)
        if got is None or got[0].size < need:
            raw = np.empty(need + HEADER_ALIGN, dtype=np.uint8)
            skip = -raw.ctypes.data % HEADER_ALIGN
            buf = raw[skip : skip + need]
            got = self._tls.hdr = (buf, buf.ctypes.data)
        return got

    def read(
        self, items: Sequence[BatchItem], epoch0: int
    ) -> tuple[list[bool | None], npt.NDArray[np.uint8], list[int], list[int]]:
        """``(done, headers, header checks, payload digests)`` for ``items`` (see the module doc).

        ``epoch0``: :meth:`epoch` as the caller saw it before it checked that the job was not
        abandoned; once the count differs, no further block is read (those answer ``None``).

        ``headers[i * header_len : (i + 1) * header_len]`` holds block ``i``'s header when
        ``done[i]`` is not ``None``; the digests are meaningful only then (payload digests only
        with ``verify``).
        """
        n = len(items)
        located = self._tree.cached_leaf
        pack_item, pack_level = _ITEM.pack, _LEVEL.pack
        base, stride = self._base, self._stride
        recs: list[bytes] = []
        levels: list[bytes] = []
        blob: list[bytes] = []
        off = 0
        todo = 0
        for it in items:
            loc = located(it.path)
            if loc is None:  # not cached: the Python path walks the tree (status stays "redo")
                recs.append(pack_item(-1, 0, 0, 0, 0, 0, 0, 0, 0))
                continue
            todo += 1
            first = len(levels)
            for parent, part, ino in loc[2]:
                name = part.encode() + b"\0"
                levels.append(pack_level(parent, off, ino))
                blob.append(name)
                off += len(name)
            name = loc[1].encode() + b"\0"
            blob.append(name)
            blob.append(it.key)
            recs.append(pack_item(
                loc[0], len(loc[2]), first, off, off + len(name), len(it.key), it.direct, it.touch,
                base + it.slot * stride,
            ))  # fmt: skip
            off += len(name) + len(it.key)
        hdr, hdr_addr = self._headers(n)
        out = (ctypes.c_uint64 * (3 * n))()
        if not todo:
            return [None] * n, hdr, [0] * n, [0] * n
        tail, n_owners, owners, verify, epoch = self._fixed
        self._fn(
            n, b"".join(recs), b"".join(levels), b"".join(blob), hdr_addr, self.header_len,
            self.payload_len, tail, self._ns_tag, n_owners, owners, verify, epoch, epoch0, self._xxh3, out,
        )  # fmt: skip
        res = out[:]
        return [_STATUS[s] for s in res[0::3]], hdr, res[1::3], res[2::3]
