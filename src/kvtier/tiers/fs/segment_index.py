"""On-disk shapes of the fs tier's small-block path: segment names and index records.

Small blocks live in append-only *segments* under ``<ns>/seg/`` (see
:mod:`kvtier.tiers.fs.segments`). Each segment is two files with one stem::

    <token>.<seq>.<cap>.dat   records: a kvtier.codec header (key, lengths, xxh3-64, MAC) + payload
    <token>.<seq>.<cap>.idx   index records, appended after the data they describe was written

``token`` is the writer's process token (``<pid>-<8 hex>``), ``seq`` its segment number, ``cap`` the
bytes the segment may grow to (what it counts against ``max_bytes``). Any other name in ``seg/`` is
not ours: never opened, never removed.

An index record is ``magic "KSI1" | key_len u16 | length u32 | offset u64 | key | xxh3-64`` (the
checksum covers everything before it). A record of key length 0 is the *seal*: the writer appends
nothing to that segment any more. :func:`decode_records` returns the longest valid prefix, so a tail
torn by a crash (or still being written by another process) is simply not read yet; nothing after
a damaged record is trusted.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import NamedTuple

import xxhash

__all__ = [
    "SEAL",
    "SEAL_BYTES",
    "SEG_DIR",
    "IndexRecord",
    "SegmentName",
    "decode_records",
    "encode_record",
    "idx_bytes",
    "parse_name",
]

SEG_DIR = "seg"
_MAGIC = b"KSI1"
_FIXED = struct.Struct("<4sHIQ")
_SUM = struct.Struct("<Q")
MAX_KEY = 0xFFFF
MAX_LENGTH = 0xFFFFFFFF
_NAME = re.compile(r"\A([0-9]{1,10}-[0-9a-f]{8})\.([0-9]{1,12})\.([0-9]{1,15})\.(dat|idx)\Z")


@dataclass(frozen=True, slots=True, order=True)
class SegmentName:
    """The stem of one segment's two files (``<token>.<seq>.<cap>``)."""

    seq: int
    token: str
    cap: int

    @property
    def stem(self) -> str:
        return f"{self.token}.{self.seq}.{self.cap}"

    @property
    def dat(self) -> str:
        return f"{self.stem}.dat"

    @property
    def idx(self) -> str:
        return f"{self.stem}.idx"


def parse_name(name: str) -> tuple[SegmentName, str] | None:
    """``(segment, "dat" | "idx")`` for a file name of the fixed shape, else ``None`` (not ours)."""
    m = _NAME.match(name)
    if m is None:
        return None
    token, seq, cap, kind = m.groups()
    if int(cap) <= 0:
        return None
    return SegmentName(int(seq), token, int(cap)), kind


class IndexRecord(NamedTuple):
    """One block of a segment: ``key`` is at ``offset`` in the ``.dat`` file, ``length`` bytes
    (header + payload). ``key == b""`` is the seal record (offset and length 0). A tuple: a restart
    decodes one per block."""

    key: bytes
    offset: int
    length: int


SEAL = IndexRecord(b"", 0, 0)


def idx_bytes(key_len: int) -> int:
    """Bytes of the index record of a key of ``key_len`` bytes."""
    return _FIXED.size + key_len + _SUM.size


#: Bytes of the seal record (reserved in every segment's cap from the start).
SEAL_BYTES = _FIXED.size + _SUM.size


def encode_record(rec: IndexRecord) -> bytes:
    """The bytes of one index record (raises ``ValueError`` for out-of-range fields)."""
    if len(rec.key) > MAX_KEY or not 0 <= rec.length <= MAX_LENGTH or not 0 <= rec.offset < 1 << 63:
        raise ValueError(f"index record out of range: key {len(rec.key)} B, length {rec.length}")
    body = _FIXED.pack(_MAGIC, len(rec.key), rec.length, rec.offset) + rec.key
    return body + _SUM.pack(xxhash.xxh3_64_intdigest(body))


def decode_records(data: bytes | bytearray | memoryview) -> tuple[list[IndexRecord], int]:
    """The longest valid prefix of ``data`` as records, and the bytes it spans.

    Decoding stops at the first record that is incomplete (a torn or in-flight tail: read again
    later from the returned offset) or damaged (bad magic or checksum: nothing after it is trusted).
    """
    buf = bytes(data)
    out: list[IndexRecord] = []
    pos = 0
    end = len(buf)
    fixed, total = _FIXED.size, _FIXED.size + _SUM.size
    unpack, unsum, digest = _FIXED.unpack_from, _SUM.unpack_from, xxhash.xxh3_64_intdigest
    while pos + total <= end:
        magic, klen, length, offset = unpack(buf, pos)
        stop = pos + fixed + klen
        if magic != _MAGIC or stop + _SUM.size > end:
            break
        if digest(buf[pos:stop]) != unsum(buf, stop)[0]:
            break
        out.append(IndexRecord(buf[pos + fixed : stop], offset, length))
        pos = stop + _SUM.size
    return out, pos
