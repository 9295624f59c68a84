"""Small store jobs on the small-block path, written in batches (docs/fs.md, "Small blocks").

A one-block store job of a few KiB costs more in hand-offs than in I/O: a worker task of its own,
a ``pwritev``, an index append and several trips through the tier's lock, each per job. Jobs of at
most ``batch_blocks`` blocks are therefore queued here instead of each getting a task: a submission
starts a *flusher* task only while fewer than ``flushers`` run (:class:`~.job_queue.JobQueue`); a
flusher takes every queued job (up to 64 blocks and 4 MiB), writes them as one batch
(:meth:`~kvtier.tiers.fs.segments.SegmentStore.write_jobs`: one ``pwritev`` and one index append
per segment), settles them in one trip through the tier's lock, and loops until the queue is empty.
A lone job still starts a flusher at once (no waiting for company); jobs that arrive while the
flushers write are the ones that share a batch. The guarantees per block are those of
:meth:`~kvtier.tiers.fs.segments.SegmentStore.write_chunk` (data, then index record, then report),
and every queued job is reported exactly once, whatever a batch raises.
"""

from __future__ import annotations

__all__ = ["FLUSHERS", "MAX_BATCH_BLOCKS", "MAX_BATCH_BYTES"]

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
