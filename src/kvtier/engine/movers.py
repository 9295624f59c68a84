"""The KV mover: the engine's byte-moving calls, built on its store/load slot protocol.

``store_blocks``/``load_blocks`` move ``(n, block_bytes)`` uint8 rows; ``store_kv``/``load_kv`` move
blocks of an inference engine's KV cache described by a :class:`~kvtier.transfer.movers.KVLayout`;
``submit_*_kv`` run the same on a :class:`~kvtier.transfer.pool.TransferPool` (created on first
use, owned here). Each is ``prepare_*`` under the engine's lock, the copy outside it (the slots are
WRITING or pinned, so nobody else touches them), then ``complete_*``; each of the four byte-moving
calls is timed into the primary tier's ``load`` or ``store`` histogram of the engine's
:class:`~kvtier.engine.latency.Latency`.

:class:`KVMover` is given the engine's :class:`~kvtier.engine.parts.Parts` (the primary tier, the
counters, the lock, the job ids, the latency histograms), the tenant scoping and four callables of
the slot protocol (``prepare_store``, ``complete_store``, ``pin_leading``, ``complete_load``)
instead of the engine, so it sees nothing of the engine but
that protocol. The engine exposes its methods under the same names and signatures.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from kvtier.engine.parts import Parts
from kvtier.engine.types import LoadHandle, RequestContext, StoreHandle
from kvtier.errors import MisuseError
from kvtier.keys import BlockInfo, BlockKey
from kvtier.transfer.movers import KVLayout, copy_rows_in, copy_rows_out, gather_blocks, scatter_blocks
from kvtier.transfer.pool import LOAD, STORE, TransferPool

__all__ = ["KVMover"]

Keys = Sequence[BlockKey]
Infos = Sequence[BlockInfo | None] | None
P = ParamSpec("P")
R = TypeVar("R")


def _timed(
    op: str,
) -> Callable[[Callable[Concatenate[KVMover, P], R]], Callable[Concatenate[KVMover, P], R]]:
    """Observe each call's wall time (returned or raised) in the primary tier's ``op`` histogram."""

    def wrap(fn: Callable[Concatenate[KVMover, P], R]) -> Callable[Concatenate[KVMover, P], R]:
        def run(mover: KVMover, /, *args: P.args, **kwargs: P.kwargs) -> R:
            t0 = time.perf_counter()
            try:
                return fn(mover, *args, **kwargs)
            finally:
                getattr(mover.latency, op).observe(time.perf_counter() - t0)

        functools.update_wrapper(run, fn)  # the docs show the wrapped call's name and docstring
        return run

    return wrap


class KVMover:
    """Copies bytes between callers' buffers and the primary tier's slots.

    Args:
        parts: the engine's shared parts: the primary tier (the slots, ``rows``, copied to and from),
            the counters (``bytes_stored``/``bytes_loaded``), the lock (taken to create the pool and
            to read residency), the job ids and budget (the transfer pool's) and the latency
            histograms (the primary tier's ``load``/``store`` are observed here).
        check_open: raises :class:`~kvtier.errors.MisuseError` when the engine is closed.
        scope: the engine-internal keys of a request.
        prepare_store, complete_store, pin_leading, complete_load: the engine's slot protocol
            (``pin_leading`` pins the longest leading run of readable keys).
    """

    def __init__(
        self,
        parts: Parts,
        *,
        check_open: Callable[[], None],
        scope: Callable[[Keys, RequestContext | None], list[BlockKey]],
        prepare_store: Callable[[Keys, RequestContext | None, Infos], StoreHandle],
        complete_store: Callable[[StoreHandle, bool], None],
        pin_leading: Callable[[Keys, RequestContext | None], LoadHandle],
        complete_load: Callable[[LoadHandle], None],
    ) -> None:
        self._parts = parts
        self.primary = parts.primary
        self.block_bytes = parts.primary.block_bytes
        self.latency = parts.latency
        self._check_open = check_open
        self._scope = scope
        self.prepare_store = prepare_store
        self.complete_store = complete_store
        self._pin_leading = pin_leading
        self.complete_load = complete_load
        #: The worker pool of ``submit_*_kv`` (``None`` until first used).
        self.pool: TransferPool | None = None

    # -- convenience movers (real bytes) -----------------------------------------------------
    def _store(
        self, keys: Keys, request: RequestContext | None, infos: Infos, copy: Callable[[StoreHandle], int]
    ) -> int:
        """Reserve slots for ``keys``, ``copy(handle)`` bytes into them (real buffers only), commit
        (abort on any exception); the number of blocks written."""
        h = self.prepare_store(keys, request, infos)
        try:
            if self.primary.backing != "none" and len(h.slots):
                self._parts.counters["bytes_stored"] += copy(h)
        except BaseException:
            self.complete_store(h, False)
            raise
        self.complete_store(h, True)
        return len(h.keys)

    def _load(self, keys: Keys, request: RequestContext | None, copy: Callable[[LoadHandle], int]) -> int:
        """Pin the leading readable run of ``keys``, ``copy(handle)`` bytes out of it (real buffers
        only), unpin; the number of blocks copied."""
        h = self._pin_leading(keys, request)
        try:
            if self.primary.backing != "none" and len(h.slots):
                self._parts.counters["bytes_loaded"] += copy(h)
        finally:
            self.complete_load(h)
        return len(h.slots)

    @staticmethod
    def _check_ids(op: str, keys: Keys, block_ids: Sequence[int]) -> None:
        if len(block_ids) != len(keys):
            raise MisuseError(f"{op}: {len(keys)} keys but {len(block_ids)} block ids")

    @_timed("store")
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

        def copy(h: StoreHandle) -> int:
            return copy_rows_in(self.primary.rows, h.slots, data, h.positions, self.block_bytes, len(keys))

        return self._store(keys, request, infos, copy)

    @_timed("load")
    def load_blocks(self, keys: Sequence[BlockKey], out: Any, request: RequestContext | None = None) -> int:
        """Copy the leading readable blocks of ``keys`` into ``out[i]``; returns how many were copied."""

        def copy(h: LoadHandle) -> int:
            dst = out if isinstance(out, np.ndarray) else np.asarray(out)
            if dst.dtype != np.uint8 or dst.ndim != 2:
                dst = dst.reshape(len(keys), -1).view(np.uint8)
            return copy_rows_out(self.primary.rows, h.slots, dst, range(len(h.slots)), self.block_bytes)

        return self._load(keys, request, copy)

    @_timed("store")
    def store_kv(
        self,
        keys: Sequence[BlockKey],
        layout: KVLayout,
        block_ids: Sequence[int],
        request: RequestContext | None = None,
    ) -> int:
        """Gather blocks ``block_ids[i]`` of an engine's KV cache into the primary tier as ``keys[i]``."""
        self._check_ids("store_kv", keys, block_ids)
        layout.check(block_ids, self.block_bytes)

        def copy(h: StoreHandle) -> int:
            return gather_blocks(layout, [block_ids[p] for p in h.positions], self.primary.rows, h.slots)

        return self._store(keys, request, None, copy)

    @_timed("load")
    def load_kv(
        self,
        keys: Sequence[BlockKey],
        layout: KVLayout,
        block_ids: Sequence[int],
        request: RequestContext | None = None,
    ) -> int:
        """Scatter the leading readable blocks of ``keys`` into blocks ``block_ids[i]``; returns count."""
        self._check_ids("load_kv", keys, block_ids)
        layout.check(block_ids, self.block_bytes)

        def copy(h: LoadHandle) -> int:
            return scatter_blocks(layout, list(block_ids[: len(h.slots)]), self.primary.rows, h.slots)

        return self._load(keys, request, copy)

    # -- asynchronous movers (transfer pool) -------------------------------------------------
    def _transfer_pool(self) -> TransferPool:
        with self._parts.lock:
            self._check_open()
            if self.pool is None:
                self.pool = TransferPool(2, self._parts.max_inflight, ids=self._parts.ids)
            return self.pool

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
        self._check_ids("submit_store_kv", keys, block_ids)
        keys = list(keys)

        def run() -> list[BlockKey]:
            self.store_kv(keys, layout, block_ids, request)
            # Report what is resident now (stored by this job or already there), not what was asked:
            # keys dropped for want of a free slot must not look stored.
            with self._parts.lock:
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

    def primary_io(self) -> dict[str, float | int]:
        """The primary tier's timed copies (:meth:`Latency.primary_io`) and ``inflight_jobs``: the
        ``submit_*_kv`` jobs queued or running."""
        out = self.latency.primary_io()
        out["inflight_jobs"] = self.pool.inflight if self.pool is not None else 0
        return out

    def poll_transfers(self) -> list[Any]:
        """Results (:class:`~kvtier.jobs.JobResult`) of ``submit_*_kv`` jobs finished since last call."""
        pool = self.pool
        return pool.poll() if pool is not None else []
