"""The fs tier's load path: read block files straight into primary slots, verified.

Each block is one ``preadv`` of header + payload, the payload straight into its slot
(:func:`~kvtier.tiers.fs.io.read_block`), with ``O_DIRECT`` when the tier reads directly (``read_io``;
by default exactly when it writes with ``O_DIRECT``: those files have nothing in the page cache, and
one direct read of the whole file runs at the device's rate where a buffered one is split into
readahead windows) and the slot is page-aligned. The header is always checked and the checksum
too unless ``verify="never"``. A missing file (another process evicted it) is forgotten; a
corrupt one is counted in ``stats.corrupt``, removed and forgotten: both are misses, never wrong
bytes. Loaded blocks are refreshed in the policy and, at most once a minute, in their file's
mtime, so a restart keeps the access order.
"""

from __future__ import annotations

import contextlib
import enum
import os
import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from kvtier import codec
from kvtier.keys import BlockKey
from kvtier.tiers.async_tier import ChunkOutcome
from kvtier.tiers.fs.batchread import BatchItem, BatchReader, BlockFormat, open_reader
from kvtier.tiers.fs.io import SlotAlignment, read_block
from kvtier.tiers.fs.layout import HEADER_ALIGN
from kvtier.tiers.fs.parts import FsParts
from kvtier.tiers.fs.safe import ForeignFileError

__all__ = ["LoadPath"]

_ACCESS_GRANULARITY = 60.0  # seconds between two mtime refreshes of one block on load


class _Redo(enum.Enum):
    REDO = 0  # a block the batched reader left to the Python path


_REDO = _Redo.REDO


def _any_of(fns: Sequence[Callable[[], bool] | None]) -> Callable[[], bool] | None:
    """One flag that is set when any of ``fns`` is (``None`` when there is none to ask)."""
    live = [fn for fn in fns if fn is not None]
    if not live:
        return None
    return lambda: any(fn() for fn in live)


