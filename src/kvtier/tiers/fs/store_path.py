"""The fs tier's store path: reservation, eviction, temp files, publication.

:class:`~kvtier.tiers.async_tier.AsyncTier` splits a store job into chunks on the worker pool. The
first chunk to run reserves room for the job in the shared accounting (evicting victims chosen by
the policy, in the same critical section); every chunk writes its blocks to temp files (and creates
their shard directories); after the last chunk the job is published (renames, journaled, in one
critical section) and reported.

Both trips through the cross-process lock are *group commits* across jobs: the task that reserves
also reserves for every other store job already submitted and not yet granted (they are queued
behind it and will write soon), and the task that publishes also publishes every other job whose
writes finished meanwhile. A stream of small jobs (one block each, say) therefore pays a few
critical sections per burst instead of two per job; the guarantees are those of one section
(docs/fs.md): bytes are reserved before any temp file is written, and a publication's renames are
journaled before they happen.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtier import codec
from kvtier.keys import BlockKey
from kvtier.tiers.async_tier import ChunkOutcome, JobState
from kvtier.tiers.fs.accounting import AccountingState
from kvtier.tiers.fs.batchwrite import BatchWriter, WriteItem, open_writer
from kvtier.tiers.fs.io import SlotAlignment, fsync_dir, write_block
from kvtier.tiers.fs.job_queue import JobChunk
from kvtier.tiers.fs.layout import HEADER_ALIGN
from kvtier.tiers.fs.parts import FsParts

__all__ = ["StorePath", "StoreProgress"]

#: The error of a store dropped while the disk is full.
DISK_FULL = "disk full: store dropped (back-pressure)"

Written = tuple[BlockKey, str, str, int]  # key, temp path, final path, file size
#: Most finished store jobs a publication may wait for while other store chunks are writing.
LINGER_JOBS = 8
#: Longest key whose header is one page (``codec.header_size(len(key), 4096) == 4096``).
_ONE_PAGE_KEY = HEADER_ALIGN - codec.FIXED_HEADER_SIZE


@dataclass
class StoreProgress:
    """The fs part of one store job (``JobState.extra``): its reservation and its temp files.

    The job reserves once (first chunk) and publishes once (after the last chunk), so a job costs
    at most two trips through the shared lock (shared with other jobs: group commits).
    """

    granted: set[BlockKey] | None = None
    written: list[Written] = field(default_factory=list)
    #: Granted keys whose reservation is settled: written (published later) or given back.
    settled: set[BlockKey] = field(default_factory=set)


class StorePath:
    """Reservation, eviction, temp files and publication of the fs tier's stores (see module doc).

    Args:
        parts: the tier's shared parts (name, layout, accounting, index, stats, log, shard
            directories, store gate, primary rows) and options (``max_bytes``, ``fsync``: sync
            files and directories, ``full_backoff``: the gate's pause on ``ENOSPC``).
        direct_io: ``O_DIRECT`` writes when a slot is aligned.
        write_file: writes one temp file ``(tmp, key, slot)``; raises ``OSError`` (a tier whose
            seam fault-injection tests override passes it; ``None``: :meth:`write_file`, and whole
            chunks through the batched writer of :mod:`.batchwrite` where it is available).
        on_published: records a job's published keys and reports it (tier lock held).
    """

    def __init__(
        self,
        parts: FsParts,
        *,
        direct_io: bool,
        write_file: Callable[[str, BlockKey, int], None] | None,
        on_published: Callable[[JobState, ChunkOutcome], None],
    ) -> None:
        self.direct_io = direct_io
        self._align = SlotAlignment(parts.rows)
        self._write = write_file or self.write_file
        # The batched writer (one GIL-free call per chunk) unless the seam is overridden; a shared
        # root's blocks carry a MAC, written on the Python path only.
        self._batch: BatchWriter | None = None
        if write_file is None and parts.mac is None:
            self._batch = open_writer(
                parts.rows, payload_len=parts.block_bytes, ns_tag=parts.layout.ns_tag,
                fsync=parts.options.fsync,
            )  # fmt: skip
        self._on_published = on_published
        self.parts = parts
        self._lock = parts.index.lock
        self._seq = itertools.count()
        self._grant_q: list[JobState] = []  # submitted store jobs without a reservation, in order
        self._grant_lock = threading.Lock()  # one reserving thread at a time
        self._pub_q: list[JobState] = []  # store jobs whose writes are done, waiting to be published
        self._pub_lock = threading.Lock()  # one publishing thread at a time
        self._writing = 0  # store chunks running now (tier lock): a lingering job waits for one

    @property
    def batched(self) -> bool:
        """Whether stores go through the batched writer (one GIL-free call per batch)."""
        return self._batch is not None

    # -- submission (engine thread, tier lock held) ----------------------------------------------
    def admit_locked(self, state: JobState) -> None:
        """Keep only the blocks to write; queue the job for a (group) reservation."""
        index = self.parts.index
        policy = index.policy
        items: list[tuple[BlockKey, int]] = []
        for key, slot in state.items:
            if key in index.sizes or key in index.storing:
                state.ok.add(key)  # already held (or on its way): counts as stored
                if key in policy:
                    policy.touch(key)  # offered again = in use: not the next victim
                continue
            index.storing.add(key)
            items.append((key, slot))
        state.items = items
        state.extra = StoreProgress()
        if items:
            self._grant_q.append(state)  # reserved with the jobs ahead of it when possible

    # -- chunks (worker thread) ------------------------------------------------------------------
    def write_chunk(self, state: JobState, items: list[tuple[BlockKey, int]]) -> ChunkOutcome:
        """Reserve (first chunk of the job), then write each granted block to a temp file."""
        return self.write_chunks([(state, items)])[0]

    def write_chunks(self, chunks: list[JobChunk]) -> list[ChunkOutcome]:
        """:meth:`write_chunk` for several chunks (of one job or of several) with one batched
        write: one outcome each (keys count as stored once published, by :meth:`finish`).

        It stops before the first chunk (after the first) whose job has no reservation yet: the
        first chunk's section reserves for every queued job that fits without evicting, so such
        a job needs victims, which may be blocks the chunks before it are about to publish (a
        full tier evicts exactly as with one job at a time). Fewer outcomes than chunks then."""
        chunks = list(chunks)  # cut below; the caller's list is the queue's batch
        written: list[list[Written]] = [[] for _ in chunks]
        errors: list[str | None] = [None] * len(chunks)
        with self._lock:
            self._writing += 1
        try:
            todo: list[tuple[BlockKey, int, str, int]] = []
            owner: list[int] = []  # the chunk of each todo entry
            for n, (state, items) in enumerate(chunks):
                if n and state.extra.granted is None:
                    del chunks[n:], written[n:], errors[n:]
                    break
                try:
                    granted = self._job_grant(state)
                except OSError as exc:  # accounting file trouble: fail the chunk, never raise
                    errors[n] = self._section_failed(exc)
                    continue
                for key, slot in items:
                    if key in granted:
                        todo.append(self._todo(key, slot))
                        owner.append(n)
            for n, (key, _, tmp, size), err in zip(owner, todo, self._write_many(todo), strict=True):
                errors[n] = self._place(chunks[n][0], key, tmp, size, err, written[n]) or errors[n]
        finally:
            with self._lock:
                for (state, _), mine in zip(chunks, written, strict=True):
                    state.extra.written.extend(mine)
                self._writing -= 1
                # Jobs left lingering (see finish) wait for a running chunk; when the last one
                # ends, its thread publishes them, unless one of its own jobs' finish is next.
                here = collections.Counter(s for s, _ in chunks)
                last = any(s.chunks_left == k for s, k in here.items())  # its finish comes next
                orphans = not self._writing and bool(self._pub_q) and not last
            if orphans:
                self._lead()
        return [ChunkOutcome(error=e) for e in errors]

    def _todo(self, key: BlockKey, slot: int) -> tuple[BlockKey, int, str, int]:
        """``(key, slot, temp path, file size)`` of one block to write."""
        acct = self.parts.accounting
        return key, slot, acct.temps.path(acct.token, next(self._seq)), self.parts.layout.file_size(len(key))

    def _place(
        self, state: JobState, key: BlockKey, tmp: str, size: int, err: OSError | None, out: list[Written]
    ) -> str | None:
        """One block's write is over: settle its reservation, note its temp file in ``out`` (and
        make its leaf directory) when it was written; the failure to report, if any."""
        progress: StoreProgress = state.extra
        try:
            if err is not None:
                return self._store_failed(err, tmp, size)
            final = self.parts.layout.path_of(key)
            out.append((key, tmp, final, size))
        finally:
            progress.settled.add(key)
        try:
            self.parts.dirs.ensure_for(final)
        except OSError as exc:  # publish retries it and fails the block cleanly
            return self._section_failed(exc)
        return None

    def _write_many(self, todo: list[tuple[BlockKey, int, str, int]]) -> list[OSError | None]:
        """Write each ``(key, slot, tmp, size)`` to its temp file: per block ``None`` or the error.

        One batched call (GIL released once) for the blocks it takes: aligned for ``O_DIRECT``
        when the tier writes directly (the Python path writes the others buffered, as before),
        keys whose header is one page; the seam :attr:`_write` for the rest."""
        out: list[OSError | None] = [None] * len(todo)
        batch = self._batch
        rest: range | list[int] = range(len(todo))
        if batch is not None:
            direct = self.direct_io and self.parts.block_bytes % HEADER_ALIGN == 0
            picked = [
                i for i, (key, slot, _, _) in enumerate(todo)
                if len(key) <= _ONE_PAGE_KEY and (not direct or self._align.aligned(slot))
            ]  # fmt: skip
            if picked:
                locate = self.parts.accounting.temps.locate
                errs = batch.write([
                    WriteItem(*locate(todo[i][2]), todo[i][1], bytes(todo[i][0]), direct) for i in picked
                ])  # fmt: skip
                for i, e in zip(picked, errs, strict=True):
                    if e:
                        out[i] = OSError(e, os.strerror(e))
                taken = set(picked)
                rest = [i for i in range(len(todo)) if i not in taken]
        for i in rest:
            key, slot, tmp, _ = todo[i]
            try:
                self._write(tmp, key, slot)
            except OSError as exc:
                out[i] = exc
        return out

    def write_file(self, tmp: str, key: BlockKey, slot: int) -> None:
        """Write ``key``'s block file from primary slot ``slot`` to ``tmp`` (raises ``OSError``)."""
        bb = self.parts.block_bytes
        payload = self.parts.rows[slot, :bb]
        direct = self.direct_io and bb % HEADER_ALIGN == 0 and self._align.aligned(slot)
        dir_fd, name = self.parts.accounting.temps.locate(tmp)
        write_block(
            name, key, payload.data, self.parts.layout.ns_tag, direct=direct,
            fsync=self.parts.options.fsync, dir_fd=dir_fd, mac=self.parts.mac,
        )  # fmt: skip

    # -- after the last chunk (worker thread) ---------------------------------------------------
    def finish(self, state: JobState) -> None:
        """Publish the job's written blocks (with any other job ready meanwhile), then report."""
        self.finish_jobs([state])

    def finish_jobs(self, states: list[JobState]) -> None:
        """:meth:`finish` for several jobs at once (whose last chunks one batch wrote): they join
        the same publication."""
        for state in states:
            self._settle_abandoned(state)
        with self._lock:
            self._pub_q.extend(states)
            # Linger: while other store chunks are writing (and no job waits to reserve, which
            # may need this job's blocks in the index as eviction candidates), leave the job for
            # the publication that a chunk finishing soon makes: a stream of one-block jobs then
            # shares one trip through the accounting lock per few jobs instead of one per job.
            # A running chunk always ends in a publication (its job's finish, or the orphan check
            # in write_chunks), so a lingering job waits for at most one batch of block writes.
            if self._writing and not self._grant_q and len(self._pub_q) < LINGER_JOBS:
                return
        self._lead()

    def _lead(self) -> None:
        # Leader-style group commit: a worker never waits for another's publication. If one is
        # under way, its thread picks our job up when it looks at the queue again after
        # releasing the lock (below), so this worker goes back to writing at once; a waiting
        # worker is a worker not writing, which cost a quarter of the store time at 4 threads.
        while self._pub_lock.acquire(blocking=False):
            try:
                with self._lock:
                    batch, self._pub_q = self._pub_q, []
                if batch:
                    self._publish_jobs(batch)
            finally:
                self._pub_lock.release()
            with self._lock:
                if not self._pub_q:  # anything appended after this check finds the lock free
                    return

    def _settle_abandoned(self, state: JobState) -> None:
        """A chunk that raised (a bug, not an I/O error) skipped its blocks: take the job out of
        the reservation queue, or give back what was reserved for blocks never written."""
        progress: StoreProgress = state.extra
        granted = progress.granted  # set once by the first chunk, never changed afterwards
        if granted is None:
            with self._grant_lock:  # no reservation is being made meanwhile
                with self._lock:
                    if progress.granted is None:
                        progress.granted = set()
                        if state in self._grant_q:
                            self._grant_q.remove(state)
                        return
                granted = progress.granted
        left = granted - progress.settled  # empty unless a chunk raised
        if left:
            with contextlib.suppress(OSError):
                self.parts.accounting.release(sum(self.parts.layout.file_size(len(k)) for k in left))

    # -- eviction (inside a section) -----------------------------------------------------------
    def make_room(self, st: AccountingState, deficit: int) -> int:
        """Evict our own unprotected blocks to free ``deficit`` bytes (inside a section).

        Returns the bytes freed. Dead processes' reservations are reclaimed first (cheap, exact).
        """
        acct = self.parts.accounting
        before = st.usage
        if acct.others_hold_bytes(st):  # else a dead process has nothing to give back
            acct.recover_dead(st)
        freed = before - st.usage
        if freed >= deficit:
            return freed
        unit = self.parts.layout.file_size(32)
        index = self.parts.index
        with self._lock:
            policy = index.policy
            protected = index.protected_locked()
            avail = len(policy) - sum(1 for k in protected if k in policy)
            n = min(-(-(deficit - freed) // unit), avail)
            victims = policy.evict(n, protected) if n > 0 else []
            paths = [self.parts.layout.path_of(v) for v in victims]
            for v in victims:
                index.forget_locked(v, evicted=True)
            self.parts.stats.evictions += len(victims)
        removed = acct.unlink_files(st, paths)
        acct.log_events(st, [(b"-", bytes(v)) for v in victims])
        return freed + sum(s for _, s in removed)

    # -- reservation -----------------------------------------------------------------------------
    def _job_grant(self, state: JobState) -> set[BlockKey]:
        """Reserve room for the job (once); the same section also reserves for the jobs queued
        behind it, as long as they fit without evicting anything.

        The job itself may evict (exactly as before); a queued job that would need victims is left
        to reserve in its own section when its first chunk runs, after the jobs ahead of it have
        published. So which blocks are evicted and which stores are dropped is the same as with one
        section per job (the replay's simulate mode models that), only the lock trips are shared.
        """
        progress: StoreProgress = state.extra
        granted = progress.granted
        if granted is not None:  # set once, never changed afterwards
            return granted
        with self._grant_lock:
            if progress.granted is None:
                with self._lock:
                    queued = [j for j in self._grant_q if j.extra.granted is None and j is not state]
                    self._grant_q.clear()
                rest = queued
                try:
                    rest = self._reserve_jobs(state, queued)
                except OSError as exc:  # accounting file trouble: this job fails, the others retry
                    error = self._section_failed(exc)
                    with self._lock:
                        state.error = state.error or error
                finally:
                    if progress.granted is None:  # whatever went wrong, nothing was granted
                        progress.granted = set()
                    if rest:
                        with self._lock:
                            self._grant_q[:0] = rest  # still first in line, in submission order
            assert progress.granted is not None
            return progress.granted

    def _reserve_jobs(self, state: JobState, queued: list[JobState]) -> list[JobState]:
        """One section: reserve ``state``'s leading blocks that fit (evicting victims), then every
        queued job in order while it fits whole without eviction. Returns the jobs left ungranted."""
        file_size = self.parts.layout.file_size
        sizes = [file_size(len(k)) for k, _ in state.items]
        with self.parts.accounting.section() as st:
            me = self.parts.accounting.me(st)
            n = len(sizes)
            free, limit = None, self.parts.options.max_bytes
            if limit is not None:
                free = limit - st.usage
                if free < sum(sizes):
                    free += self.make_room(st, sum(sizes) - free)
                while n and sum(sizes[:n]) > free:
                    n -= 1
                free -= sum(sizes[:n])
            more, ahead = self._fitting(queued, free)
            me["reserved"] = int(me["reserved"]) + sum(sizes[:n]) + ahead
        state.extra.granted = {k for k, _ in state.items[:n]}
        for j in more:
            j.extra.granted = {k for k, _ in j.items}
        if n < len(state.items):
            with self._lock:
                state.error = state.error or "capacity: no evictable block (stores dropped)"
                self.parts.stats.dropped_stores += len(state.items) - n
        return queued[len(more) :]

    def _fitting(self, queued: list[JobState], free: int | None) -> tuple[list[JobState], int]:
        """The leading queued jobs that fit whole in ``free`` bytes (``None``: unbounded) without
        evicting anything, and their bytes."""
        file_size = self.parts.layout.file_size
        more: list[JobState] = []
        total = 0
        for j in queued:
            need = sum(file_size(len(k)) for k, _ in j.items)
            if free is not None:
                if need > free:
                    break
                free -= need
            total += need
            more.append(j)
        return more, total

    def _grant_ahead(self, st: AccountingState) -> list[JobState]:
        """Inside a publication's section: reserve for the queued jobs that fit without evicting
        (the reservation a job's first chunk would otherwise make in a section of its own). The
        caller holds the grant lock and marks them granted once the section is written (if it
        is not, each job's first chunk reserves for itself, as always)."""
        with self._lock:
            queued = [j for j in self._grant_q if j.extra.granted is None]
            self._grant_q.clear()
        limit = self.parts.options.max_bytes
        free = None if limit is None else limit - st.usage
        more, total = self._fitting(queued, free)
        me = self.parts.accounting.me(st)
        me["reserved"] = int(me["reserved"]) + total
        with self._lock:
            self._grant_q[:0] = queued[len(more) :]  # still first in line, in order
        return more

    # -- publication -----------------------------------------------------------------------------
    def _publish_jobs(self, batch: list[JobState]) -> None:
        written = [w for j in batch for w in j.extra.written]
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
                    mine_written = state.extra.written
                    mine = [k for k, _, _, _ in mine_written if k in ok]
                    for key, _ in state.items:
                        self.parts.index.storing.discard(key)
                    err = error if mine_written else None  # only jobs that wrote saw the failure
                    self._on_published(state, ChunkOutcome(mine, self.parts.block_bytes * len(mine), err))

    def _publish(self, written: list[Written]) -> list[BlockKey]:
        for _, _, final, _ in written:
            self.parts.dirs.ensure_for(final)  # normally done already; cheap set lookup then
        ok: list[BlockKey] = []
        # Non-blocking: a thread reserving holds the grant lock while it waits for the section
        # we hold, so waiting here could deadlock; it is held until the grants are marked, so a
        # job's first chunk never reserves a second time for what this section reserved.
        granting = bool(self._grant_q) and self._grant_lock.acquire(blocking=False)
        try:
            ahead = self._publish_in_section(written, ok, granting)
            for j in ahead:  # reserved in the file now: their first chunks need no section
                j.extra.granted = {k for k, _ in j.items}
        finally:
            if granting:
                self._grant_lock.release()
        if self.parts.options.fsync:
            for d in {os.path.dirname(f) for _, _, f, _ in written}:
                fsync_dir(d)
        return ok

    def _publish_in_section(
        self, written: list[Written], ok: list[BlockKey], granting: bool
    ) -> list[JobState]:
        """One section: the renames (journaled), the index, the event log, and (``granting``) the
        reservations of the queued jobs that fit; appends the published keys to ``ok``."""
        now = time.time()
        acct = self.parts.accounting
        with acct.section() as st:
            flags = acct.publish(st, [(tmp, final, size) for _, tmp, final, size in written])
            with self._lock:
                for (key, _, _, size), good in zip(written, flags, strict=True):
                    if not good:
                        continue
                    ok.append(key)
                    self.parts.index.tombstones.discard(key)
                    if key in self.parts.index.sizes:
                        continue
                    self._insert_locked(st, key, size, now)
            acct.log_events(st, [(b"+", bytes(k)) for k in ok])
            return self._grant_ahead(st) if granting else []

    def _insert_locked(self, st: AccountingState, key: BlockKey, size: int, when: float) -> None:
        """Index a block now in the tree (tier lock + accounting section held)."""
        index = self.parts.index
        policy = index.policy
        if len(policy) >= policy.capacity:
            for v in policy.evict(1, index.protected_locked()):
                index.sizes.pop(v, None)
                index.access.pop(v, None)
                self.parts.accounting.unlink_files(st, [self.parts.layout.path_of(v)])
                self.parts.accounting.log_events(st, [(b"-", bytes(v))])
                self.parts.stats.evictions += 1  # tier lock held by the caller
        index.add_locked(key, size, when)

    # -- failures --------------------------------------------------------------------------------
    def _section_failed(self, exc: OSError) -> str:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            self.parts.gate.pause(self.parts.options.full_backoff, DISK_FULL)
        error = f"{type(exc).__name__}: {exc}"
        self.parts.rlog.warning("acct", f"kvtier fs {self.parts.name}: store failed: {error}")
        return error

    def _unpublished(self, written: list[Written]) -> None:
        """Publishing failed before the renames (mkdir or accounting I/O): drop the temp files and
        give their reservations back, so nothing leaks until the process dies."""
        back = 0
        for _, tmp, _, size in written:
            if self.parts.accounting.unlink_temp(tmp):
                back += size
        with contextlib.suppress(OSError):
            self.parts.accounting.release(back)

    def _store_failed(self, exc: OSError, tmp: str, size: int) -> str:
        self.parts.accounting.unlink_temp(tmp)
        with contextlib.suppress(OSError):
            self.parts.accounting.release(size)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            self.parts.gate.pause(self.parts.options.full_backoff, DISK_FULL)
            self.parts.rlog.warning(
                "enospc",
                f"kvtier fs {self.parts.name}: disk full under {self.parts.layout.ns_dir}; dropping stores",
            )
        else:
            self.parts.rlog.warning(
                "write", f"kvtier fs {self.parts.name}: write failed under {self.parts.layout.ns_dir}: {exc}"
            )
        return f"{errno.errorcode.get(exc.errno or 0, 'OSError')}: {exc.strerror or exc}"
