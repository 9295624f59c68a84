"""One foreign call per chunk of fs stores: the checksums, headers and temp-file writes of many
blocks, made without the GIL (``batchwrite.c``, compiled on first use by :mod:`kvtier.native`).

Why: writing one block from Python is ~5 calls that each release and retake the GIL (checksum,
``open``, ``pwritev``, ``close``) plus ~10 us of header encoding under it; on a machine whose
cores are busy, or in an engine whose loop holds the GIL between steps, every retake is a wait.
The load side has the same twin (:mod:`.batchread`).

Contract of :meth:`BatchWriter.write`: for each ``(dir_fd, name, slot, key, direct)`` it creates
``name`` in directory ``dir_fd`` (a shard of the tier's ``tmp/``; ``O_CREAT | O_EXCL | O_NOFOLLOW``,
mode 0600, ``O_DIRECT``
when ``direct``) holding exactly the bytes :func:`~kvtier.tiers.fs.io.write_block` writes (the
:mod:`kvtier.codec` header padded to 4096 bytes, then the slot's payload), and answers ``0``, or
the ``errno`` of the step that failed (the caller then removes the temp file and gives the
reservation back, as for a failed Python write). Everything else (reservation, publication,
the journal) stays with the caller, so crash safety is unchanged: a temp file is only ever named
``<token>.<seq>`` in a shard of ``tmp/`` (:mod:`.temps`) and becomes a block by the caller's journaled
rename.

:func:`open_writer` gives ``None`` (the caller keeps its Python path) when no C compiler is found,
``KVTIER_FS_BATCHWRITE=python`` is set, or the ``xxhash`` module exports no
``XXH3_64bits_withSeed``. A shared root's blocks carry a MAC: the caller keeps them on Python.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from kvtier import codec
from kvtier.tiers.fs.ccall import CCall
from kvtier.tiers.fs.layout import HEADER_ALIGN

__all__ = ["BatchWriter", "WriteItem", "open_writer"]

_SOURCE = Path(__file__).with_name("batchwrite.c")
_P = ctypes.c_void_p
#: ``struct item`` of batchwrite.c.
_ITEM = struct.Struct("<IIIiB7xQ")


class WriteItem(NamedTuple):
    """One block to write: its temp file's directory and name, primary slot, key, O_DIRECT."""

    dir_fd: int
    name: str
    slot: int
    key: bytes
    direct: bool


_I64 = ctypes.c_int64
# n, items, blob, hlen, plen, ns_tag, tail, fsync, xxh3, err (see batchwrite.c)
_CALL = CCall(
    _SOURCE,
    "kvt_write_blocks",
    [_I64, ctypes.c_char_p, ctypes.c_char_p, _I64, _I64, ctypes.c_uint64, _P,
     ctypes.c_int, _P, _P],
    disable_env="KVTIER_FS_BATCHWRITE",
)  # fmt: skip


def open_writer(
    rows: npt.NDArray[np.uint8], *, payload_len: int, ns_tag: int, fsync: bool
) -> BatchWriter | None:
    """A writer for one fs tier's stores (see the module doc), or ``None`` where there is none."""
    resolved = _CALL.get()
    if resolved is None or rows.ndim != 2 or not rows.flags.c_contiguous:
        return None
    fn, xxh3 = resolved
    return BatchWriter(fn, xxh3, rows, payload_len=payload_len, ns_tag=ns_tag, fsync=fsync)


class BatchWriter:
    """Batched temp-file writes of one fs tier (worker threads; no state shared between calls)."""

    def __init__(
        self, fn: Callable[..., int], xxh3: int, rows: npt.NDArray[np.uint8], *,
        payload_len: int, ns_tag: int, fsync: bool,
    ) -> None:  # fmt: skip
        self._fn, self._xxh3 = fn, xxh3
        self._base, self._stride = rows.ctypes.data, rows.strides[0]
        self.payload_len, self._ns_tag, self._fsync = payload_len, ns_tag, int(fsync)
        self._tail = ctypes.create_string_buffer(codec.payload_seed_tail(ns_tag, payload_len), 16)
        self._tail_addr = ctypes.addressof(self._tail)

    def write(self, items: Sequence[WriteItem]) -> list[int]:
        """Per item ``0`` (written) or the ``errno`` of the failed step (see the module doc).

        Every key must have the same header length (``codec.header_size(len(key), 4096)``: 4096
        for any key under 4,056 bytes); the caller writes other keys on its Python path."""
        n = len(items)
        if not n:
            return []
        hlen = codec.header_size(len(items[0].key), HEADER_ALIGN)
        pack, base, stride = _ITEM.pack, self._base, self._stride
        recs: list[bytes] = []
        blob: list[bytes] = []
        off = 0
        for it in items:
            name = it.name.encode() + b"\0"
            blob.append(name)
            blob.append(it.key)
            src = base + it.slot * stride
            recs.append(pack(off, off + len(name), len(it.key), it.dir_fd, it.direct, src))
            off += len(name) + len(it.key)
        err = (ctypes.c_int64 * n)()
        self._fn(
            n, b"".join(recs), b"".join(blob), hlen, self.payload_len, self._ns_tag,
            self._tail_addr, self._fsync, self._xxh3, err,
        )  # fmt: skip
        return err[:]
