"""The fs tier's store path: reservation, eviction, temp files, publication.

A store job is split into tasks on the worker pool. The first task to run reserves room for the
job in the shared accounting (evicting victims chosen by the policy, in the same critical section);
every task writes its blocks to temp files (and creates their shard directories); the last task
publishes them all (renames, journaled, in one critical section) and reports the job.

Both trips through the cross-process lock are *group commits* across jobs: the task that reserves
also reserves for every other store job already submitted and not yet granted (they are queued
behind it and will write soon), and the task that publishes also publishes every other job whose
writes finished meanwhile. A stream of small jobs (one block each, say) therefore pays a few
critical sections per burst instead of two per job; the guarantees are those of one section
(docs/fs.md): bytes are reserved before any temp file is written, and a publication's renames are
journaled before they happen.
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
from kvtier.tiers.ratelog import RateLimitedLog

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
    # costs at most two trips through the shared lock (shared with other jobs: group commits).
    items: list[tuple[BlockKey, int]] = field(default_factory=list)
    granted: set[BlockKey] | None = None
    written: list[tuple[BlockKey, str, str, int]] = field(default_factory=list)


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
    def _init_store_path(self) -> None:
        """Group-commit queues (called once by the tier's constructor)."""
        self._grant_q: list[Job] = []  # submitted store jobs without a reservation, in order
        self._grant_lock = threading.Lock()  # one reserving thread at a time
        self._pub_q: list[Job] = []  # store jobs whose writes are done, waiting to be published
        self._pub_lock = threading.Lock()  # one publishing thread at a time

    def _store_chunk(self, state: Job, items: list[tuple[BlockKey, int]]) -> None:
        written: list[tuple[BlockKey, str, str, int]] = []
        error: str | None = None
        try:
            granted = self._job_grant(state)
            for key, slot in items:
                if key not in granted:
                    continue
                size = self.layout.file_size(len(key))
                tmp = f"{self._acct.tmp_dir}/{self._token}.{next(self._seq)}"
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
        """Reserve room for the job (once); the same section also reserves for the jobs queued
        behind it, as long as they fit without evicting anything.

        The job itself may evict (exactly as before); a queued job that would need victims is left
        to reserve in its own section when its first task runs, after the jobs ahead of it have
        published. So which blocks are evicted and which stores are dropped is the same as with one
        section per job (the replay's simulate mode models that), only the lock trips are shared.
        """
        granted = state.granted
        if granted is not None:  # set once, never changed afterwards
            return granted
        with self._grant_lock:
            if state.granted is None:
                with self._lock:
                    queued = [j for j in self._grant_q if j.granted is None and j is not state]
                    self._grant_q.clear()
                rest = queued
                try:
                    rest = self._reserve_jobs(state, queued)
                except OSError as exc:  # accounting file trouble: this job fails, the others retry
                    state.error = state.error or self._section_failed(exc)
                finally:
                    if state.granted is None:  # whatever went wrong, nothing was granted
                        state.granted = set()
                    if rest:
                        with self._lock:
                            self._grant_q[:0] = rest  # still first in line, in submission order
            assert state.granted is not None
            return state.granted

    def _reserve_jobs(self, state: Job, queued: list[Job]) -> list[Job]:
        """One section: reserve ``state``'s leading blocks that fit (evicting victims), then every
        queued job in order while it fits whole without eviction. Returns the jobs left ungranted."""
        sizes = [self.layout.file_size(len(k)) for k, _ in state.items]
        with self._acct.section() as st:
            me = self._acct.me(st)
            n = len(sizes)
            free = None
            if self.max_bytes is not None:
                free = self.max_bytes - st.usage
                if free < sum(sizes):
                    free += self._make_room(st, sum(sizes) - free)
                while n and sum(sizes[:n]) > free:
                    n -= 1
                free -= sum(sizes[:n])
            total = sum(sizes[:n])
            more: list[Job] = []
            for j in queued:
                need = sum(self.layout.file_size(len(k)) for k, _ in j.items)
                if free is not None:
                    if need > free:
                        break
                    free -= need
                total += need
                more.append(j)
            me["reserved"] = int(me["reserved"]) + total
        state.granted = {k for k, _ in state.items[:n]}
        for j in more:
            j.granted = {k for k, _ in j.items}
        if n < len(state.items):
            state.error = state.error or "capacity: no evictable block (stores dropped)"
            with self._lock:
                self.stats.dropped_stores += len(state.items) - n
        return queued[len(more) :]

    def _finish_store(self, state: Job) -> None:
        """Publish the job's written blocks (with any other job ready meanwhile), then report."""
        with self._lock:
            self._pub_q.append(state)
        with self._pub_lock:
            with self._lock:
                batch, self._pub_q = self._pub_q, []
            if batch:  # empty: a thread that held the lock before us published ours too
                self._publish_jobs(batch)

    def _publish_jobs(self, batch: list[Job]) -> None:
        written = [w for j in batch for w in j.written]
        ok: set[BlockKey] = set()
        error: str | None = None
        try:
            if written:
                try:
                    ok = set(self._publish(written))
                except OSError:
                    self._unpublished(written)
                    raise
        except OSError as exc:
            error = self._section_failed(exc)
        finally:
            with self._lock:
                for state in batch:
                    mine = [k for k, _, _, _ in state.written if k in ok]
                    nbytes = self.block_bytes * len(mine)
                    for key, _ in state.items:
                        self._storing.discard(key)
                    self.stats.stores += len(mine)
                    self.stats.bytes_written += nbytes
                    state.ok.update(mine)
                    state.nbytes += nbytes
                    if error and state.written and not state.error:
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

    def _make_room(self, st: AccountingState, deficit: int) -> int:
        """Evict our own unprotected blocks to free ``deficit`` bytes (inside a section).

        Returns the bytes freed. Dead processes' reservations are reclaimed first (cheap, exact).
        """
        before = st.usage
        if self._acct.others_hold_bytes(st):  # else a dead process has nothing to give back
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
        d = final.rpartition("/")[0]  # os.path.dirname, minus its per-call overhead
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
