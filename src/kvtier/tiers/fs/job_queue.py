"""Queued work of the fs tier run in batches by a few *flusher* tasks (one worker task per batch).

A one-block job costs more in hand-offs than in I/O when the I/O is fast: a worker task of its own,
a foreign call that releases and retakes the GIL, and several trips through the tier's lock, each
per job. Work that can run as one batch is therefore queued here instead of each piece getting a
task: a submission starts a flusher task only while fewer than ``flushers`` run; a flusher takes a
batch of queued entries, runs it with one ``run`` call, settles every entry in one trip through the
tier's lock, and loops until the queue is empty. A lone entry still starts a flusher at once (no
waiting for company); entries that arrive while the flushers work are the ones that share a batch.

Two users (docs/fs.md):

* small store jobs on the small-block path (``segment_queue.py``): one flusher, which takes every
  queued job up to the batch bounds (the writes of one segment serialise in the kernel anyway);
* chunks of load jobs read through the batched reader (``batchread.py``): as many flushers as the
  tier has threads, each taking its *share* (the queued blocks divided by the flushers, rounded
  up), so the reads stay spread over the threads exactly as one task per chunk spread them, while
  each thread pays one hand-off per batch instead of one per chunk.

Every queued entry is settled exactly once (or, when settling it raised, handed to ``fail``),
whatever a batch raises.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from kvtier.keys import BlockKey
from kvtier.tiers.async_tier import ChunkOutcome, JobState
from kvtier.tiers.ratelog import RateLimitedLog

__all__ = ["JobChunk", "JobQueue", "chunk_blocks", "each_chunk", "job_blocks"]

E = TypeVar("E")
#: One queued chunk of a job: the job and the chunk's ``(key, slot)`` pairs.
JobChunk = tuple[JobState, list[tuple[BlockKey, int]]]


def job_blocks(state: JobState) -> int:
    """The blocks of a queued job (the small-block store queue's entries)."""
    return len(state.items)


def chunk_blocks(chunk: JobChunk) -> int:
    """The blocks of a queued chunk."""
    return len(chunk[1])


class JobQueue(Generic[E]):
    """Queued entries and the count of flushers running them (see the module doc).

    Args:
        run: runs a batch of entries, one outcome each, in order; it may stop early, after at
            least one entry: the entries it returns no outcome for go back to the front of the
            queue, in order (for an entry that must wait until the ones before it are settled).
        settle: records one entry's outcome (``lock`` held; once per entry); ``True`` when the
            entry needs ``after``.
        blocks: the blocks of one entry (what the batch bounds count).
        lock: the tier's lock, taken once per batch around the ``settle`` calls.
        flushers: most flusher tasks running at once.
        max_blocks: most blocks per batch (an entry larger than that is a batch of its own).
        share: a batch takes at most the queued blocks divided by ``flushers`` (rounded up), so
            concurrent flushers split a burst instead of the first one taking it all.
        after: called once per batch, without the lock, with the entries whose ``settle`` said
            so (a step that takes other locks: a publication).
        fail: called without the lock with the entries whose ``settle`` or ``after`` raised (a
            bug): the owner reports their jobs failed, so no job is left unreported.
        step_aside: asked after each batch with the flusher's continuation; ``True`` when it
            queued that continuation as a new worker task (more urgent work was waiting: the
            flusher then ends here and carries on behind it), ``False`` to keep going.
        log: where an exception ``settle``, ``after`` or ``fail`` raised is logged (a bug; the
            flusher goes on).
    """

    def __init__(
        self,
        run: Callable[[list[E]], list[ChunkOutcome]],
        settle: Callable[[E, ChunkOutcome], bool],
        *,
        blocks: Callable[[E], int],
        lock: threading.Lock,
        flushers: int,
        max_blocks: int,
        share: bool = False,
        after: Callable[[list[E]], None] | None = None,
        fail: Callable[[list[E]], None] | None = None,
        step_aside: Callable[[Callable[[], None]], bool] | None = None,
        log: RateLimitedLog | None = None,
    ) -> None:
        self._run = run
        self._settle = settle
        self._after = after
        self._step_aside = step_aside
        self._fail = fail
        self._blocks = blocks
        self._settle_lock = lock
        self._log = log
        self.flushers = max(1, flushers)
        self.max_blocks = max(1, max_blocks)
        self.share = share
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[E, int]] = collections.deque()
        self._queued_blocks = 0
        self._running = 0
        self.batches = 0  #: batches run (stats)

    def put(self, entry: E) -> bool:
        """Queue ``entry``; ``True`` when the caller must start a flusher task (:meth:`flush`)."""
        n = self._blocks(entry)
        with self._lock:
            self._queue.append((entry, n))
            self._queued_blocks += n
            if self._running < self.flushers:
                self._running += 1
                return True
            return False

    def flush(self) -> None:
        """Run queued entries in batches until none is left (a worker task; never raises)."""
        while True:
            batch = self._take()
            if batch is None:
                return
            outcomes = self._run_batch(batch)
            try:
                self._settle_all(batch[: len(outcomes)], outcomes)
            finally:
                # Entries ``run`` left go back only now: the ones before them are settled (and,
                # for stores, published), which is what they waited for.
                if len(outcomes) < len(batch):
                    self._put_back(batch[len(outcomes) :])
            # Still counted as running: the continuation takes the next batch (or counts out).
            if self._step_aside is not None and self._step_aside(self.flush):
                return

    def _run_batch(self, batch: list[E]) -> list[ChunkOutcome]:
        try:
            outcomes = self._run(batch)
            if not outcomes or len(outcomes) > len(batch):
                raise RuntimeError(f"{len(outcomes)} outcomes for a batch of {len(batch)}")
        except Exception as exc:  # a bug or an unmapped error: the batch fails, the flusher lives
            outcomes = [ChunkOutcome(error=f"{type(exc).__name__}: {exc}") for _ in batch]
        return outcomes

    def _settle_all(self, batch: list[E], outcomes: list[ChunkOutcome]) -> None:
        """``settle`` each entry (one lock trip), ``after`` for those that asked; an entry whose
        ``settle`` or ``after`` raised (a bug) goes to ``fail``, so its job is still reported."""
        then: list[E] = []
        lost: list[E] = []
        with self._settle_lock:
            for entry, outcome in zip(batch, outcomes, strict=True):
                try:
                    if self._settle(entry, outcome):
                        then.append(entry)
                except Exception:
                    self._warn("error settling queued work")
                    lost.append(entry)
        if then and self._after is not None:
            try:
                self._after(then)
            except Exception:
                self._warn("error finishing queued work")
                lost.extend(then)
        if lost and self._fail is not None:
            try:
                self._fail(lost)
            except Exception:  # never leave the queue without a flusher
                self._warn("error failing queued work")

    def _warn(self, what: str) -> None:
        if self._log is not None:
            self._log.warning("settle", f"kvtier fs: {what}", exc_info=True)

    def _put_back(self, entries: list[E]) -> None:
        """Entries a batch left (see ``run``), back at the front of the queue in order."""
        sized = [(entry, self._blocks(entry)) for entry in entries]
        with self._lock:
            self._queue.extendleft(reversed(sized))
            self._queued_blocks += sum(n for _, n in sized)

    def _take(self) -> list[E] | None:
        """The next batch (``None``, and this flusher counted out, when the queue is empty)."""
        with self._lock:
            if not self._queue:
                self._running -= 1  # under the lock put() checks: no entry is left behind
                return None
            cap = self.max_blocks
            if self.share:
                cap = max(1, min(cap, -(-self._queued_blocks // self.flushers)))
            entry, n = self._queue.popleft()
            batch, blocks = [entry], n
            while self._queue and blocks + self._queue[0][1] <= cap:
                entry, n = self._queue.popleft()
                batch.append(entry)
                blocks += n
            self._queued_blocks -= blocks
            self.batches += 1
            return batch


def each_chunk(
    chunk: Callable[[JobState, list[tuple[BlockKey, int]]], ChunkOutcome],
    entries: list[JobChunk],
    log: RateLimitedLog,
) -> list[ChunkOutcome]:
    """A batch run one ``chunk(state, items)`` call per entry (the chunk seams fault-injection
    tests replace); a call that raises fails its entry only, as ``AsyncTier._run_chunk`` does."""
    out = []
    for state, items in entries:
        try:
            out.append(chunk(state, items))
        except Exception as exc:
            what = "load" if state.load else "store"
            log.warning(f"chunk-{what}", f"kvtier fs: unexpected error in a {what} chunk", exc_info=True)
            out.append(ChunkOutcome(error=f"{type(exc).__name__}: {exc}"))
    return out
