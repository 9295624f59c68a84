"""Writing and reading one block file (the fs tier's per-block syscalls, kept apart and testable).

A block file is a :mod:`kvtier.codec` blob whose header is padded to 4096 bytes, so the payload
starts on a page boundary: it is written straight from the primary slot (``pwritev`` of header +
slot, ``O_DIRECT`` when allowed) and read straight into it (``preadv``), never copied in Python.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading

import numpy as np
import numpy.typing as npt

from kvtier import codec
from kvtier.tiers.fs.layout import HEADER_ALIGN
from kvtier.tiers.fs.trust import MAC_LEN, BlockMac

__all__ = ["SlotAlignment", "fsync_dir", "read_block", "write_block"]

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_tls = threading.local()


class SlotAlignment:
    """Which primary slots start on a page boundary (``O_DIRECT`` needs page-aligned memory).

    Checked once for the whole buffer when its base address and row stride are page multiples
    (every slot is then aligned: no per-block ``ndarray.ctypes``, which costs a few microseconds);
    otherwise slot by slot."""

    def __init__(self, rows: npt.NDArray[np.uint8]) -> None:
        self._rows = rows
        base = rows.ctypes.data if rows.size else 0
        self.all_aligned = base % HEADER_ALIGN == 0 and rows.strides[0] % HEADER_ALIGN == 0

    def aligned(self, slot: int) -> bool:
        """Whether slot ``slot`` (a row of the buffer) starts on a page boundary."""
        return self.all_aligned or self._rows[slot].ctypes.data % HEADER_ALIGN == 0


def _aligned_buffer(name: str, n: int) -> memoryview:
    """A page-aligned buffer of ``n`` bytes (O_DIRECT needs aligned memory), one per thread and use."""
    buf: mmap.mmap | None = getattr(_tls, name, None)
    if buf is None or len(buf) < n:
        buf = mmap.mmap(-1, max(HEADER_ALIGN, n))
        setattr(_tls, name, buf)
    return memoryview(buf)[:n]


def _aligned_header(head: bytes) -> memoryview:
    """Page-aligned copy of ``head`` (for an O_DIRECT write)."""
    view = _aligned_buffer("hbuf", len(head))
    view[:] = head
    return view


def write_block(
    path: str,
    key: bytes,
    payload: memoryview,
    ns_tag: int,
    *,
    direct: bool,
    fsync: bool,
    dir_fd: int | None = None,
    mac: BlockMac | None = None,
) -> None:
    """Create ``path`` (must not exist; relative to ``dir_fd`` when given) holding ``key``'s blob;
    raises ``OSError`` on failure. ``O_EXCL | O_NOFOLLOW``: never writes through a planted link.
    With ``mac`` (a shared root) the block's MAC goes into the header padding right after the key.

    ``direct`` opens with ``O_DIRECT``; the caller passes it only when the payload address and
    length are page multiples (otherwise the write is buffered: same bytes, same file).
    """
    n = payload.nbytes
    head = codec.encode_header(key, n, codec.payload_checksum(key, ns_tag, payload), ns_tag, HEADER_ALIGN)
    if mac is not None:
        head = _with_mac(head, len(key), payload, mac)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_CLOEXEC | (_O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o600, dir_fd=dir_fd)
    try:
        want = len(head) + n
        done = os.pwritev(fd, [_aligned_header(head) if direct else head, payload], 0)
        if done != want:  # short write (not seen on local file systems): finish it plainly
            whole = head + payload.tobytes()
            while done < want:
                done += os.pwrite(fd, whole[done:], done)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _mac_span(key_len: int, hlen: int) -> int:
    """Offset of the MAC in a header of ``hlen`` bytes (fixed part + key first)."""
    off = codec.FIXED_HEADER_SIZE + key_len
    if off + MAC_LEN > hlen:
        raise OSError(errno.EINVAL, f"a {key_len}-byte key leaves no room for the MAC in the header")
    return off


def _with_mac(head: bytes, key_len: int, payload: memoryview, mac: BlockMac) -> bytes:
    off = _mac_span(key_len, len(head))
    return head[:off] + mac.tag(head[:off], payload) + head[off + MAC_LEN :]


def read_block(
    fd: int,
    key: bytes,
    out: memoryview,
    ns_tag: int,
    *,
    verify: bool,
    size: int,
    direct: bool = False,
    mac: BlockMac | None = None,
) -> int:
    """Fill ``out`` with ``key``'s payload from open block file ``fd`` of ``size`` bytes (its
    ``fstat`` size) and return the file size.

    ``fd`` comes from :meth:`~kvtier.tiers.fs.safe.SafeTree.open_block` (checked regular file, its
    size known; the caller closes it). ``direct``: ``fd`` was opened with ``O_DIRECT`` (the caller
    checked that ``out``'s address and length are page multiples); the header is then read into a
    page-aligned per-thread buffer. Either way the header and the payload come in one ``preadv``
    straight into their buffers. Raises :class:`~kvtier.codec.CorruptBlockError` (the file is not
    exactly this key's block of this namespace: wrong length, header, key, namespace or checksum;
    ``out`` then holds garbage) or another ``OSError`` (I/O error).
    """
    n = out.nbytes
    hlen = codec.header_size(len(key), HEADER_ALIGN)
    if size != hlen + n:
        what = "shorter" if size < hlen + n else "longer"
        raise codec.CorruptBlockError("length", f"file is {what} ({size} bytes), expected {hlen + n} bytes")
    hbuf = _aligned_buffer("rbuf", hlen) if direct else bytearray(hlen)
    got = os.preadv(fd, [hbuf, out], 0)
    if got != hlen + n:  # changed under us (files are never rewritten in place): not this block
        raise codec.CorruptBlockError("length", f"read {got} bytes, expected {hlen + n} bytes")
    head = bytes(hbuf[:hlen]) if direct else hbuf
    header = codec.parse_header(head, expected_key=key, ns_tag=ns_tag, payload_len=n)
    if header.header_len != hlen:
        raise codec.CorruptBlockError("header", f"header length {header.header_len}, expected {hlen}")
    if mac is not None:  # a shared root: authenticated whatever ``verify`` says
        try:
            off = _mac_span(len(key), hlen)
        except OSError as exc:
            raise codec.CorruptBlockError("mac", str(exc)) from exc
        if not mac.check(head[:off], out, bytes(head[off : off + MAC_LEN])):
            raise codec.CorruptBlockError("mac", "MAC does not verify (not written with this secret)")
    if verify:
        codec.verify_payload(header, out)
    return got


def fsync_dir(path: str) -> None:
    """Make renames into ``path`` durable (best effort: some file systems refuse directory fsync)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
