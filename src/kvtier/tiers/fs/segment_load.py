"""Verified reads of the small-block path: records straight from segments into primary slots.

A chunk's blocks are sorted by (segment, offset); records that lie back to back (blocks stored
together) are read with one ``preadv`` whose iovecs alternate header buffers and the slots
themselves, so the payload is never copied in Python. Each record is then checked like a block
file: the header must be exactly the one this key, namespace, length and stored checksum give
(which covers magic, version, key, lengths, namespace and the header check), the MAC for a shared
root, and the payload checksum unless ``verify="never"``. A record that fails is counted in
``stats.corrupt`` and forgotten (its bytes are dead space until its segment is reclaimed); a
segment that vanished (reclaimed by another process) or is not a regular file of ours is a miss.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

from kvtier import codec
from kvtier.keys import BlockKey
from kvtier.tiers.async_tier import ChunkOutcome
from kvtier.tiers.fs.parts import FsParts
from kvtier.tiers.fs.safe import ForeignFileError
from kvtier.tiers.fs.segment_files import SegmentDir
from kvtier.tiers.fs.segment_index import SegmentName
from kvtier.tiers.fs.segment_map import SegmentMap
from kvtier.tiers.fs.trust import MAC_LEN

__all__ = ["SegmentReader"]

#: Records per ``preadv`` (two iovecs each, under the usual IOV_MAX of 1024).
_RUN_MAX = 256
_CSUM = slice(28, 36)  # the payload checksum's bytes in a codec header (see kvtier.codec)

Loc = tuple[SegmentName, int, int]


class SegmentReader:
    """Reads of the small-block path (worker threads); ``index.lock`` guards ``seg_map``.

    Args:
        parts: the tier's shared parts (name, layout, index, stats, log, MAC, the primary rows);
            with ``options.verify`` every payload checksum is checked (headers and MACs always).
        seg_map: where each block is. seg_dir: the segment files (cached read descriptors).
    """

    def __init__(self, parts: FsParts, seg_map: SegmentMap, seg_dir: SegmentDir) -> None:
        self.parts = parts
        self.map = seg_map
        self.dir = seg_dir
        self._lock = parts.index.lock

    def read_chunk(self, items: list[tuple[BlockKey, int]]) -> ChunkOutcome:
        """Fill each slot with its key's payload; keys that fail are left out of ``done``."""
        with self._lock:
            located = [(loc, key, slot) for key, slot in items if (loc := self.map.locs.get(key))]
            if len(located) != len(items):  # indexed yet not located (trimmed by the scan): stale
                found = {key for _, key, _ in located}
                for key, _ in items:
                    if key not in found and key in self.parts.index.sizes:
                        self.parts.index.forget_locked(key)
        ok: list[BlockKey] = []
        error = None if len(located) == len(items) else "missing"
        located.sort(key=lambda e: (e[0][0].stem, e[0][1]))
        i = 0
        while i < len(located):
            j = i + 1  # extend the run while the next record starts where this one ends
            while (
                j < len(located) and j - i < _RUN_MAX and located[j][0][0] == located[i][0][0]
                and located[j][0][1] == located[j - 1][0][1] + located[j - 1][0][2]
            ):  # fmt: skip
                j += 1
            for key, err in self._read_run(located[i:j]):
                if err is None:
                    ok.append(key)
                else:
                    error = error or err
            i = j
        with self._lock:
            self.parts.index.touch_locked(ok, time.time())
        return ChunkOutcome(ok, len(ok) * self.parts.block_bytes, error)

    def _read_run(self, run: list[tuple[Loc, BlockKey, int]]) -> list[tuple[BlockKey, str | None]]:
        """One ``preadv`` for back-to-back records; a short read falls back to one read each."""
        if len(run) == 1:
            loc, key, slot = run[0]
            return [(key, self._load_one(key, slot, loc))]
        name, rows, bb = run[0][0][0], self.parts.rows, self.parts.block_bytes
        try:
            fd = self.dir.acquire(name)
        except OSError:
            return [(key, self._load_one(key, slot, loc)) for loc, key, slot in run]  # attributes it
        try:
            heads = [bytearray(loc[2] - bb) for loc, _, _ in run]
            iov: list[bytearray | memoryview] = []
            for head, (_, _, slot) in zip(heads, run, strict=True):
                iov += (head, rows[slot, :bb].data)
            try:
                got = os.preadv(fd, iov, run[0][0][1])
            except OSError:
                got = -1
        finally:
            self.dir.release(name, fd)
        if got != sum(loc[2] for loc, _, _ in run):  # a torn or shrunken segment: find which
            return [(key, self._load_one(key, slot, loc)) for loc, key, slot in run]
        return [(key, self._checked(key, name, head, rows[slot, :bb].data))
                for head, (_, key, slot) in zip(heads, run, strict=True)]  # fmt: skip

    def _load_one(self, key: BlockKey, slot: int, loc: Loc, retry: bool = True) -> str | None:
        name, off, length = loc
        out = self.parts.rows[slot, : self.parts.block_bytes].data
        try:
            fd = self.dir.acquire(name)
        except ForeignFileError as exc:
            forget = functools.partial(self.map.drop_segment_locked, name)
            return self._bad("foreign", f"ignoring {exc.filename} ({exc.reason})", exc.reason, forget)
        except FileNotFoundError:
            with self._lock:
                now = self.map.locs.get(key)
                if now == loc:  # not compacted into another segment meanwhile: gone
                    self.map.forget_locked(key)
            if now is not None and now != loc and retry:
                return self._load_one(key, slot, now, False)
            return "missing"
        except OSError as exc:
            return f"read error: {exc.strerror or exc}"
        try:
            head = bytearray(length - self.parts.block_bytes)
            got = os.preadv(fd, [head, out], off)
        except OSError as exc:
            return f"read error: {exc.strerror or exc}"
        finally:
            self.dir.release(name, fd)
        if got != length:
            return self._corrupt(
                key, name, codec.CorruptBlockError("length", f"record is {got} B, not {length}")
            )
        return self._checked(key, name, head, out)

    def _checked(self, key: BlockKey, name: SegmentName, head: bytearray, out: memoryview) -> str | None:
        """``None`` if ``head`` + ``out`` is exactly ``key``'s block, else the reason (counted)."""
        bb = self.parts.block_bytes
        ns_tag = self.parts.layout.ns_tag
        csum = int.from_bytes(head[_CSUM], "little")
        end = codec.FIXED_HEADER_SIZE + len(key)
        try:
            if len(head) < end or head[:end] != codec.encode_header(key, bb, csum, ns_tag, len(head))[:end]:
                # Not the header this key's block has: let the codec say which field differs.
                codec.parse_header(head, expected_key=key, ns_tag=ns_tag, payload_len=bb)
                raise codec.CorruptBlockError("header", f"header length is not {len(head)}")
            mac = self.parts.mac
            if mac is not None and (
                len(head) < end + MAC_LEN or not mac.check(head[:end], out, bytes(head[end : end + MAC_LEN]))
            ):
                raise codec.CorruptBlockError("mac", "MAC does not verify (not written with this secret)")
            if self.parts.options.verify and codec.payload_checksum(key, ns_tag, out) != csum:
                raise codec.CorruptBlockError("checksum", "payload checksum mismatch")
        except codec.CorruptBlockError as exc:
            return self._corrupt(key, name, exc)
        return None

    def _corrupt(self, key: BlockKey, name: SegmentName, exc: codec.CorruptBlockError) -> str:
        forget = functools.partial(self.map.forget_locked, key)
        return self._bad(
            "corrupt", f"corrupt record in segment {name.stem} ({exc.reason})", exc.reason, forget
        )

    def _bad(self, kind: str, what: str, reason: str, forget: Callable[[], None]) -> str:
        """Log ``what`` (rate-limited by ``kind``), count a corrupt block and ``forget`` the bad
        record or segment (tier lock held); returns the chunk's error, ``"<kind>: <reason>"``."""
        self.parts.rlog.warning(kind, f"kvtier fs {self.parts.name}: {what}")
        with self._lock:
            self.parts.stats.corrupt += 1
            forget()
        return f"{kind}: {reason}"
