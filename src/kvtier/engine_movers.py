"""Byte-moving conveniences of :class:`kvtier.engine.Engine` (a mixin, kept apart for size).

``store_blocks``/``load_blocks`` move ``(n, block_bytes)`` uint8 rows; ``store_kv``/``load_kv`` move
blocks of an inference engine's KV cache described by a :class:`~kvtier.transfer.movers.KVLayout`;
``submit_*_kv`` run the same on the engine's :class:`~kvtier.transfer.pool.TransferPool`. Each is
``prepare_*`` under the lock, the copy outside it (the slots are WRITING or pinned, so nobody else
touches them), then ``complete_*``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtier.engine_types import LoadHandle, RequestContext, StoreHandle
from kvtier.errors import MisuseError
from kvtier.keys import BlockInfo, BlockKey
from kvtier.transfer.movers import KVLayout, copy_rows_in, copy_rows_out, gather_blocks, scatter_blocks
from kvtier.transfer.pool import LOAD, STORE, JobIds, TransferPool

if TYPE_CHECKING:
    from kvtier.config import KvtierConfig
    from kvtier.primary import PrimaryTier

__all__ = ["MoverMixin"]


class MoverMixin:
    """Methods that copy bytes; :class:`~kvtier.engine.Engine` provides the attributes below."""

    primary: PrimaryTier
    block_bytes: int
    config: KvtierConfig
    c: dict[str, int]
    _lock: threading.Lock
    _pool: TransferPool | None
    _ids: JobIds

    if TYPE_CHECKING:

        def prepare_store(
            self,
            keys: Sequence[BlockKey],
            request: RequestContext | None = None,
            infos: Sequence[BlockInfo | None] | None = None,
        ) -> StoreHandle: ...

        def complete_store(self, handle: StoreHandle, success: bool = True) -> None: ...

        def complete_load(self, handle: LoadHandle) -> None: ...

        def _pin_leading(self, keys: Sequence[BlockKey], request: RequestContext | None) -> LoadHandle: ...

        def _check_open(self) -> None: ...

        def _scope(self, keys: Sequence[BlockKey], request: RequestContext | None) -> list[BlockKey]: ...

    # -- convenience movers (real bytes) -----------------------------------------------------
    def _needs_bytes(self) -> bool:
        return self.primary.backing != "none"

    def store_blocks(
        self,
        keys: Sequence[BlockKey],
        data: Any,
        request: RequestContext | None = None,
        infos: Sequence[BlockInfo | None] | None = None,
    ) -> int:
        """Store ``data[i]`` (an ``(n, block_bytes)`` uint8 array or per-block buffers) under ``keys[i]``.

        Returns the number of blocks written (resident keys are skipped).
        """
        h = self.prepare_store(keys, request, infos)
        if not h.keys:
            self.complete_store(h)
            return 0
        try:
            if self._needs_bytes():
                n = copy_rows_in(self.primary.rows, h.slots, data, h.positions, self.block_bytes, len(keys))
                self.c["bytes_stored"] += n
        except BaseException:
            self.complete_store(h, success=False)
            raise
        self.complete_store(h)
        return len(h.keys)

    def load_blocks(self, keys: Sequence[BlockKey], out: Any, request: RequestContext | None = None) -> int:
        """Copy the leading readable blocks of ``keys`` into ``out[i]``; returns how many were copied."""
        h = self._pin_leading(keys, request)
        try:
            if self._needs_bytes() and len(h.slots):
                dst = out if isinstance(out, np.ndarray) else np.asarray(out)
                if dst.dtype != np.uint8 or dst.ndim != 2:
                    dst = dst.reshape(len(keys), -1).view(np.uint8)
                n = copy_rows_out(self.primary.rows, h.slots, dst, range(len(h.slots)), self.block_bytes)
                self.c["bytes_loaded"] += n
        finally:
            self.complete_load(h)
        return len(h.slots)

    def store_kv(
        self,
        keys: Sequence[BlockKey],
        layout: KVLayout,
        block_ids: Sequence[int],
        request: RequestContext | None = None,
    ) -> int:
        """Gather blocks ``block_ids[i]`` of an engine's KV cache into the primary tier as ``keys[i]``."""
        if len(block_ids) != len(keys):
            raise MisuseError(f"store_kv: {len(keys)} keys but {len(block_ids)} block ids")
        layout.check(block_ids, self.block_bytes)
        h = self.prepare_store(keys, request)
        try:
            if self._needs_bytes() and len(h.slots):
                bids = [block_ids[p] for p in h.positions]
                self.c["bytes_stored"] += gather_blocks(layout, bids, self.primary.rows, h.slots)
        except BaseException:
            self.complete_store(h, success=False)
            raise
        self.complete_store(h)
        return len(h.keys)

    def load_kv(
        self,
        keys: Sequence[BlockKey],
        layout: KVLayout,
        block_ids: Sequence[int],
        request: RequestContext | None = None,
    ) -> int:
        """Scatter the leading readable blocks of ``keys`` into blocks ``block_ids[i]``; returns count."""
        if len(block_ids) != len(keys):
            raise MisuseError(f"load_kv: {len(keys)} keys but {len(block_ids)} block ids")
        layout.check(block_ids, self.block_bytes)
        h = self._pin_leading(keys, request)
        try:
            if self._needs_bytes() and len(h.slots):
                bids = list(block_ids[: len(h.slots)])
                self.c["bytes_loaded"] += scatter_blocks(layout, bids, self.primary.rows, h.slots)
        finally:
            self.complete_load(h)
        return len(h.slots)

    # -- asynchronous movers (transfer pool) -------------------------------------------------
    def _transfer_pool(self) -> TransferPool:
        with self._lock:
            self._check_open()
            if self._pool is None:
                self._pool = TransferPool(2, self.config.max_inflight_jobs, ids=self._ids)
            return self._pool

    def submit_store_kv(
        self,
        keys: Sequence[BlockKey],
        layout: KVLayout,
        block_ids: Sequence[int],
        request: RequestContext | None = None,
    ) -> int | None:
        """:meth:`store_kv` on a worker thread. Returns a job id (see :meth:`poll_transfers`), or
        ``None`` when ``max_inflight_jobs`` transfers are already pending (try again later)."""
        pool = self._transfer_pool()
        if len(block_ids) != len(keys):
            raise MisuseError(f"submit_store_kv: {len(keys)} keys but {len(block_ids)} block ids")
        keys = list(keys)

        def run() -> list[BlockKey]:
            self.store_kv(keys, layout, block_ids, request)
            # Report what is resident now (stored by this job or already there), not what was asked:
            # keys dropped for want of a free slot must not look stored.
            with self._lock:
                slots = self.primary.find(self._scope(keys, request))
            return [k for k, s in zip(keys, slots, strict=True) if s >= 0]

        return pool.submit(run, kind=STORE, keys=keys, nbytes=len(keys) * layout.block_bytes)

    def submit_load_kv(
        self,
        keys: Sequence[BlockKey],
        layout: KVLayout,
        block_ids: Sequence[int],
        request: RequestContext | None = None,
    ) -> int | None:
        """:meth:`load_kv` on a worker thread, ahead of queued stores. The job's ``successful_keys``
        lists the keys loaded (partial success when only a leading run was readable)."""
        pool = self._transfer_pool()
        keys = list(keys)

        def run() -> list[BlockKey]:
            n = self.load_kv(keys, layout, block_ids, request)
            return keys[:n]

        return pool.submit(run, kind=LOAD, keys=keys, nbytes=len(keys) * layout.block_bytes)

    def poll_transfers(self) -> list[Any]:
        """Results (:class:`~kvtier.jobs.JobResult`) of ``submit_*_kv`` jobs finished since last call."""
        pool = self._pool
        return pool.poll() if pool is not None else []