class LoadPath:
    """Reads of the fs tier (worker threads). ``index.lock`` guards the index and ``stats``.

    Args:
        parts: the tier's shared parts (name, layout, accounting, index, stats, log).
        rows: the primary buffer as rows; block_bytes: payload bytes per block.
        verify: check every payload checksum (else the header only).
        record_access: refresh a loaded file's mtime (at most once a minute per block).
        direct_io: read with ``O_DIRECT`` when a slot is page-aligned (else buffered, same bytes).
    """

    def __init__(
        self,
        parts: FsParts,
        *,
        rows: npt.NDArray[np.uint8],
        block_bytes: int,
        verify: bool,
        record_access: bool,
        direct_io: bool = False,
    ) -> None:
        self.rows = rows
        self._align = SlotAlignment(rows)
        self.direct_io = direct_io and block_bytes % HEADER_ALIGN == 0
        self.block_bytes = block_bytes
        self.verify = verify
        self.record_access = record_access
        self.parts = parts
        self._lock = parts.index.lock
        # The batched reader (one GIL-free call per chunk; see .batchread) for blocks in files;
        # a shared root's blocks carry a MAC, checked on the Python path only.
        self._batch: BatchReader | None = None
        if parts.mac is None:
            fmt = BlockFormat(
                header_len=codec.header_size(0, HEADER_ALIGN), payload_len=block_bytes,
                ns_tag=parts.layout.ns_tag, verify=verify, owners=parts.accounting.tree.owners,
            )  # fmt: skip
            self._batch = open_reader(parts.accounting.tree, rows, fmt)

    def read_chunk(
        self, items: list[tuple[BlockKey, int]], abandoned: Callable[[], bool] | None = None
    ) -> ChunkOutcome:
        """Fill each slot with its key's payload; keys that fail are left out of ``done``.

        ``abandoned`` tells whether the job was given up (a striped tier's deadline passed and the
        engine may already reuse the slots): it is asked after each file is opened, before anything
        is read into the slot, so a stall in ``open``/``fstat`` never lands bytes in a reused slot.
        """
        return self.read_chunks([items], [abandoned])[0]

    def read_chunks(
        self, groups: list[list[tuple[BlockKey, int]]], abandoned: Sequence[Callable[[], bool] | None]
    ) -> list[ChunkOutcome]:
        """:meth:`read_chunk` for several chunks (of one job or of several) in one batched read:
        one outcome per group, ``abandoned[i]`` asked for the blocks of ``groups[i]``."""
        items = [item for group in groups for item in group]
        flags = [fn for group, fn in zip(groups, abandoned, strict=True) for _ in group]
        results: list[str | _Redo | None] = [_REDO] * len(items)
        ok: list[BlockKey] = []
        try:
            results = self._read_batch(items, _any_of(abandoned))
            for i, ((key, slot), result) in enumerate(zip(items, results, strict=True)):
                if isinstance(result, _Redo):
                    results[i] = result = self._load_one(key, slot, flags[i])
                if result is None:
                    ok.append(key)
        finally:
            with self._lock:
                self.parts.index.touch_locked(ok, time.time())
        out, at = [], 0
        for group in groups:
            mine = results[at : at + len(group)]
            done = [key for (key, _), r in zip(group, mine, strict=True) if r is None]
            error = next((r for r in mine if isinstance(r, str)), None)
            out.append(ChunkOutcome(done, len(done) * self.block_bytes, error))
            at += len(group)
        return out

    def _read_batch(
        self, items: list[tuple[BlockKey, int]], abandoned: Callable[[], bool] | None
    ) -> list[str | _Redo | None]:
        """Per item: ``None`` (read and verified by the batched reader), a failure reason (its
        header or checksum is wrong: dropped as corrupt), or ``_REDO`` (the Python path reads it)."""
        reader = self._batch
        if reader is None:
            return [_REDO] * len(items)
        epoch0 = reader.epoch()  # before the flag: an abandon after this check stops the read
        if abandoned is not None and abandoned():
            return [_REDO] * len(items)
        batch: list[BatchItem] = []
        now = time.time()
        for key, slot in items:
            path = self.parts.layout.path_of(key)
            # Same rule as the Python path: refresh the mtime at most once a minute per block.
            touch = self.record_access and now - self.parts.index.access.get(key, 0.0) > _ACCESS_GRANULARITY
            direct = self.direct_io and self._align.aligned(slot)
            batch.append(BatchItem(path, slot, bytes(key), touch, direct))
        done, headers, hchecks, pchecks = reader.read(batch, epoch0)
        hlen, n = reader.header_len, self.block_bytes
        out: list[str | _Redo | None] = []
        for i, (item, fine) in enumerate(zip(batch, done, strict=True)):
            if fine is None or codec.header_size(len(item.key), HEADER_ALIGN) != hlen:
                out.append(_REDO)
                continue
            if fine:  # read, and every header check passed in C (see .batchread)
                out.append(None)
                continue
            try:  # read, but the header disagrees: the parser names the corruption
                header = codec.parse_header(
                    headers[i * hlen : (i + 1) * hlen].data, expected_key=item.key,
                    ns_tag=self.parts.layout.ns_tag, payload_len=n, header_check=hchecks[i],
                )  # fmt: skip
                if header.header_len != hlen:
                    raise codec.CorruptBlockError(
                        "header", f"header length {header.header_len}, expected {hlen}"
                    )
                if self.verify:
                    codec.check_payload_digest(header, pchecks[i])
            except codec.CorruptBlockError as exc:
                self._drop_corrupt(BlockKey(item.key), item.path, exc.reason)
                out.append(f"corrupt: {exc.reason}")
                continue
            out.append(None)
        return out

    @property
    def batched(self) -> bool:
        """Whether loads go through the batched reader (one GIL-free call per chunk)."""
        return self._batch is not None

    def note_abandon(self) -> None:
        """A job was given up: a batched read in progress stops before its next block."""
        if self._batch is not None:
            self._batch.note_abandon()

    def _load_one(self, key: BlockKey, slot: int, abandoned: Callable[[], bool] | None = None) -> str | None:
        """Fill ``slot`` with ``key``'s payload; ``None`` on success, else a short reason."""
        path = self.parts.layout.path_of(key)
        try:
            slot_bytes = self.rows[slot, : self.block_bytes]
            direct = self.direct_io and self._align.aligned(slot)
            fd, size = self.parts.accounting.tree.open_block(path, direct=direct)
            if abandoned is not None and abandoned():
                os.close(fd)
                return "abandoned: past the deadline"
        except FileNotFoundError:
            self._drop_stale(key)
            return "missing"
        except ForeignFileError as exc:
            # A link, FIFO, device or another owner's file where the block belongs: a miss,
            # counted and logged, never read and never removed (it is not provably ours).
            self.parts.rlog.warning("foreign", f"kvtier fs {self.parts.name}: ignoring {path} ({exc.reason})")
            with self._lock:
                self.parts.stats.corrupt += 1
            self._drop_stale(key)
            return f"foreign: {exc.reason}"
        except OSError as exc:
            self.parts.rlog.warning("read", f"kvtier fs {self.parts.name}: read failed for {path}: {exc}")
            return f"read error: {exc.strerror or exc}"
        try:
            read_block(
                fd, key, slot_bytes.data, self.parts.layout.ns_tag, verify=self.verify, size=size,
                direct=direct, mac=self.parts.mac,
            )  # fmt: skip
            # The access order survives a restart through mtime. Refreshing it costs an inode
            # write, so it is done at most once a minute per block (restart order is that coarse).
            last = self.parts.index.access.get(key, 0.0)
            if self.record_access and time.time() - last > _ACCESS_GRANULARITY:
                with contextlib.suppress(OSError):
                    os.utime(fd)
        except codec.CorruptBlockError as exc:
            self._drop_corrupt(key, path, exc.reason)
            return f"corrupt: {exc.reason}"
        except OSError as exc:
            self.parts.rlog.warning("read", f"kvtier fs {self.parts.name}: read failed for {path}: {exc}")
            return f"read error: {exc.strerror or exc}"
        finally:
            os.close(fd)
        return None

    def _drop_stale(self, key: BlockKey) -> None:
        # Another process evicted it (or someone deleted it): forget it; nothing to account.
        with self._lock:
            if key in self.parts.index.sizes:
                self.parts.index.forget_locked(key)

    def _drop_corrupt(self, key: BlockKey, path: str, reason: str) -> None:
        self.parts.rlog.warning(
            "corrupt", f"kvtier fs {self.parts.name}: removed corrupt block {path} ({reason})"
        )
        with self._lock:
            self.parts.stats.corrupt += 1
            if key in self.parts.index.sizes:
                self.parts.index.forget_locked(key)
        try:
            with self.parts.accounting.section() as st:
                self.parts.accounting.unlink_files(st, [path])
                self.parts.accounting.log_events(st, [(b"-", bytes(key))])
        except OSError as exc:
            self.parts.rlog.warning("acct", f"kvtier fs {self.parts.name}: cannot remove {path}: {exc}")
