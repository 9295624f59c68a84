"""The fs tier's small-block path: blocks packed into append-only segments (docs/fs.md, "Small blocks").

A tier whose ``block_bytes`` is at most ``small_block_bytes`` keeps its blocks in segments under
``<ns>/seg/`` instead of one file each (names and record shapes: :mod:`~.segment_index`):

* **Store.** A chunk's records (codec header with checksum and, for a shared root, MAC; then the
  payload) get their offsets in this process's *active* segment under a thread lock, are written
  with one ``pwritev`` (no lock held), and only then described by index records appended to the
  segment's ``.idx`` in one ``write``. A block is indexed (and reported stored) after both.
* **Crash safety.** A process killed mid-write leaves data without an index record (never read) or
  a torn index tail (not decoded); a record whose data did not reach the disk fails its header or
  checksum on load: a miss, never a wrong byte. The index is the ``.idx`` files: a restart decodes
  them (the longest valid prefix of each).
* **Capacity.** Every segment counts its full ``cap`` against ``max_bytes`` from the moment it is
  created; segments are created and removed only inside the shared accounting section, after
  listing ``seg/``, so the files themselves are the ledger (no counter can drift, whatever dies).
* **Eviction by segment.** When a new segment would not fit, the configured policy evicts blocks
  logically until a sealed segment's live bytes fit in half a segment; that segment's live blocks
  are copied into the new one (compaction) and its files are removed.
* **Sharing.** Other processes' segments are found by listing ``seg/`` and their ``.idx`` tails are
  read every ``refresh_interval`` (and on :meth:`refresh`); a segment another process removed is
  forgotten. A segment is *sealed* (may be compacted by anyone) once its writer appended the seal
  record or died; a live writer's active segment is never touched by another process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvtier import codec
from kvtier.errors import KvtierError
from kvtier.keys import BlockKey
from kvtier.tiers.async_tier import ChunkOutcome, JobState
from kvtier.tiers.fs.parts import FsParts
from kvtier.tiers.fs.safe import ForeignFileError
from kvtier.tiers.fs.segment_files import SegmentDir
from kvtier.tiers.fs.segment_index import (
    SEAL,
    SEAL_BYTES,
    IndexRecord,
    SegmentName,
    decode_records,
    encode_record,
    idx_bytes,
)
from kvtier.tiers.fs.segment_load import SegmentReader
from kvtier.tiers.fs.segment_map import SegmentMap
from kvtier.tiers.fs.trust import MAC_LEN

__all__ = ["SegmentStore", "record_size"]

#: Header alignment of a record (the MAC needs 16 bytes of padding after the key).
_ALIGN = 64
_IOV_MAX = 512
_READ_CHUNK = 1 << 20


def record_size(key_len: int, block_bytes: int, mac: bool) -> int:
    """Bytes of one record: the codec header (room for a MAC after the key when ``mac``) + payload."""
    align = _ALIGN
    while mac and codec.header_size(key_len, align) < codec.FIXED_HEADER_SIZE + key_len + MAC_LEN:
        align *= 2
    return codec.header_size(key_len, align) + block_bytes


class _NoRoom(KvtierError):
    """No sealed segment can be reclaimed: the store is dropped."""


@dataclass(slots=True)
class _Active:
    """A segment this process appends to (guarded by the write lock)."""

    name: SegmentName
    wfd: int
    ifd: int
    size: int = 0  # data bytes (the next record's offset)
    used: int = SEAL_BYTES  # data + index bytes, counted against the cap (the seal is reserved)
    writers: int = 0
    retired: bool = False


class SegmentStore:
    """Store, load, eviction and sharing of small blocks in segments (see the module doc).

    Args:
        parts: the tier's shared parts; ``index.lock`` guards the index, the stats and this
            store's maps. Of its options: ``max_bytes`` bounds the segments, ``fsync`` syncs data,
            then index, before a store is reported, ``verify`` checks payload checksums on load,
            ``full_backoff`` pauses the store gate on ``ENOSPC``.
        segment_bytes: the cap of new segments.
        owners: uids whose files count as ours (``None``: a shared root).
    """

    def __init__(self, parts: FsParts, *, segment_bytes: int, owners: frozenset[int] | None) -> None:
        self.parts = parts
        self.segment_bytes = segment_bytes
        self._lock = parts.index.lock
        self._headers = codec.HeaderMaker(parts.layout.ns_tag, parts.block_bytes, _ALIGN)
        self._token = parts.accounting.token
        self.dir = SegmentDir(parts.layout.ns_dir, owners)
        #: Where each small block is (tier lock).
        self.map = SegmentMap(parts, self.dir)
        self.reader = SegmentReader(parts, self.map, self.dir)
        self._wlock = threading.Lock()
        self._active: _Active | None = None
        #: Our segments still written to (the active one, retired ones with writes in flight).
        self._unsealed: set[SegmentName] = set()
        self._seq = 0
        self._refresh_lock = threading.Lock()
        self.compactions = 0  #: segments reclaimed
        self.carried = 0  #: live blocks copied by compaction
        self._stop = threading.Event()
        with parts.accounting.section():
            self._remove_orphans()
            self.refresh()  # the warm restart: every .idx decoded before the tier answers lookups
        self._thread = threading.Thread(target=self._poll, name=f"kvtier-fs-seg-{parts.name}", daemon=True)
        self._thread.start()

    # -- store (worker threads) -----------------------------------------------------------------------
    def admit_locked(self, state: JobState) -> None:
        """Keep only the blocks to write (tier lock held)."""
        index = self.parts.index
        items: list[tuple[BlockKey, int]] = []
        for key, slot in state.items:
            if key in index.sizes or key in index.storing:
                state.ok.add(key)
                if key in index.policy:
                    index.policy.touch(key)
                continue
            index.storing.add(key)
            items.append((key, slot))
        state.items = items

    def finish(self, state: JobState, report: Callable[[JobState], None]) -> None:
        """After the last chunk: no key of the job is in flight any more (even if a chunk raised
        before writing it), then ``report`` the job."""
        with self._lock:
            for key, _ in state.items:
                self.parts.index.storing.discard(key)
        report(state)

    def _header(self, key: bytes, payload: memoryview) -> bytes:
        n = self.parts.block_bytes
        ns_tag = self.parts.layout.ns_tag
        mac = self.parts.mac
        if mac is None:  # the common case, in a third of the calls (record_size: _ALIGN padding)
            return self._headers(key, payload)
        hlen = record_size(len(key), n, True) - n
        cs = codec.payload_checksum(key, ns_tag, payload)
        head = codec.encode_header(key, n, cs, ns_tag, hlen)  # hlen is a multiple of itself
        if mac is not None:
            off = codec.FIXED_HEADER_SIZE + len(key)
            head = head[:off] + mac.tag(head[:off], payload) + head[off + MAC_LEN :]
        return head

    def write_chunk(self, state: JobState, items: list[tuple[BlockKey, int]]) -> ChunkOutcome:
        """Append the chunk's records to the active segment(s), then index them."""
        try:
            done, error = self._write_items(items)
        finally:
            with self._lock:
                for key, _ in items:
                    self.parts.index.storing.discard(key)
        return ChunkOutcome(done, self.parts.block_bytes * len(done), error)

    def write_jobs(self, states: list[JobState]) -> list[ChunkOutcome]:
        """Write several whole store jobs as one batch (one ``pwritev`` and one index append per
        segment they land in): each job's outcome, in order. The caller settles the jobs
        (``storing``, stats, report) afterwards (:class:`~.segment_queue.StoreQueue`)."""
        items = [item for state in states for item in state.items]
        done, error = self._write_items(items)
        ok = set(done)
        bb = self.parts.block_bytes
        out = []
        for state in states:
            mine = [key for key, _ in state.items if key in ok]
            out.append(ChunkOutcome(mine, bb * len(mine), None if len(mine) == len(state.items) else error))
        return out

    def _write_items(self, items: list[tuple[BlockKey, int]]) -> tuple[list[BlockKey], str | None]:
        """Append the records of ``items`` and index them: (keys stored, the error that stopped
        the rest). ``storing`` is left to the caller."""
        rows, bb = self.parts.rows, self.parts.block_bytes
        recs = [(key, self._header(key, rows[slot, :bb].data), rows[slot, :bb].data)
                for key, slot in items]  # fmt: skip
        done: list[BlockKey] = []
        error: str | None = None
        pos = 0
        try:
            while pos < len(recs):
                seg, off, n = self._allocate([(len(h) + bb, idx_bytes(len(k))) for k, h, _ in recs[pos:]])
                try:
                    placed = self._append(seg, off, recs[pos : pos + n])
                finally:
                    self._end_write(seg)
                with self._lock:
                    now = time.time()
                    for key, o, length in placed:
                        self.map.place_locked(key, seg.name, o, length, now)
                done += [k for k, _, _ in placed]
                pos += n
        except _NoRoom:
            error = "capacity: no sealed segment to reclaim (stores dropped)"
            with self._lock:
                self.parts.stats.dropped_stores += len(recs) - pos
        except OSError as exc:
            error = self._failed(exc)
        return done, error

    def _append(
        self, seg: _Active, off: int, recs: list[tuple[BlockKey, bytes, memoryview]]
    ) -> list[tuple[BlockKey, int, int]]:
        bb = self.parts.block_bytes
        iov: list[bytes | memoryview] = []
        placed: list[tuple[BlockKey, int, int]] = []
        o = off
        for key, head, payload in recs:
            iov += (head, payload)
            placed.append((key, o, len(head) + bb))
            o += len(head) + bb
        _pwrite_all(seg.wfd, iov, off)
        if self.parts.options.fsync:
            os.fdatasync(seg.wfd)  # the data is durable before an index record can point at it
        os.write(seg.ifd, b"".join(encode_record(IndexRecord(k, o_, n)) for k, o_, n in placed))
        if self.parts.options.fsync:
            os.fdatasync(seg.ifd)
        return placed

    def _allocate(self, sizes: list[tuple[int, int]]) -> tuple[_Active, int, int]:
        """Offsets for the longest prefix of ``sizes`` (data, index bytes of each record) whose
        data and index records fit the active segment's cap (rolled over when even the first
        does not fit): ``(segment, offset, count)``."""
        with self._wlock:
            seg = self._active
            if seg is None or seg.used + sum(sizes[0]) > seg.name.cap:
                seg = self._roll()
            n, data, total = 0, 0, 0
            for d, i in sizes:
                if seg.used + total + d + i > seg.name.cap:
                    break
                n, data, total = n + 1, data + d, total + d + i
            if n == 0:  # a record larger than a segment (the options forbid it)
                raise _NoRoom
            off = seg.size
            seg.size += data
            seg.used += total
            seg.writers += 1
            return seg, off, n

    def _end_write(self, seg: _Active) -> None:
        with self._wlock:
            seg.writers -= 1
            if seg.retired and seg.writers == 0:
                self._seal(seg)

    def _seal(self, seg: _Active) -> None:
        """No more appends to ``seg`` (write lock held): the seal record, then close its files."""
        with contextlib.suppress(OSError):
            os.write(seg.ifd, encode_record(SEAL))
        for fd in (seg.wfd, seg.ifd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._unsealed.discard(seg.name)
        with self._lock:
            known = self.map.segs.get(seg.name)
            if known is not None:
                known.sealed = True

    # -- roll-over, eviction by segment, compaction (write lock held) -------------------------------
    def _roll(self) -> _Active:
        """Retire the active segment and create the next one, reclaiming segments first when the
        new one would not fit under ``max_bytes`` (all inside the shared accounting section)."""
        old = self._active
        if old is not None:
            old.retired = True
            if old.writers == 0:
                self._seal(old)
        self._active = None
        carry: list[tuple[BlockKey, bytes]] = []
        with self.parts.accounting.section():
            self.refresh()
            listing = self.dir.listing()
            limit = self.parts.options.max_bytes
            if limit is not None:
                used = sum(n.cap for n in listing)
                while used + self.segment_bytes > limit:
                    victim = self._pick_victim(set(listing), sum(len(b) for _, b in carry))
                    carry += self._reclaim(victim)
                    listing.pop(victim, None)
                    used -= victim.cap
            name = SegmentName(self._seq, self._token, self.segment_bytes)
            self._seq += 1
            wfd = self.dir.open(name.dat, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            try:
                ifd = self.dir.open(name.idx, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND)
            except BaseException:
                os.close(wfd)
                self.dir.unlink(name.dat)
                raise
            seg = _Active(name, wfd, ifd)
            self._unsealed.add(name)
            with self._lock:
                self.map.segs[name] = SegmentMap.new_seg(name)
            self._active = seg
            if carry:
                self._write_carry(seg, carry)
        return seg

    def _write_carry(self, seg: _Active, carry: list[tuple[BlockKey, bytes]]) -> None:
        _pwrite_all(seg.wfd, [b for _, b in carry], 0)
        placed, off = [], 0
        for key, blob in carry:
            placed.append((key, off, len(blob)))
            off += len(blob)
        if self.parts.options.fsync:
            os.fdatasync(seg.wfd)
        os.write(seg.ifd, b"".join(encode_record(IndexRecord(k, o, n)) for k, o, n in placed))
        seg.size = off
        seg.used += off + sum(idx_bytes(len(k)) for k, _ in carry)
        with self._lock:
            now = time.time()
            for key, o, n in placed:
                if key in self.parts.index.sizes:
                    self.map.place_locked(key, seg.name, o, n, now)
            self.carried += len(placed)

    def _sealed(self, name: SegmentName) -> bool:
        if name.token == self._token:
            return name not in self._unsealed
        known = self.map.segs.get(name)
        return (known is not None and known.sealed) or not self.parts.accounting.is_alive(name.token)

    def _pick_victim(self, present: set[SegmentName], carried: int) -> SegmentName:
        """The sealed segment to reclaim: fewest live bytes (oldest first on ties), after the
        policy evicted blocks until its live bytes fit in an eighth of a segment (less what is carried)."""
        budget = max(0, self.segment_bytes // 8 - carried)
        candidates = [n for n in present if self._sealed(n)]
        if not candidates:
            raise _NoRoom
        batch = max(1, self.segment_bytes // (4 * record_size(16, self.parts.block_bytes, False)))
        while True:
            with self._lock:
                victim = min(candidates, key=lambda n: (self.map.live_locked(n), n.seq))
                if self.map.live_locked(victim) <= budget:
                    return victim
                if not self.map.evict_locked(batch):
                    # Nothing the policy may evict (all busy): drop the victim's oldest blocks.
                    seg = self.map.segs[victim]
                    order = sorted(seg.keys, key=lambda k: self.parts.index.access.get(k, 0.0))
                    while order and seg.live > budget:
                        self.map.forget_locked(order.pop(0), evicted=True)

    def _reclaim(self, victim: SegmentName) -> list[tuple[BlockKey, bytes]]:
        """Read ``victim``'s live records, remove its files; the records to copy (checked header)."""
        with self._lock:
            seg = self.map.segs.get(victim)
            live = [] if seg is None else [(k, *self.map.locs[k][1:]) for k in seg.keys if k in self.map.locs]
        carry: list[tuple[BlockKey, bytes]] = []
        if live:
            data = b""
            with contextlib.suppress(OSError):
                fd = self.dir.open(victim.dat, os.O_RDONLY)
                try:
                    data = _read_all(fd, 0)
                finally:
                    os.close(fd)
            for key, off, n in live:
                blob = data[off : off + n]
                try:
                    codec.parse_header(blob, expected_key=key, ns_tag=self.parts.layout.ns_tag,
                                       payload_len=self.parts.block_bytes)  # fmt: skip
                except codec.CorruptBlockError:
                    continue
                if len(blob) == n:
                    carry.append((key, blob))
        self.dir.unlink(victim.idx)  # first: nobody learns of records in a file about to go
        self.dir.unlink(victim.dat)
        kept = {k for k, _ in carry}
        with self._lock:
            self.map.drop_segment_locked(victim, keep=kept)
            self.compactions += 1
        return carry

    # -- sharing and warm restart ------------------------------------------------------------------------
    def refresh(self) -> None:
        """Forget segments that are gone; read the new index records of the others' segments."""
        with self._refresh_lock:
            with self._lock:
                # Known before the listing: a segment created meanwhile is not "gone".
                before = list(self.map.segs)
            listing = self.dir.listing()
            with self._lock:
                gone = [n for n in before if n not in listing]
                for n in gone:
                    self.map.drop_segment_locked(n)
                segs = self.map.segs
                todo = [
                    (n, segs[n].idx_off if n in segs else 0)
                    for n, kinds in listing.items()
                    if "idx" in kinds and n.token != self._token and not (n in segs and segs[n].sealed)
                ]
            for name, off in todo:
                self._tail(name, off)

    def _tail(self, name: SegmentName, off: int) -> None:
        try:
            fd = self.dir.open(name.idx, os.O_RDONLY)
        except ForeignFileError as exc:
            self.parts.rlog.warning(
                "foreign", f"kvtier fs {self.parts.name}: ignoring {exc.filename} ({exc.reason})"
            )
            return
        except OSError:
            return  # removed meanwhile
        try:
            data = _read_all(fd, off)
            # The restart order: a block counts as last used when its segment's index was written.
            when = os.fstat(fd).st_mtime
        except OSError:
            return
        finally:
            os.close(fd)
        recs, used = decode_records(data)
        bb = self.parts.block_bytes
        lo = codec.FIXED_HEADER_SIZE
        # Records that cannot be of this namespace's block size, or lie past the cap, are never read.
        good = [
            (BlockKey(r.key), r.offset, r.length)
            for r in recs
            if r.key and r.length - bb >= lo + len(r.key) and r.offset + r.length <= name.cap
        ]
        with self._lock:
            seg = self.map.segs.get(name)
            if seg is None:
                seg = self.map.segs[name] = SegmentMap.new_seg(name)
            seg.idx_off = off + used
            seg.sealed = seg.sealed or any(not r.key for r in recs)
            self.map.place_many_locked(name, good, when)

    def _remove_orphans(self) -> None:
        """Half-created segments (one file of the two) of dead processes (inside a section)."""
        for name, kinds in self.dir.listing().items():
            if len(kinds) < 2 and not self.parts.accounting.is_alive(name.token):
                self.dir.unlink(name.dat)
                self.dir.unlink(name.idx)

    def _poll(self) -> None:
        while not self._stop.wait(self.parts.options.refresh_interval):
            try:
                self.refresh()
            except Exception:  # never takes the tier down; the next round retries
                self.parts.rlog.warning(
                    "segrefresh", f"kvtier fs {self.parts.name}: segment refresh failed", exc_info=True
                )

    # -- load (worker threads) --------------------------------------------------------------------------
    def read_chunk(self, items: list[tuple[BlockKey, int]]) -> ChunkOutcome:
        """Fill each slot with its key's verified payload (:class:`~.segment_load.SegmentReader`)."""
        return self.reader.read_chunk(items)

    # -- failures, stats, shutdown ------------------------------------------------------------------------
    def _failed(self, exc: OSError) -> str:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            self.parts.gate.pause(self.parts.options.full_backoff, "disk full: store dropped (back-pressure)")
        self.parts.rlog.warning("segwrite", f"kvtier fs {self.parts.name}: segment write failed: {exc}")
        return f"{errno.errorcode.get(exc.errno or 0, 'OSError')}: {exc.strerror or exc}"

    def usage_bytes(self) -> int:
        """Bytes the segments in ``seg/`` count against ``max_bytes`` now (their caps)."""
        return sum(n.cap for n in self.dir.listing())

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "segments": len(self.map.segs),
                "seg_compactions": self.compactions,
                "seg_carried": self.carried,
            }

    def close(self) -> None:
        """Stop the refresh thread, seal the active segment, close every descriptor (after drain)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        with self._wlock:
            if self._active is not None:
                self._seal(self._active)
                self._active = None
        self.dir.close()


def _pwrite_all(fd: int, iov: list[bytes | memoryview], off: int) -> None:
    """``pwritev`` every buffer at ``off`` (in groups under IOV_MAX; short writes finished)."""
    for lo in range(0, len(iov), _IOV_MAX):
        group = iov[lo : lo + _IOV_MAX]
        want = sum(memoryview(b).nbytes for b in group)
        done = os.pwritev(fd, group, off)
        if done != want:
            whole = b"".join(bytes(b) for b in group)
            while done < want:
                done += os.pwrite(fd, whole[done:], off + done)
        off += want


def _read_all(fd: int, off: int) -> bytes:
    parts: list[bytes] = []
    while True:
        data = os.pread(fd, _READ_CHUNK, off)
        if not data:
            return b"".join(parts)
        parts.append(data)
        off += len(data)
