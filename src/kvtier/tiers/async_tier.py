"""``AsyncTier``: the base of every tier that does I/O -- and the guide to writing one.

:class:`AsyncTier` implements the job half of the :class:`~kvtier.tiers.base.SecondaryTier`
contract once, so a tier (fs, Redis, S3, Mooncake, p2p) writes only its medium's block I/O and its
index. The base owns:

* **Chunking.** A job's ``(key, slot)`` pairs are split into chunks of
  :func:`chunk_size` pairs (spread over ``threads`` workers, at most ``batch_blocks`` each; a tier
  whose client spreads one batched call itself sets ``spreads_jobs = False``: chunks of
  ``batch_blocks``) and run on the tier's :class:`~kvtier.transfer.workers.WorkerPool`: loads
  before stores, FIFO within each.
* **Exactly-once reporting with partial success.** Chunk outcomes are merged into the job's
  :class:`JobState`; when the last chunk is in, the job is reported once through
  :meth:`~AsyncTier.get_finished_jobs`, with ``successful_keys`` when only some keys made it.
* **Shutdown.** A job submitted after :meth:`~AsyncTier.shutdown` is reported as a failed job
  (``error="tier is shut down"``); it never raises. ``shutdown`` waits for queued chunks, stops the
  workers and calls :meth:`~AsyncTier._close_resources`. Engine bugs (a slot outside the buffer, a
  job id still in flight) raise :class:`~kvtier.errors.MisuseError` at once.
* **Back-pressure.** Before a store is queued the base asks ``self.store_gate``
  (a :class:`~kvtier.tiers.backpressure.StoreGate`): accepted, or dropped and counted in
  ``stats.dropped_stores`` as a failed job. A tier that finds its medium full calls
  ``self.store_gate.pause(seconds, reason)``; every finished store job's bytes and seconds are fed
  to ``store_gate.observe``, whose latency-per-MiB moving average throttles, then drops, stores
  with hysteresis (marks from the tier config's ``backpressure`` mapping; the gate's counters are
  part of ``get_stats()``).
* **Logs and stats.** ``self.rlog`` is a :class:`~kvtier.tiers.ratelog.RateLimitedLog` on the
  tier's logger; a chunk that raises is logged there (with its traceback) and fails its keys. The
  base counts ``stores``/``loads``/``bytes_*`` (from chunk outcomes), ``failed_jobs`` and
  ``dropped_stores``, all under ``self._lock``; :meth:`~AsyncTier.get_stats` reads them under it.

Writing a tier
--------------
Subclass :class:`AsyncTier`, call ``super().__init__(primary_kv_view=..., context=..., threads=...,
batch_blocks=..., logger=...)`` first, then implement:

``lookup(key)`` -- **engine thread, must not block.** Answer from memory: a local index, a bloom
    filter, a cache of existence answers. A remote tier that does not know yet answers ``RETRY``
    and may start a check with ``self.run_on_worker(Priority.LOAD, fn)``; it never waits for it.
``_store_chunk(state, items) -> ChunkOutcome`` -- **worker thread, may block** (bounded: every
    network call has a timeout, so ``drain``/``shutdown`` end). ``items`` are ``(key, slot)``;
    read the payload with ``self.slot_array(slot)`` (zero-copy; the slot stays pinned only until
    the job is reported, so copy whatever must outlive your chunk). Return the keys written
    (``done``), their payload bytes (``nbytes``), a short ``error`` for what failed, and the keys
    found already held (``held``: they count as stored).
``_load_chunk(state, items) -> ChunkOutcome`` -- **worker thread, may block**: fill exactly
    ``block_bytes`` of ``self.slot_array(slot)`` per key, verify what the medium can corrupt, and
    leave missing/corrupt keys out of ``done``. Never write a slot you then leave out of ``done``
    with bytes of another key (a wrong byte is worse than a miss).

Optional hooks: :meth:`~AsyncTier._before_store` / :meth:`~AsyncTier._before_load` (engine thread,
``self._lock`` held, memory only: skip keys already held by moving them to ``state.ok``, mark keys in
flight), :meth:`~AsyncTier._complete` (worker thread, after the last chunk: a final step such as the
fs tier's group publish; it must end in :meth:`~AsyncTier._report` /
:meth:`~AsyncTier._report_locked`), :meth:`~AsyncTier._close_resources` (connections, threads,
files), and the capability class attributes (``medium``, ``persistent``, ``shared``,
``tolerates_off_thread_polling``: the base's own bookkeeping is thread-safe, so set it when your
``lookup`` is too). A tier whose "I/O" is a memory copy sets ``runs_inline`` (each job runs as one
chunk inside ``submit_*``; see :mod:`kvtier.tiers.example`). A tier whose capacity is not
``max_bytes // block_bytes`` overrides the :meth:`~kvtier.tiers.base.SecondaryTier.simulation`
classmethod, so ``kvtier replay --simulate`` models it.

Reporting failures: *never raise* out of a chunk on purpose -- return an outcome with ``error`` (a
raised exception also fails the chunk, but it is logged as unexpected). Log with
``self.rlog.warning(reason, msg)`` (never secrets: no passwords, tokens or full URLs with
credentials). Count ``evictions`` and ``corrupt`` yourself under ``self._lock``.

A minimal shape (a key-value server with a client whose calls may block)::

    class KvServerTier(AsyncTier):
        medium = "REMOTE"

        def lookup(self, key, req_context=None):
            return LookupResult.HIT if key in self._known else LookupResult.RETRY

        def _store_chunk(self, state, items):
            try:
                self._client.put_many({k: self.slot_array(s) for k, s in items})
            except ServerFull as exc:
                self.store_gate.pause(1.0, f"server full: {exc}")
                return ChunkOutcome(error="server full")
            with self._lock:
                self._known.update(k for k, _ in items)
            return ChunkOutcome(done=[k for k, _ in items], nbytes=len(items) * self.block_bytes)

        def _load_chunk(self, state, items):
            ...  # fetch, verify, copy into self.slot_array(slot); done = the keys filled

Test it with :class:`kvtier.testing.AsyncTierContractTests` (the tier contract plus the base's
guarantees: failed chunks, shutdown, back-pressure).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kvtier.errors import ConfigError, MisuseError
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey
from kvtier.numbers import COUNT, SECONDS, Range, Ranges, check_number
from kvtier.tiers.backpressure import GATE_RANGES, StoreGate
from kvtier.tiers.base import SecondaryTier, TierContext
from kvtier.tiers.ratelog import RateLimitedLog
from kvtier.transfer.workers import Priority, WorkerPool

__all__ = [
    "MAX_THREADS",
    "AsyncTier",
    "ChunkOutcome",
    "JobState",
    "check_seconds",
    "check_worker_options",
    "chunk_size",
]

#: Most worker threads one tier may start (each is a real OS thread; more only adds contention).
MAX_THREADS = 256

Item = tuple[BlockKey, int]


def check_seconds(key: str, value: object) -> float:
    """``value`` as a finite, positive number of seconds (:data:`kvtier.numbers.SECONDS`), else a
    ``ConfigError`` naming ``key``."""
    return float(check_number(key, value, SECONDS))


def check_worker_options(threads: object, batch_blocks: object, log_interval: object) -> float:
    """Check :class:`AsyncTier`'s own options (``ConfigError`` naming the key); returns the log
    interval in seconds. Subclasses' ``check_options`` call it too."""
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise ConfigError("threads", f"expected an integer 1..{MAX_THREADS}, got {threads!r}")
    if isinstance(batch_blocks, bool) or not isinstance(batch_blocks, int) or batch_blocks < 1:
        raise ConfigError("batch_blocks", f"expected an integer >= 1, got {batch_blocks!r}")
    return check_seconds("log_interval", log_interval)


