"""The ``fs`` tier: a bounded, checksummed, crash-safe, shareable directory of KV blocks.

What it guarantees (docs/fs.md has the full story):
    * **Never a wrong byte.** Every file is a :mod:`kvtier.codec` blob: header (key, namespace tag,
      lengths, xxh3-64) + payload. Loads check the length and the header always and the checksum
      unless ``verify="never"``; a bad file is a miss, counted in ``stats.corrupt`` and removed.
    * **Crash-safe writes.** Temp file in ``<ns>/tmp`` then ``rename`` into the tree; ``fsync=True``
      also syncs the file and its directory. A process killed at any point leaves no partial block.
    * **Bounded.** ``max_bytes`` is enforced through a flock-guarded accounting file shared by every
      process using the same ``root_dir`` (:mod:`kvtier.tiers.fs.accounting`): space is reserved
      before a temp file is written, so the tree never exceeds ``max_bytes``; victims come from a
      :class:`~kvtier.policies.base.CachePolicy` (``eviction_policy``, LRU by default).
    * **Warm restart.** A background thread rebuilds the index from the tree (names, sizes, mtimes);
      until it has passed a key's shard, a lookup that is not already known answers ``RETRY``.
    * **Never raises into the engine.** I/O errors are failed jobs, counted and logged (rate-limited);
      ``ENOSPC`` switches on back-pressure: stores are dropped and counted for ``full_backoff`` s;
      a slow disk (store latency per MiB over the ``backpressure`` marks) throttles, then drops,
      stores with hysteresis through the same :class:`~kvtier.tiers.backpressure.StoreGate`.

Lookups are answered from the in-memory index (a dict membership test: no syscall).

:class:`FsTier` is an :class:`~kvtier.tiers.async_tier.AsyncTier` (which owns job chunking,
exactly-once reports, shutdown checks and back-pressure) composed of collaborators, each given what
it uses in its constructor: :class:`~kvtier.tiers.fs.index.FsIndex` (the in-memory index),
:class:`~kvtier.tiers.fs.store_path.StorePath` (reservation, temp files, group publication),
:class:`~kvtier.tiers.fs.load_path.LoadPath` (verified reads),
:class:`~kvtier.tiers.fs.scan.TreeScanner` (keeping the index equal to the tree),
:class:`~kvtier.tiers.fs.accounting.SharedAccounting` (the cross-process byte accounting) and
:class:`~kvtier.tiers.fs.layout.Layout` (names and directories); the per-block syscalls live in
:mod:`kvtier.tiers.fs.io`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, cast

from kvtier.jobs import JobResult
from kvtier.keys import BlockKey, LookupResult
from kvtier.numbers import BYTES, SECONDS, Ranges
from kvtier.policies.base import CachePolicy
from kvtier.tiers.async_tier import AsyncTier, ChunkOutcome, JobState, check_worker_options
from kvtier.tiers.backpressure import GateConfig, StoreGate
from kvtier.tiers.base import SimulationProfile, SimulationRequest, TierContext
from kvtier.tiers.fs.accounting import AccountingState
from kvtier.tiers.fs.forms import STRIPED_ONLY, as_striped, refuse_striped_options
from kvtier.tiers.fs.index import FsIndex
from kvtier.tiers.fs.job_queue import JobChunk, JobQueue, chunk_blocks, each_chunk, job_blocks
from kvtier.tiers.fs.layout import ShardDirs
from kvtier.tiers.fs.load_path import LoadPath
from kvtier.tiers.fs.namespace import open_namespace, open_segments, pick_io
from kvtier.tiers.fs.options import SMALL_BLOCK_DEFAULT, read_options
from kvtier.tiers.fs.parts import FsParts
from kvtier.tiers.fs.policy import build_policy
from kvtier.tiers.fs.scan import TreeScanner
from kvtier.tiers.fs.segment_queue import FLUSHERS, MAX_BATCH_BLOCKS, MAX_BATCH_BYTES
from kvtier.tiers.fs.segments import SegmentStore
from kvtier.tiers.fs.sim import capacity_blocks
from kvtier.tiers.fs.store_path import StorePath
from kvtier.tiers.fs.trust import DEFAULT_SECRET_ENV
from kvtier.transfer.workers import Priority

__all__ = ["FsTier"]

#: Most blocks per load chunk when loads go through the batched reader (:mod:`.batchread`), and
#: per batched write of queued store chunks (:mod:`.batchwrite`).
_BATCHED_BLOCKS = 64
#: A load chunk of a job given up past its deadline: nothing read.
_ABANDONED = "abandoned: past the deadline"


log = logging.getLogger("kvtier.tiers.fs")


class FsTier(AsyncTier):
    """KV blocks as files under ``root_dir/<namespace>/``.

    Options (config keys of the ``secondary_tiers`` entry):
        root_dir: directory shared by every process and namespace (required).
        max_bytes: capacity, an integer or a size such as ``"200GiB"``; ``None`` = unbounded.
        eviction_policy: registered policy name (``lru``, ``arc``, ...) that picks victims.
        policy_options: keyword options for that policy.
        verify: ``"always"`` (check every payload checksum on load) or ``"never"`` (header only).
        fsync: ``True`` syncs each file and its directory before a store is reported done.
        direct_io: ``"auto"`` (``O_DIRECT`` writes when the filesystem supports them and the slot
            is aligned), ``"always"`` (error if unsupported) or ``"never"``.
        read_io: ``"auto"`` (``O_DIRECT`` reads exactly when writes are ``O_DIRECT``: such files are
            not in the page cache), ``"direct"`` (``O_DIRECT`` reads whenever supported) or
            ``"buffered"`` (through the page cache).
        threads: I/O worker threads. batch_blocks: blocks per worker task.
        full_backoff: seconds stores are dropped after ``ENOSPC``.
        record_access: refresh a file's mtime when it is loaded, at most once a minute (restart
            keeps the access order).
        log_interval: seconds between two log lines of the same kind.
        refresh_interval: seconds between two checks for other processes' stores and evictions.
        precreate_dirs: create all 272 shard directories in the background after the start-up
            scan (a fraction of a second), so stores do not create them on demand (a mkdir is an
            inode allocation, ~0.1-0.7 ms here, once per directory). On by default; a tree of the
            older 4,352-directory layout is pre-created only while a top-level shard is missing.
        shared_root: the root may be writable by others (several users, a shared volume); every
            block is then authenticated with a keyed MAC (:mod:`kvtier.tiers.fs.trust`). Without it
            a group/world-writable or foreign-owned root or namespace directory is refused.
        secret_env / secret_file: where a shared root's MAC secret comes from (an environment
            variable, default ``KVTIER_FS_SECRET``, or a 0600 file); never logged.
        backpressure: latency marks of the store gate shared by every tier
            (:class:`~kvtier.tiers.backpressure.GateConfig`): a disk whose store latency per MiB
            rises over ``high_water`` gets fewer stores, then none but probes, until it is back
            under ``low_water``. ``ENOSPC`` pauses the same gate for ``full_backoff`` s.
        small_block_bytes: blocks of at most this size are packed into append-only segments
            (:mod:`kvtier.tiers.fs.segments`) instead of one file each; ``0`` turns that off.
        segment_bytes: the size of one segment (default ``max_bytes / 16`` within 1-64 MiB).
    """

    medium: ClassVar[str] = "STORAGE"
    tolerates_off_thread_polling: ClassVar[bool] = True
    persistent: ClassVar[bool] = True
    shared: ClassVar[bool] = True
    option_ranges: ClassVar[Ranges] = {
        **AsyncTier.option_ranges,
        "max_bytes": BYTES,
        "full_backoff": SECONDS,
        "refresh_interval": SECONDS,
        "small_block_bytes": BYTES,
        "segment_bytes": BYTES,
    }

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # ``root_dirs`` (several disks) builds a striped tier of one FsTier per root (of this very
        # class, so a subclass's seams apply to every root); ``root_dir`` keeps the one-root tier.
        striped = as_striped(kwargs)
        if striped is not None:
            from kvtier.tiers.fs.roots import RootClass
            from kvtier.tiers.fs.striped import StripedFsTier

            return StripedFsTier(root_cls=cast(RootClass, cls), **striped)
        return super().__new__(cls)

    def __init__(
        self,
        *,
        primary_kv_view: memoryview,
        context: TierContext,
        root_dir: str | os.PathLike[str] | None = None,
        max_bytes: int | str | None = None,
        eviction_policy: str = "lru",
        policy_options: dict[str, Any] | None = None,
        verify: str = "always",
        fsync: bool = False,
        direct_io: str | bool = "auto",
        read_io: str = "auto",
        threads: int = 4,
        batch_blocks: int = 4,
        full_backoff: float = 1.0,
        record_access: bool = True,
        log_interval: float = 10.0,
        refresh_interval: float = 0.5,
        precreate_dirs: bool = True,
        shared_root: bool = False,
        secret_env: str = DEFAULT_SECRET_ENV,
        secret_file: str | None = None,
        backpressure: Mapping[str, Any] | None = None,
        small_block_bytes: int | str = SMALL_BLOCK_DEFAULT,
        segment_bytes: int | str | None = None,
        root_dirs: Sequence[Any] | None = None,
        io_timeout: float | None = None,
        probe_interval: float | None = None,
        fence_errors: int | None = None,
        simulate_fenced: Sequence[int] | None = None,
    ) -> None:
        refuse_striped_options(
            io_timeout=io_timeout, probe_interval=probe_interval, fence_errors=fence_errors,
            simulate_fenced=simulate_fenced,
        )  # fmt: skip
        super().__init__(
            primary_kv_view=primary_kv_view, context=context, threads=threads,
            batch_blocks=batch_blocks, log_interval=log_interval, logger=log,
            store_gate=StoreGate(GateConfig.from_options(backpressure)),
        )  # fmt: skip
        # Every option is checked before anything touches the disk (check_options runs the same).
        o = read_options(context, {
            "root_dir": root_dir, "max_bytes": max_bytes, "eviction_policy": eviction_policy,
            "policy_options": policy_options, "verify": verify, "fsync": fsync, "direct_io": direct_io,
            "full_backoff": full_backoff, "record_access": record_access,
            "refresh_interval": refresh_interval, "precreate_dirs": precreate_dirs,
            "shared_root": shared_root, "secret_env": secret_env, "secret_file": secret_file,
            "read_io": read_io, "small_block_bytes": small_block_bytes, "segment_bytes": segment_bytes,
        })  # fmt: skip
        self.layout, self.max_bytes, self.verify, self.fsync = o.layout, o.max_bytes, o.verify, o.fsync
        self.full_backoff, self.record_access = o.full_backoff, o.record_access
        self.refresh_interval, self.shared_root = o.refresh_interval, o.shared_root
        precreate, direct_io, policy = o.precreate_dirs, o.direct_io, o.policy
        read_io, seg_cap = o.read_io, o.segment_cap
        small = seg_cap is not None
        self._policy_name = eviction_policy
        #: Job ids a striped tier gave up on (a set: adds and membership tests are atomic).
        self._abandoned: set[int] = set()
        self._policy_options = dict(policy_options or {})
        self.accounting = open_namespace(self.layout, fsync=self.fsync, shared_root=self.shared_root)
        self.direct_io, self.read_direct = pick_io(self.accounting, self.layout, direct_io, read_io)
        # One listing of the namespace directory (<= ~260 entries) now: top-level shards that do not
        # exist hold nothing, so lookups there are authoritative MISSes at once.
        present = self.layout.present_tops()
        self.precreate_dirs = precreate and not small and self.layout.precreate_worthwhile(present)
        self.index = FsIndex(self._lock, policy, present, self.layout, self.removals)
        self.shard_dirs = ShardDirs(self.accounting.tree)
        parts = FsParts(
            self.name, self.layout, self.accounting, self.index, self.stats, self.rlog, o, self.rows,
            self.store_gate, self.shard_dirs,
        )  # fmt: skip
        self._open_small_path(parts, seg_cap)
        self._build_paths(parts)
        self.accounting.on_events = self._scanner.apply_events
        self.accounting.on_epoch_change = self._scanner.on_epoch_change
        self._scanner.start()

    def _open_small_path(self, parts: FsParts, seg_cap: int | None) -> None:
        """The small-block path: the segment store and the queue its stores join (both ``None``
        when blocks are large enough for one file each)."""
        #: The small-block path (``None``: one file per block).
        self.segments: SegmentStore | None = None if seg_cap is None else open_segments(parts, seg_cap)
        self._small_jobs: JobQueue[JobState] | None = None
        if self.segments is not None:
            self._small_jobs = JobQueue(
                self._store_small, self._settled_locked, blocks=job_blocks, lock=self._lock,
                flushers=FLUSHERS, max_blocks=min(MAX_BATCH_BLOCKS, MAX_BATCH_BYTES // self.block_bytes),
                fail=self._report_broken, step_aside=self._behind_loads, log=self.rlog,
            )  # fmt: skip

    def _build_paths(self, parts: FsParts) -> None:
        """The store path, the load path and the tree scanner, over the same parts."""
        self._store = StorePath(
            parts, direct_io=self.direct_io, on_published=self._published_locked,
            # batched writes (one C call per chunk) unless a subclass overrides the write seam
            write_file=None if type(self)._write_file is FsTier._write_file else self._write_file,
        )  # fmt: skip
        self._load = LoadPath(
            parts, rows=self.rows, block_bytes=self.block_bytes, verify=self.verify,
            record_access=self.record_access, direct_io=self.read_direct,
        )  # fmt: skip
        if self._load.batched:
            # One GIL hand-off per chunk: a load is spread over the threads in as few chunks as
            # that allows (an engine's loop holding the GIL makes every extra hand-off a wait).
            self.load_batch_blocks = max(self.batch_blocks, _BATCHED_BLOCKS)
        self._scanner = TreeScanner(
            parts, new_policy=self._new_policy, make_room=self._store.make_room,
            precreate_dirs=self.precreate_dirs,
        )  # fmt: skip
        self._open_file_queues()

    def _open_file_queues(self) -> None:
        """The queues of load and store chunks on the one-file-per-block path (job_queue.py): a
        burst of one-block jobs (one per request) runs in shares of the threads, one foreign call
        and one trip through the lock per share instead of per job; between two batches a store
        flusher steps aside for a waiting load (loads are what the engine waits for)."""
        #: Chunks waiting for the batched reader / writer (``None``: one task per chunk).
        self._load_jobs: JobQueue[JobChunk] | None = None
        self._file_stores: JobQueue[JobChunk] | None = None
        if self.segments is not None:
            return
        if self._load.batched:
            self._load_jobs = JobQueue(
                self._load_batch, self._load_settled_locked, blocks=chunk_blocks, lock=self._lock,
                flushers=self.threads, max_blocks=self.load_batch_blocks, share=True,
                fail=self._report_chunks_broken, log=self.rlog,
            )  # fmt: skip
        if self._store.batched:
            self._file_stores = JobQueue(
                self._store_batch, self._store_settled_locked, blocks=chunk_blocks, lock=self._lock,
                flushers=self.threads, max_blocks=_BATCHED_BLOCKS, share=True,
                after=self._stores_written, fail=self._report_chunks_broken, log=self.rlog,
                step_aside=self._behind_loads,
            )  # fmt: skip

    @classmethod
    def check_options(cls, context: TierContext, options: Mapping[str, Any]) -> None:
        """Every check of the constructor that writes nothing (see :func:`read_options`)."""
        striped = as_striped(options)
        if striped is not None:
            from kvtier.tiers.fs.roots import RootClass
            from kvtier.tiers.fs.striped import StripedFsTier

            StripedFsTier.check_options(context, striped, root_cls=cast(RootClass, cls))
            return
        bound = inspect.signature(cls).bind_partial(context=context, **options)
        bound.apply_defaults()
        args = dict(bound.arguments)
        check_worker_options(args.pop("threads"), args.pop("batch_blocks"), args.pop("log_interval"))
        GateConfig.from_options(args.pop("backpressure"))
        args.pop("context")
        striped_only = {k: args.pop(k) for k in STRIPED_ONLY}
        args.pop("root_dirs")
        read_options(context, args)  # a missing root_dir is named first
        refuse_striped_options(**striped_only)

    # -- simulation -------------------------------------------------------------------------
    @classmethod
    def simulate(cls, request: SimulationRequest) -> SimulationProfile:
        """The fs tier as the simulator sees it: ``max_bytes`` holds ``max_bytes // file_size``
        block files (header of a 16-byte key aligned to 4 KiB, then the payload); the policy is
        sized and built as :meth:`__init__` builds it. Room is made once per store job: the first
        chunk of a job reserves for the whole job (the group-commit reservation of
        :class:`~kvtier.tiers.fs.store_path.StorePath`), so ``threads`` and ``batch_blocks`` split
        the writes but never change which blocks are kept or dropped. Blocks on the small-block
        path (``block_bytes <= small_block_bytes``) are modelled approximately: the capacity is the
        records the segments hold, but real eviction is by segment with compaction. With
        ``root_dirs`` the striped model answers (:mod:`kvtier.tiers.fs.striped_sim`)."""
        striped = as_striped(request.options)
        if striped is not None:
            from kvtier.tiers.fs.roots import RootClass
            from kvtier.tiers.fs.striped_sim import simulate_striped

            return simulate_striped(
                dataclasses.replace(request, options=striped), cast(RootClass, cls), cls.medium
            )
        profile = super().simulate(request)
        cap = capacity_blocks(request)
        return profile if cap is None else dataclasses.replace(profile, capacity_blocks=cap)

    # -- lookups (engine thread; dict membership only) ---------------------------------------
    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        return self.stats.counted(self.index.answer(key))

    def lookup_many(self, keys: Sequence[BlockKey], req_context: Any = None) -> list[LookupResult]:
        index = self.index
        if not index.scan_done:
            return [self.lookup(k) for k in keys]
        sizes, hit, miss = index.sizes, LookupResult.HIT, LookupResult.MISS
        out = [hit if k in sizes else miss for k in keys]  # ~60 ns a key, no syscall
        self.stats.lookups += len(keys)
        self.stats.hits += out.count(hit)
        return out

    def touch(self, keys: Iterable[BlockKey]) -> None:
        now = time.time()
        with self._lock:
            self.index.touch_locked(keys, now)

    # -- AsyncTier hooks ---------------------------------------------------------------------
    # Each hook dispatches by block size: small blocks go to the segments, others to one file each.
    def _before_store(self, state: JobState) -> None:
        if self.segments is not None:
            self.segments.admit_locked(state)
        else:
            self._store.admit_locked(state)

    def _store_chunk(self, state: JobState, items: list[tuple[BlockKey, int]]) -> ChunkOutcome:
        if self.segments is not None:
            return self.segments.write_chunk(state, items)
        return self._store.write_chunk(state, items)

    def _launch(self, state: JobState, priority: Priority) -> None:
        if not state.items or self.runs_inline:
            super()._launch(state, priority)
        elif self._small_jobs is not None and not state.load:  # the small-block path
            if len(state.items) > self.batch_blocks:
                super()._launch(state, priority)
            elif self._small_jobs.put(state) and not self._workers().submit(priority, self._small_jobs.flush):
                self._small_jobs.flush()  # a bounded pool refused the task: never strand the queue
        else:  # one file per block: chunks for the batched reader / writer, in shares
            queue = self._load_jobs if state.load else self._file_stores
            if queue is None:
                super()._launch(state, priority)
                return
            for chunk in self._split(state):
                if queue.put((state, chunk)) and not self._workers().submit(priority, queue.flush):
                    queue.flush()  # a bounded pool refused the task: never strand the queue

    def _store_small(self, states: list[JobState]) -> list[ChunkOutcome]:
        """A batch of small store jobs (a ``_store_chunk`` replaced by a test sees each job)."""
        seg = self.segments
        if seg is None or "_store_chunk" in vars(self) or type(self)._store_chunk is not FsTier._store_chunk:
            return each_chunk(self._store_chunk, [(s, s.items) for s in states], self.rlog)
        return seg.write_jobs(states)

    def _settled_locked(self, state: JobState, outcome: ChunkOutcome) -> bool:
        self._record_locked(state, outcome)
        self._abandoned.discard(state.job.job_id)  # as _complete does
        self.index.storing.difference_update(k for k, _ in state.items)
        self._report_locked(state)
        return False

    def _before_load(self, state: JobState) -> None:
        self.index.begin_loads_locked(state.job.keys)

    def _load_chunk(self, state: JobState, items: list[tuple[BlockKey, int]]) -> ChunkOutcome:
        job_id = state.job.job_id
        if job_id in self._abandoned:
            return ChunkOutcome(error=_ABANDONED)
        if self.segments is not None:
            return self.segments.read_chunk(items)
        return self._load.read_chunk(items, lambda: job_id in self._abandoned)

    def _load_batch(self, chunks: list[JobChunk]) -> list[ChunkOutcome]:
        """Queued load chunks (of one job or several) in one batched read, one outcome each (a
        ``_load_chunk`` replaced by a test sees each chunk)."""
        if "_load_chunk" in vars(self) or type(self)._load_chunk is not FsTier._load_chunk:
            return each_chunk(self._load_chunk, chunks, self.rlog)
        out: list[ChunkOutcome] = [ChunkOutcome(error=_ABANDONED)] * len(chunks)
        live = [i for i, (state, _) in enumerate(chunks) if state.job.job_id not in self._abandoned]
        flags = [functools.partial(self._abandoned.__contains__, chunks[i][0].job.job_id) for i in live]
        read = self._load.read_chunks([chunks[i][1] for i in live], flags)
        for i, outcome in zip(live, read, strict=True):
            out[i] = outcome
        return out

    def _load_settled_locked(self, chunk: JobChunk, outcome: ChunkOutcome) -> bool:
        """A queued load chunk is done (lock held): what ``_run_chunk`` and ``_complete`` do."""
        if self._chunk_done_locked(chunk[0], outcome):
            self._loaded_locked(chunk[0])
        return False

    def _store_batch(self, chunks: list[JobChunk]) -> list[ChunkOutcome]:
        """Queued store chunks (of one job or several) in one batched write, one outcome each (a
        ``_store_chunk`` replaced by a test sees each chunk)."""
        if "_store_chunk" in vars(self) or type(self)._store_chunk is not FsTier._store_chunk:
            return each_chunk(self._store_chunk, chunks, self.rlog)
        return self._store.write_chunks(chunks)

    def _behind_loads(self, resume: Callable[[], None]) -> bool:
        # Between two batches a store flusher steps aside while a load waits (the engine waits
        # for loads): it requeues itself behind it, so a burst of stores delays a load one batch.
        return self._workers().step_aside(Priority.STORE, resume)

    def _report_chunks_broken(self, chunks: list[JobChunk]) -> None:
        self._report_broken(state for state, _ in chunks)

    def _store_settled_locked(self, chunk: JobChunk, outcome: ChunkOutcome) -> bool:
        """A queued store chunk is written (lock held); ``True`` when it was its job's last, which
        :meth:`_stores_written` then publishes (outside the lock)."""
        return self._chunk_done_locked(chunk[0], outcome)

    def _stores_written(self, chunks: list[JobChunk]) -> None:
        """Publish the jobs whose last chunks a batch wrote (together), then report them; what
        ``_complete`` does for one job (if it raises, the queue hands them to ``fail``)."""
        states = [state for state, _ in chunks]
        self._abandoned.difference_update(s.job.job_id for s in states)
        self._store.finish_jobs(states)

    def _loaded_locked(self, state: JobState) -> None:
        self._abandoned.discard(state.job.job_id)
        self.index.end_loads_locked(state.job.keys)
        self._report_locked(state)

    def _complete(self, state: JobState) -> None:
        if state.load:
            with self._lock:
                self._loaded_locked(state)
            return
        self._abandoned.discard(state.job.job_id)
        if self.segments is not None:
            self.segments.finish(state, self._report)  # each chunk indexed its own blocks
        else:
            self._store.finish(state)  # publishes (with other ready jobs), then reports

    def _published_locked(self, state: JobState, outcome: ChunkOutcome) -> None:
        self._record_locked(state, outcome)
        self._report_locked(state)

    def _write_file(self, tmp: str, key: BlockKey, slot: int) -> None:
        """Write one temp block file (the seam fault-injection tests override)."""
        self._store.write_file(tmp, key, slot)

    def _new_policy(self, capacity: int) -> CachePolicy:
        return build_policy(self._policy_name, capacity, self._policy_options)

    def abandon(self, job_id: int) -> None:
        """The caller gave job ``job_id`` up (its deadline passed): chunks of it not yet reading
        skip their reads, so no slot the engine may reuse is written. Its report still comes."""
        self._abandoned.add(job_id)
        self._load.note_abandon()

    def responsive(self, timeout: float) -> bool:
        """Whether this tier's lock can be taken within ``timeout`` s. A worker holds it across a
        few system calls (an eviction's unlink, an event-log append), so a disk that hangs there
        keeps it: a striped tier asks this before calling in, and fences the root instead."""
        if not self._lock.acquire(timeout=timeout):
            return False
        self._lock.release()
        return True

    def finished_nowait(self) -> list[JobResult] | None:
        """:meth:`get_finished_jobs` without waiting: ``None`` when the lock is held (ask again)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            out, self._results = self._results, []
            self._unpolled.difference_update(r.job_id for r in out)
        finally:
            self._lock.release()
        return out

    def wait_idle(self, timeout: float) -> bool:
        """:meth:`drain` for at most ``timeout`` s; ``False`` when work was still running then."""
        pool = self._pool
        return pool is None or pool.wait_idle(timeout)

    def _close_resources(self) -> None:
        self._scanner.join(timeout=30)
        if self.segments is not None:
            self.segments.close()
        self.accounting.close()

    def shutdown(self) -> None:
        self._scanner.request_stop()  # the scan stops between shards while the workers drain
        super().shutdown()

    # -- warm restart and sharing ----------------------------------------------------------------
    @property
    def scan_done(self) -> bool:
        return self.index.scan_done

    @property
    def tree_ready(self) -> threading.Event:
        """Set once the start-up scan and the shard-directory pre-creation are done."""
        return self._scanner.tree_ready

    @property
    def scan_files(self) -> int:
        return self._scanner.scan_files

    @property
    def scan_seconds(self) -> float:
        return self._scanner.scan_seconds

    def wait_scan(self, timeout: float | None = None) -> bool:
        """Block until the start-up scan finished (tests, tools)."""
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while not self.index.scan_done and time.monotonic() < deadline:
            time.sleep(0.002)
        return self.index.scan_done

    def refresh(self) -> None:
        """Apply other processes' stores and evictions now (normally done every refresh_interval)."""
        with self.accounting.section():
            pass
        if self.segments is not None:
            self.segments.refresh()

    # -- introspection -----------------------------------------------------------------------
    def usage(self, recover: bool = True) -> AccountingState:
        """The shared accounting (published + reserved bytes of every process); takes the lock.

        With ``recover`` (default) the sections of dead processes are cleaned up first.
        """
        return self.accounting.snapshot(recover)

    def indexed_keys(self) -> set[BlockKey]:
        with self._lock:
            return set(self.index.sizes)

    def get_stats(self) -> dict[str, int]:
        """Counters plus ``index_blocks``/``index_bytes`` (what this process's index holds),
        ``used_bytes`` (the whole shared tree, every process, as of this process's last accounting
        section: never a lock taken here) and ``max_bytes`` when bounded."""
        with self._lock:  # workers resize the index concurrently
            d = self.stats.as_dict()
            d["index_blocks"] = len(self.index.sizes)
            d["index_bytes"] = sum(self.index.sizes.values())
        d["used_bytes"] = self.accounting.last_usage
        if self.max_bytes is not None:
            d["max_bytes"] = self.max_bytes
        d["acct_sections"] = self.accounting.sections
        d["scan_done"] = int(self.index.scan_done)
        d["scan_files"] = self.scan_files
        d.update(self.store_gate.counters())  # gate_state, gate_throttled, gate_ms_per_mib
        if self.segments is not None:
            d.update(self.segments.stats())
        if self._small_jobs is not None:
            d["seg_store_batches"] = self._small_jobs.batches
        if self._load_jobs is not None:
            d["load_batches"] = self._load_jobs.batches
        if self._file_stores is not None:
            d["store_batches"] = self._file_stores.batches
        return d

    def config_info(self) -> dict[str, Any]:
        info = super().config_info()
        info.update(
            root_dir=self.layout.root_dir, ns_dir=self.layout.ns_dir, max_bytes=self.max_bytes,
            eviction_policy=self._policy_name, verify="always" if self.verify else "never",
            fsync=self.fsync, direct_io=self.direct_io, read_direct=self.read_direct, threads=self.threads,
            small_blocks=self.segments is not None,
            segment_bytes=None if self.segments is None else self.segments.segment_bytes,
        )  # fmt: skip
        return info


# ``__new__`` takes ``**kwargs`` (it only routes ``root_dirs``); the class's signature, which option
# checks (``create_tier``'s keyword check, :meth:`FsTier.check_options`) read, is ``__init__``'s.
FsTier.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    list(inspect.signature(FsTier.__init__).parameters.values())[1:]
)
