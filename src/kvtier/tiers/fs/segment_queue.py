"""Small store jobs on the small-block path, written in batches (docs/fs.md, "Small blocks").

A one-block store job of a few KiB costs more in hand-offs than in I/O: a worker task of its own,
a ``pwritev``, an index append and several trips through the tier's lock, each per job. Jobs of at
most ``batch_blocks`` blocks are therefore queued here instead of each getting a task: a submission
starts a *flusher* task only while fewer than ``flushers`` run; a flusher takes every queued job
(up to 64 blocks and 4 MiB), writes them as one batch
(:meth:`~kvtier.tiers.fs.segments.SegmentStore.write_jobs`: one ``pwritev`` and one index append
per segment), settles them in one trip through the tier's lock, and loops until the queue is empty.
A lone job still starts a flusher at once (no waiting for company); jobs that arrive while the
flushers write are the ones that share a batch. The guarantees per block are those of
:meth:`~kvtier.tiers.fs.segments.SegmentStore.write_chunk` (data, then index record, then report),
and every queued job is reported exactly once, whatever a batch raises.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from kvtier.keys import BlockKey
from kvtier.tiers.async_tier import ChunkOutcome, JobState
from kvtier.tiers.ratelog import RateLimitedLog

__all__ = ["FLUSHERS", "MAX_BATCH_BLOCKS", "MAX_BATCH_BYTES", "StoreQueue", "each_job"]

#: Flusher tasks writing queued jobs at once (the fs tier's choice). The writes of one segment
#: serialise in the kernel (one file), so more flushers add lock and GIL hand-offs, not throughput:
#: 64 one-block jobs of 64 KiB, ratio to raw appends in bench_fs.py, four runs each: 1 flusher
#: 0.51-0.57, 2 flushers 0.32-0.61, a worker task per job (before the queue) 0.24-0.40.
FLUSHERS = 1

#: Most blocks one batch writes (bounds a batch's latency and its iovec).
MAX_BATCH_BLOCKS = 64
#: Most payload bytes one batch writes (the fs tier's bound, with ``MAX_BATCH_BLOCKS``): one
#: ``pwritev`` of a few MiB, whatever ``small_block_bytes`` says (1, 4 and 0.25 MiB measured alike).
MAX_BATCH_BYTES = 4 << 20


class StoreQueue:
    """Queued small store jobs and the count of flushers writing them (see the module doc).

    Args:
        write: writes a batch of jobs, one outcome each (``SegmentStore.write_jobs``).
        settle: records one job's outcome and reports it (``lock`` held; once per job).
        lock: the tier's lock, taken once per batch around the ``settle`` calls.
        flushers: most flusher tasks running at once.
        block_bytes: payload bytes per block (a batch holds at most ``max_bytes`` of them).
        max_blocks: most blocks per batch. max_bytes: most payload bytes per batch.
        log: where an exception ``settle`` raised is logged (a bug; the flusher goes on).
    """

    def __init__(
        self,
        write: Callable[[list[JobState]], list[ChunkOutcome]],
        settle: Callable[[JobState, ChunkOutcome], None],
        *,
        lock: threading.Lock,
        flushers: int,
        block_bytes: int = 1,
        max_blocks: int = MAX_BATCH_BLOCKS,
        max_bytes: int = MAX_BATCH_BYTES,
        log: RateLimitedLog | None = None,
    ) -> None:
        self._write = write
        self._settle = settle
        self._settle_lock = lock
        self._log = log
        self.flushers = max(1, flushers)
        self.max_blocks = max(1, min(max_blocks, max_bytes // max(block_bytes, 1)))
        self._lock = threading.Lock()
        self._queue: collections.deque[JobState] = collections.deque()
        self._running = 0
        self.batches = 0  #: batches written (stats)

    def put(self, state: JobState) -> bool:
        """Queue ``state``; ``True`` when the caller must start a flusher task (:meth:`flush`)."""
        with self._lock:
            self._queue.append(state)
            if self._running < self.flushers:
                self._running += 1
                return True
            return False

    def flush(self) -> None:
        """Write queued jobs in batches until none is left (a worker task; never raises)."""
        while True:
            with self._lock:
                if not self._queue:
                    self._running -= 1  # under the lock put() checks: no job is left behind
                    return
                batch = [self._queue.popleft()]
                blocks = len(batch[0].items)
                while self._queue and blocks + len(self._queue[0].items) <= self.max_blocks:
                    blocks += len(self._queue[0].items)
                    batch.append(self._queue.popleft())
            try:
                outcomes = self._write(batch)
            except Exception as exc:  # a bug or an unmapped error: the jobs fail, the flusher lives
                outcomes = [ChunkOutcome(error=f"{type(exc).__name__}: {exc}") for _ in batch]
            self.batches += 1
            try:
                with self._settle_lock:
                    for state, outcome in zip(batch, outcomes, strict=True):
                        self._settle(state, outcome)
            except Exception:  # never leave the queue without a flusher
                if self._log is not None:
                    self._log.warning("settle", "kvtier fs: error settling store jobs", exc_info=True)


def each_job(
    chunk: Callable[[JobState, list[tuple[BlockKey, int]]], ChunkOutcome],
    states: list[JobState],
    log: RateLimitedLog,
) -> list[ChunkOutcome]:
    """A batch written one ``chunk(state, items)`` call per job (the chunk seam fault-injection
    tests replace); a call that raises fails its job only, as ``AsyncTier._run_chunk`` does."""
    out = []
    for state in states:
        try:
            out.append(chunk(state, state.items))
        except Exception as exc:
            log.warning("chunk-store", "kvtier fs: unexpected error in a store chunk", exc_info=True)
            out.append(ChunkOutcome(error=f"{type(exc).__name__}: {exc}"))
    return out
