"""The fs tier's store path: reservation, eviction, temp files, publication.

A store job is split into tasks on the worker pool. The first task to run reserves room for the
whole job in the shared accounting (evicting victims chosen by the policy, in the same critical
section); every task writes its blocks to temp files (and creates their shard directories); the last
task publishes them all (renames, journaled, in one critical section) and reports the job. So a job
costs two trips through the cross-process lock, however many blocks it holds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey
from kvtier.policies.base import CachePolicy
from kvtier.tiers.base import TierStats
from kvtier.tiers.fs_accounting import AccountingState, SharedAccounting
from kvtier.tiers.fs_io import fsync_dir, write_block
from kvtier.tiers.fs_layout import HEADER_ALIGN, Layout
from kvtier.tiers.fs_pool import RateLimitedLog

__all__ = ["Job", "StorePath"]


@dataclass
class Job:
    """Progress of one submitted transfer job (split into tasks on the worker pool)."""

    job: TransferJob
    chunks_left: int
    ok: set[BlockKey] = field(default_factory=set)
    nbytes: int = 0
    error: str | None = None
    t0: float = field(default_factory=time.perf_counter)
    # Stores only: the job reserves once (first task) and publishes once (last task), so a job
    # costs two trips through the shared lock, however many tasks it is split into.
    items: list[tuple[BlockKey, int]] = field(default_factory=list)
    granted: set[BlockKey] | None = None
    written: list[tuple[BlockKey, str, str, int]] = field(default_factory=list)
    gate: threading.Lock = field(default_factory=threading.Lock)


class StorePath:
    """Mixin of :class:`~kvtier.tiers.fs.FsTier`: the store half (see module doc)."""

    # Provided by FsTier.
    name: str
    stats: TierStats
    layout: Layout
    max_bytes: int | None
    block_bytes: int
    direct_io: bool
    fsync: bool
    full_backoff: float
    _acct: SharedAccounting
    _token: str
    _seq: Iterator[int]
    _lock: threading.Lock
    _index: dict[BlockKey, int]
    _access: dict[BlockKey, float]
    _storing: set[BlockKey]
    _loading: Counter[BlockKey]
    _policy: CachePolicy
    _tombstones: set[BlockKey]
    _scan_done: bool
    _dirs_made: set[str]
    _full_until: float
    _rlog: RateLimitedLog
    _report_locked: Callable[[Job], None]
    rows: npt.NDArray[np.uint8]

    # -- stores ------------------------------------------------------------------------------
    def _store_chunk(self, state: Job, items: list[tuple[BlockKey, int]]) -> None:
        written: list[tuple[BlockKey, str, str, int]] = []
        error: str | None = None
        try:
            granted = self._job_grant(state)
            for key, slot in items:
                if key not in granted:
                    continue
                size = self.layout.file_size(len(key))
                tmp = os.path.join(self._acct.tmp_dir, f"{self._token}.{next(self._seq)}")
                final = self.layout.path_of(key)
                try:
                    self._write_file(tmp, key, slot)
                    written.append((key, tmp, final, size))
                except OSError as exc:
                    error = self._store_failed(exc, tmp, size)
                    continue
                try:
                    self._ensure_dir(final)
                except OSError as exc:  # publish retries it and fails the block cleanly
                    error = self._section_failed(exc)
        except OSError as exc:  # accounting file trouble: fail the chunk, never raise
            error = self._section_failed(exc)
        finally:
            with self._lock:
                state.written.extend(written)
                if error and not state.error:
                    state.error = error
                state.chunks_left -= 1
                last = state.chunks_left == 0
            if last:
                self._finish_store(state)

    def _job_grant(self, state: Job) -> set[BlockKey]:
        """Reserve room for the whole job once (the first task to run does it)."""
        with state.gate:
            if state.granted is None:
                state.granted = set()  # an exception below leaves nothing granted
                granted = self._reserve(state.items)
                state.granted = {k for k, _ in granted}
                if len(granted) < len(state.items):
                    state.error = state.error or "capacity: no evictable block (stores dropped)"
            return state.granted

    def _finish_store(self, state: Job) -> None:
        """Publish every block the job's tasks wrote (one critical section), then report it."""
        ok: list[BlockKey] = []
        error: str | None = None
        try:
            if state.written:
                try:
                    ok = self._publish(state.written)
                except OSError:
                    self._unpublished(state.written)
                    raise
        except OSError as exc:
            error = self._section_failed(exc)
        finally:
            nbytes = self.block_bytes * len(ok)
            with self._lock:
                for key, _ in state.items:
                    self._storing.discard(key)
                self.stats.stores += len(ok)
                self.stats.bytes_written += nbytes
                state.ok.update(ok)
                state.nbytes += nbytes
                if error and not state.error:
                    state.error = error
                self._report_locked(state)

    def _section_failed(self, exc: OSError) -> str:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            self._full_until = time.monotonic() + self.full_backoff
        error = f"{type(exc).__name__}: {exc}"
        self._rlog.warning("acct", f"kvtier fs {self.name}: store failed: {error}")
        return error

    def _unpublished(self, written: list[tuple[BlockKey, str, str, int]]) -> None:
        """Publishing failed before the renames (mkdir or accounting I/O): drop the temp files and
        give their reservations back, so nothing leaks until the process dies."""
        back = 0
        for _, tmp, _, size in written:
            if os.path.exists(tmp):
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                back += size
        with contextlib.suppress(OSError):
            self._acct.release(back)

    def _store_failed(self, exc: OSError, tmp: str, size: int) -> str:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        with contextlib.suppress(OSError):
            self._acct.release(size)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            self._full_until = time.monotonic() + self.full_backoff
            self._rlog.warning(
                "enospc", f"kvtier fs {self.name}: disk full under {self.layout.ns_dir}; dropping stores"
            )
        else:
            self._rlog.warning(
                "write", f"kvtier fs {self.name}: write failed under {self.layout.ns_dir}: {exc}"
            )
        return f"{errno.errorcode.get(exc.errno or 0, 'OSError')}: {exc.strerror or exc}"

    def _reserve(self, items: list[tuple[BlockKey, int]]) -> list[tuple[BlockKey, int]]:
        """Reserve bytes for as many leading items as fit (evicting victims); drop the rest."""
        sizes = [self.layout.file_size(len(k)) for k, _ in items]
        with self._acct.section() as st:
            me = self._acct.me(st)
            granted = len(items)
            if self.max_bytes is not None:
                free = self.max_bytes - st.usage
                if free < sum(sizes):
                    free += self._make_room(st, sum(sizes) - free)
                while granted and sum(sizes[:granted]) > free:
                    granted -= 1
            me["reserved"] = int(me["reserved"]) + sum(sizes[:granted])
        if granted < len(items):
            with self._lock:
                self.stats.dropped_stores += len(items) - granted
        return items[:granted]

    def _make_room(self, st: AccountingState, deficit: int) -> int:
        """Evict our own unprotected blocks to free ``deficit`` bytes (inside a section).

        Returns the bytes freed. Dead processes' reservations are reclaimed first (cheap, exact).
        """
        before = st.usage
        self._acct.recover_dead(st)
        freed = before - st.usage
        if freed >= deficit:
            return freed
        unit = self.layout.file_size(32)
        with self._lock:
            protected = set(self._loading) | self._storing
            avail = len(self._policy) - sum(1 for k in protected if k in self._policy)
            n = min(-(-(deficit - freed) // unit), avail)
            victims = self._policy.evict(n, protected) if n > 0 else []
            paths = [self.layout.path_of(v) for v in victims]
            for v in victims:
                self._forget_locked(v)
            self.stats.evictions += len(victims)
        removed = self._acct.unlink_files(st, paths)
        self._acct.log_events(st, [(b"-", bytes(v)) for v in victims])
        return freed + sum(s for _, s in removed)

    def _forget_locked(self, key: BlockKey) -> None:
        self._index.pop(key, None)
        self._access.pop(key, None)
        self._policy.remove(key)
        if not self._scan_done:
            self._tombstones.add(key)

    def _write_file(self, tmp: str, key: BlockKey, slot: int) -> None:
        payload = self.rows[slot, : self.block_bytes]
        direct = (
            self.direct_io
            and payload.ctypes.data % HEADER_ALIGN == 0
            and self.block_bytes % HEADER_ALIGN == 0
        )
        write_block(tmp, key, payload.data, self.layout.ns_tag, direct=direct, fsync=self.fsync)

    def _ensure_dir(self, final: str) -> None:
        """Create the block's shard directories (both 0700; os.makedirs would set the leaf only).

        Called by the worker that wrote the block, so the costly mkdirs of a young tree run in
        parallel with other writes instead of in the job's single publish step.
        """
        d = os.path.dirname(final)
        if d not in self._dirs_made:
            for level in (os.path.dirname(d), d):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(level, 0o700)
            self._dirs_made.add(d)

    def _publish(self, written: list[tuple[BlockKey, str, str, int]]) -> list[BlockKey]:
        for _, _, final, _ in written:
            self._ensure_dir(final)  # normally done already; cheap set lookup then
        ok: list[BlockKey] = []
        now = time.time()
        with self._acct.section() as st:
            flags = self._acct.publish(st, [(tmp, final, size) for _, tmp, final, size in written])
            with self._lock:
                for (key, _, _, size), good in zip(written, flags, strict=True):
                    if not good:
                        continue
                    ok.append(key)
                    self._tombstones.discard(key)
                    if key in self._index:
                        continue
                    self._insert_locked(st, key, size, now)
            self._acct.log_events(st, [(b"+", bytes(k)) for k in ok])
        if self.fsync:
            for d in {os.path.dirname(f) for _, _, f, _ in written}:
                fsync_dir(d)
        return ok

    def _insert_locked(self, st: AccountingState, key: BlockKey, size: int, when: float) -> None:
        """Index a block now in the tree (tier lock + accounting section held)."""
        if len(self._policy) >= self._policy.capacity:
            for v in self._policy.evict(1, set(self._loading) | self._storing):
                self._index.pop(v, None)
                self._access.pop(v, None)
                self._acct.unlink_files(st, [self.layout.path_of(v)])
                self._acct.log_events(st, [(b"-", bytes(v))])
                self.stats.evictions += 1  # tier lock held by the caller
        if len(self._policy) < self._policy.capacity:
            self._policy.insert(key)
        self._index[key] = size
        self._access[key] = when