def chunk_size(n: int, *, batch_blocks: int, threads: int) -> int:
    """Pairs per chunk for a job of ``n`` pairs: spread over ``threads``, at most ``batch_blocks``.

    The simulator uses the same function (through the tier's simulation profile), so modelled and
    real chunking cannot drift apart.
    """
    return max(1, min(batch_blocks, -(-n // max(threads, 1))))


@dataclass(frozen=True, slots=True)
class ChunkOutcome:
    """What one chunk did.

    Attributes:
        done: keys transferred (counted in ``stats.stores`` / ``stats.loads``).
        nbytes: their payload bytes (``stats.bytes_written`` / ``stats.bytes_read``).
        error: why the other keys were not (the job's ``error`` if it is the first).
        held: store only: keys found already held, so not written; they count as stored.
    """

    done: Sequence[BlockKey] = ()
    nbytes: int = 0
    error: str | None = None
    held: Sequence[BlockKey] = ()


@dataclass(eq=False)
class JobState:
    """Progress of one submitted job (shared by its chunks; fields change under the tier's lock).

    Attributes:
        job: the submitted job.
        load: ``True`` for a load (primary slots are filled), ``False`` for a store.
        items: the ``(key, slot)`` pairs still to transfer (``_before_*`` hooks may shrink it).
        ok: keys transferred so far (or already held, for a store).
        nbytes: payload bytes moved so far.
        error: the first failure reason seen.
        extra: the subclass's own per-job data (the fs tier keeps its reservation there).
    """

    job: TransferJob
    load: bool
    items: list[Item]
    ok: set[BlockKey] = field(default_factory=set)
    nbytes: int = 0
    error: str | None = None
    chunks_left: int = 0
    t0: float = field(default_factory=time.perf_counter)
    reported: bool = False
    extra: Any = None


class AsyncTier(SecondaryTier):
    """A :class:`SecondaryTier` whose jobs run in chunks on worker threads (see the module doc).

    Args:
        threads: worker threads (>= 1; ``ConfigError`` naming ``threads`` otherwise).
        batch_blocks: most blocks per chunk (>= 1).
        log_interval: seconds between two log lines of the same kind.
        logger: the tier's logger (default ``kvtier.tiers.<ClassName>``).
        store_gate: back-pressure policy (default: a plain pausable :class:`StoreGate`).
    """

    #: Run chunks on the submitting thread, each job as one chunk (no workers). For tiers whose
    #: "I/O" is a memory copy (the ``example`` tier); everything else stays the same.
    runs_inline: ClassVar[bool] = False
    option_ranges: ClassVar[Ranges] = {
        "threads": Range(1, MAX_THREADS, integer=True),
        "batch_blocks": COUNT,
        "log_interval": SECONDS,
        "backpressure": GATE_RANGES,
    }
    #: Spread a job's chunks over the workers (``False``: chunks of ``batch_blocks``, so a job of
    #: up to ``batch_blocks`` blocks is one chunk; for clients that parallelise one batched call
    #: themselves, where two concurrent half-size calls cost more than one).
    spreads_jobs: ClassVar[bool] = True

    def __init__(
        self,
        *,
        primary_kv_view: memoryview,
        context: TierContext,
        threads: int = 4,
        batch_blocks: int = 4,
        log_interval: float = 10.0,
        logger: logging.Logger | None = None,
        store_gate: StoreGate | None = None,
    ) -> None:
        super().__init__(primary_kv_view=primary_kv_view, context=context)
        interval = check_worker_options(threads, batch_blocks, log_interval)
        self.threads = threads
        self.batch_blocks = batch_blocks
        #: Most blocks per load chunk: ``batch_blocks`` unless a subclass whose loads cost one
        #: hand-off per chunk (the fs tier's batched reader) raises it.
        self.load_batch_blocks = batch_blocks
        self.log = logger or logging.getLogger(f"kvtier.tiers.{type(self).__name__}")
        self.rlog = RateLimitedLog(self.log, interval)
        self.store_gate = store_gate or StoreGate()
        #: Guards the job bookkeeping and ``stats``; subclasses use it for their in-memory state.
        self._lock = threading.Lock()
        self._results: list[JobResult] = []
        self._unpolled: set[int] = set()
        self._closed = False
        # Started on first use: a subclass constructor that raises after super().__init__ leaves
        # no thread behind.
        self._pool: WorkerPool | None = None

    # -- to implement ------------------------------------------------------------------------
    def _store_chunk(self, state: JobState, items: list[Item]) -> ChunkOutcome:
        """Write ``items`` (worker thread; may block, bounded). See the module doc."""
        raise NotImplementedError(f"{type(self).__name__} implements _store_chunk")

    def _load_chunk(self, state: JobState, items: list[Item]) -> ChunkOutcome:
        """Fill the slots of ``items`` (worker thread; may block, bounded). See the module doc."""
        raise NotImplementedError(f"{type(self).__name__} implements _load_chunk")

    # -- optional hooks ----------------------------------------------------------------------
    def _before_store(self, state: JobState) -> None:
        """Engine thread, ``self._lock`` held, memory only: drop pairs from ``state.items`` that
        need no write (add their keys to ``state.ok``: held keys count as stored)."""

    def _before_load(self, state: JobState) -> None:
        """Engine thread, ``self._lock`` held, memory only (e.g. protect the keys from eviction)."""

    def _complete(self, state: JobState) -> None:
        """Worker thread, no lock held, once per job after its last chunk. Default: report it.

        Override for a final step over the whole job (a commit, a publish); the override must
        lead to exactly one :meth:`_report` / :meth:`_report_locked` call (later or from another
        thread is fine; extra calls are ignored).
        """
        self._report(state)

    def _close_resources(self) -> None:
        """Release connections, threads and files; called once by :meth:`shutdown`, workers stopped."""

    # -- the contract ------------------------------------------------------------------------
    def submit_store(self, job: TransferJob) -> None:
        slots = self._check_job(job)
        if self._closed:
            self._fail_now(job, False, "tier is shut down")
            return
        reason = self.store_gate.admit(len(job.keys) * self.block_bytes)
        if reason is not None:
            with self._lock:
                self.stats.dropped_stores += len(job.keys)
            self._fail_now(job, False, reason)
            return
        state = JobState(job, False, _pairs(job, slots))
        with self._lock:
            self._before_store(state)
        self._launch(state, Priority.STORE)

    def submit_load(self, job: TransferJob) -> None:
        slots = self._check_job(job)
        if self._closed:
            self._fail_now(job, True, "tier is shut down")
            return
        state = JobState(job, True, _pairs(job, slots))
        with self._lock:
            self._before_load(state)
        self._launch(state, Priority.LOAD)

    def get_finished_jobs(self) -> list[JobResult]:
        with self._lock:
            out, self._results = self._results, []
            for result in out:
                self._unpolled.discard(result.job_id)
        return out

    def has_pending_work(self) -> bool:
        return bool(self._unpolled)

    def drain(self) -> None:
        pool = self._pool
        if pool is not None:
            pool.wait_idle()

    def get_stats(self) -> dict[str, int]:
        """The :class:`~kvtier.tiers.base.TierStats` counters plus the store gate's
        (``gate_state``, ``gate_throttled``, ``gate_ms_per_mib``)."""
        with self._lock:  # workers update the counters concurrently
            out = self.stats.as_dict()
        out.update(self.store_gate.counters())
        return out

    def shutdown(self) -> None:
        """Finish queued chunks, stop the workers, release resources. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        pool = self._pool
        if pool is not None:
            pool.wait_idle()
            pool.stop(timeout=30)
        self._close_resources()

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` was called (new jobs then fail at once)."""
        return self._closed

    # -- for subclasses ------------------------------------------------------------------------
    def run_on_worker(self, priority: Priority, fn: Callable[[], None]) -> bool:
        """Queue ``fn`` on this tier's workers (a background check, maintenance); ``False`` when the
        tier is shut down or runs inline. An exception escaping ``fn`` is logged, never raised."""
        if self._closed or self.runs_inline:
            return False
        return self._workers().submit(priority, fn)

    def _report(self, state: JobState) -> None:
        """Report ``state``'s job (once; later calls are ignored). Any thread, lock not held."""
        with self._lock:
            self._report_locked(state)

    def _report_locked(self, state: JobState) -> None:
        """:meth:`_report` with ``self._lock`` already held."""
        if state.reported:
            return
        state.reported = True
        job = state.job
        success = state.ok.issuperset(job.keys)
        error = state.error
        if not success:
            self.stats.failed_jobs += 1
            if error is None:
                missing = len(set(job.keys) - state.ok)
                error = f"{missing} of {len(set(job.keys))} key(s) not transferred"
        seconds = time.perf_counter() - state.t0
        partial = None if success else frozenset(state.ok)
        self._results.append(JobResult(job.job_id, success, partial, state.nbytes, seconds, error))
        if not state.load and state.nbytes:
            self.store_gate.observe(state.nbytes, seconds)

    def _report_broken(
        self, states: Iterable[JobState], error: str = "internal error finishing the job (see the log)"
    ) -> None:
        """Report jobs whose final step raised (a bug, already logged) as failed with ``error``
        (unless they carry one already); the ones already reported are left alone. Any thread,
        lock not held."""
        with self._lock:
            for state in states:
                state.error = state.error or error
                self._report_locked(state)

    def _record_locked(self, state: JobState, outcome: ChunkOutcome) -> None:
        """Merge a chunk's (or a final step's) outcome into the job and the stats (lock held)."""
        state.ok.update(outcome.done)
        state.ok.update(outcome.held)
        state.nbytes += outcome.nbytes
        if outcome.error and not state.error:
            state.error = outcome.error
        if state.load:
            self.stats.loads += len(outcome.done)
            self.stats.bytes_read += outcome.nbytes
        else:
            self.stats.stores += len(outcome.done)
            self.stats.bytes_written += outcome.nbytes

    # -- internals -----------------------------------------------------------------------------
    def _check_job(self, job: TransferJob) -> list[int]:
        """Raise on engine bugs (never on backend trouble); register the job as unpolled.
        Returns the job's slots as a list."""
        # A plain list: min/max of a few slots (one-block jobs are common) cost far less on a list
        # than two numpy reductions; _pairs reuses it.
        slots: list[int] = np.asarray(job.slot_ids).tolist()
        num_slots = self.rows.shape[0]
        if slots and (min(slots) < 0 or max(slots) >= num_slots):
            bad = next(s for s in slots if not 0 <= s < num_slots)
            raise MisuseError(
                f"tier {self.name!r}: job {job.job_id} names slot {bad} outside 0..{num_slots - 1}"
            )
        with self._lock:
            if job.job_id in self._unpolled:
                raise MisuseError(f"tier {self.name!r}: job id {job.job_id} is already in flight")
            self._unpolled.add(job.job_id)
        return slots

    def _fail_now(self, job: TransferJob, load: bool, error: str) -> None:
        self._report(JobState(job, load, [], error=error))

    def _launch(self, state: JobState, priority: Priority) -> None:
        items = state.items
        if not items:
            self._report(state)
            return
        if self.runs_inline:
            state.chunks_left = 1
            self._run_chunk(state, items)
            return
        pool = self._workers()
        for chunk in self._split(state):
            pool.submit(priority, functools.partial(self._run_chunk, state, chunk))

    def _split(self, state: JobState) -> list[list[Item]]:
        """``state``'s items in the chunks its job runs as (spread over the threads, each at most
        the batch size); sets ``chunks_left`` (before any chunk can finish)."""
        items = state.items
        spread = self.threads if self.spreads_jobs else 1
        cap = self.load_batch_blocks if state.load else self.batch_blocks
        per = chunk_size(len(items), batch_blocks=cap, threads=spread)
        chunks = [items[i : i + per] for i in range(0, len(items), per)]
        state.chunks_left = len(chunks)
        return chunks

    def _run_chunk(self, state: JobState, items: list[Item]) -> None:
        try:
            outcome = self._load_chunk(state, items) if state.load else self._store_chunk(state, items)
        except Exception as exc:  # a bug or an unmapped backend error: fail the chunk, keep going
            what = "load" if state.load else "store"
            self.rlog.warning(
                f"chunk-{what}", f"kvtier {self.name}: unexpected error in a {what} chunk", exc_info=True
            )
            outcome = ChunkOutcome(error=f"{type(exc).__name__}: {exc}")
        with self._lock:
            last = self._chunk_done_locked(state, outcome)
        if last:
            self._finish(state)

    def _chunk_done_locked(self, state: JobState, outcome: ChunkOutcome) -> bool:
        """Record one chunk's outcome (lock held); ``True`` when it was the job's last."""
        self._record_locked(state, outcome)
        state.chunks_left -= 1
        return state.chunks_left == 0

    def _finish(self, state: JobState) -> None:
        try:
            self._complete(state)
        except Exception as exc:  # the job is still reported exactly once
            self.rlog.warning(
                "complete", f"kvtier {self.name}: unexpected error finishing a job", exc_info=True
            )
            self._report_broken([state], f"{type(exc).__name__}: {exc}")

    def _workers(self) -> WorkerPool:
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = WorkerPool(self.threads, name=f"kvtier-{self.name}", logger=self.log)
                pool = self._pool
        return pool


def _pairs(job: TransferJob, slots: list[int]) -> list[Item]:
    return list(zip(job.keys, slots, strict=True))
