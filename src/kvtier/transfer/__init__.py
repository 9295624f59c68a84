"""Moving bytes: primary-tier buffers, job ids, the worker pool and KV movers.

* :mod:`kvtier.transfer.buffers` -- heap / shared-memory / torch / metadata-only primary buffers.
* :mod:`kvtier.transfer.workers` -- :class:`~kvtier.transfer.workers.WorkerPool`: the one priority
  thread pool (loads before stores before maintenance) behind the transfer pool and every tier.
* :mod:`kvtier.transfer.pool` -- :class:`TransferPool`: non-blocking submission with job ids, loads
  before stores, bounded in-flight work, completion polling, partial success.
* :mod:`kvtier.transfer.movers` -- :class:`KVLayout` and batched gather/scatter between an inference
  engine's KV cache (numpy arrays or torch tensors) and primary slots, on two threads.
"""

from __future__ import annotations

from kvtier.transfer.movers import KVLayout, copy_rows_in, copy_rows_out, gather_blocks, scatter_blocks
from kvtier.transfer.pool import JobIds, TransferPool

__all__ = [
    "JobIds",
    "KVLayout",
    "TransferPool",
    "copy_rows_in",
    "copy_rows_out",
    "gather_blocks",
    "scatter_blocks",
]
