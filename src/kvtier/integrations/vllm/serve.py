"""kvtier's p2p block server inside vLLM: other instances load blocks from this engine's primary tier.

vLLM 0.33 and 0.34 hand each secondary tier a ``ParentManager`` in ``serve_external_requests``
(every scheduler step, and every tier-poll round for a tier that sets
``tolerates_off_thread_polling``): the one window in which a tier may look blocks up in the
engine's primary tier and pin them (``on_new_request``, ``lookup``, ``create_store_job``,
``on_request_finished``, in that order), under the tiering manager's lock.

kvtier's :class:`~kvtier.tiers.p2p.server.BlockServer` (handshake, secret, bounds, checksums) runs
unchanged on its own threads; :class:`VllmPrimaryServer` is the engine it serves, and it never
touches vLLM state from those threads:

* A peer's ``LOOKUP`` or ``FETCH`` becomes a request queued here; the connection thread waits for
  the answer (at most ``io_timeout`` seconds; then it answers "not held", and a late answer is
  discarded, never pinned).
* :meth:`VllmPrimaryServer.serve` (vLLM's thread, with the manager lock held) answers every queued
  request through the parent: a lookup asks the primary tier only (the request's
  ``load_tier_filter`` admits no secondary tier, so a peer never makes this engine promote or
  wait); a fetch also pins the blocks that are there with ``create_store_job``, whose job id and
  primary chunk ids come back to the connection thread, which sends the bytes straight from those
  chunks.
* When the send is done (or failed), the connection thread releases the pin by queuing the job id;
  the adapter reports it in ``get_finished_jobs`` and vLLM's manager unpins the chunks
  (``complete_read``) on its own thread. Until then vLLM never evicts or rewrites them.

``drain_jobs`` (vLLM's ``reset_cache``) waits for sends in flight (bounded) and reports them; a send
still running then reads chunks vLLM may reuse, so that peer's per-block checksum fails and it
counts the block corrupt instead of serving it.

Importing this module imports vLLM.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from vllm.v1.kv_offload.base import LookupResult as VllmLookup
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.tiering.base import JobResult as VllmJobResult

from kvtier.keys import BlockKey
from kvtier.tiers.p2p.service import BlockService, start

__all__ = ["ServedPin", "VllmPrimaryServer", "start_serving"]

log = logging.getLogger("kvtier.integrations.vllm")

_NO_SLOTS: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)


def _primary_only() -> Any:
    """A ``load_tier_filter`` that admits no secondary tier (``None`` on a vLLM without one)."""
    try:
        from vllm.v1.kv_offload.base import TierFilter
    except ImportError:  # pragma: no cover - older vLLM: the parent then asks every other tier
        return None
    return TierFilter(matchers=())


@dataclass(slots=True)
class ServedPin:
    """What a FETCH pinned: the held keys, their primary chunks, and vLLM's job holding the pin."""

    keys: list[BlockKey]
    slots: npt.NDArray[np.int64]
    job_id: int | None = None
    started: float = 0.0


@dataclass(slots=True)
class _Ask:
    keys: list[BlockKey]
    pin: bool
    event: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False
    cancelled: bool = False
    held: list[bool] | None = None
    handle: ServedPin | None = None


class VllmPrimaryServer:
    """The engine a :class:`~kvtier.tiers.p2p.server.BlockServer` serves, over vLLM's primary tier.

    Connection threads call :meth:`resident`, :meth:`pin_resident` and :meth:`complete_load`;
    vLLM's thread (manager lock held) calls :meth:`serve`, :meth:`finished`, :meth:`pending` and
    :meth:`drain`. The two sides share only the request queue and the release list, each under
    one lock.

    Args:
        namespace: the p2p tier's namespace (peers must present the same one).
        block_bytes: bytes of one primary chunk (vLLM's row).
        primary_kv_view: vLLM's primary buffer as a 2-D byte view.
        answer_timeout: seconds a connection thread waits for vLLM's thread to answer.
    """

    def __init__(
        self, *, namespace: str, block_bytes: int, primary_kv_view: memoryview, answer_timeout: float
    ) -> None:
        self.namespace = namespace
        self.block_bytes = block_bytes
        self.primary_kv_view = primary_kv_view
        self.answer_timeout = float(answer_timeout)
        self._lock = threading.Lock()
        self._asks: deque[_Ask] = deque()
        self._released: list[tuple[int, int, float]] = []
        self._closed = False
        # vLLM's thread only: pins handed out and not yet reported.
        self._pinned: dict[int, ServedPin] = {}
        self._ids = itertools.count()
        self._filter = _primary_only()
        self.stats = {"lookups": 0, "fetches": 0, "pinned_blocks": 0, "timeouts": 0}

    @property
    def serving(self) -> VllmPrimaryServer:
        return self

    # -- connection threads ------------------------------------------------------------------------
    def _ask(self, keys: Sequence[BlockKey], pin: bool) -> _Ask:
        ask = _Ask(list(keys), pin)
        with self._lock:
            if self._closed:
                return ask
            self._asks.append(ask)
        if not ask.event.wait(self.answer_timeout):
            with ask.lock:
                if not ask.done:
                    # vLLM did not get to it in time (a long step, shutdown): answer "not held"
                    # and make sure a late answer never pins for a sender that is gone.
                    ask.cancelled = True
                    with self._lock:
                        self.stats["timeouts"] += 1
        return ask

    def resident(self, keys: Sequence[BlockKey]) -> list[bool]:
        ask = self._ask(keys, pin=False)
        return ask.held if ask.done and ask.held is not None else [False] * len(keys)

    def pin_resident(self, keys: Sequence[BlockKey]) -> ServedPin:
        ask = self._ask(keys, pin=True)
        if ask.done and ask.handle is not None:
            return ask.handle
        return ServedPin([], _NO_SLOTS)

    def complete_load(self, handle: ServedPin) -> None:
        """The send from ``handle``'s chunks is over: vLLM may unpin them (at its next poll)."""
        if handle.job_id is None:
            return
        nbytes = len(handle.keys) * self.block_bytes
        with self._lock:
            self._released.append((handle.job_id, nbytes, time.monotonic() - handle.started))

    # -- vLLM's thread -----------------------------------------------------------------------------
    def serve(self, parent: Any) -> None:
        """Answer every queued request through ``parent`` (the manager lock is held throughout)."""
        while True:
            with self._lock:
                if not self._asks:
                    return
                ask = self._asks.popleft()
            with ask.lock:
                if ask.cancelled:
                    continue
                try:
                    self._answer(ask, parent)
                except Exception:  # a vLLM-side error answers "not held"; the engine goes on
                    log.warning("kvtier: serving a p2p peer failed", exc_info=True)
                ask.done = True
            ask.event.set()

    def _answer(self, ask: _Ask, parent: Any) -> None:
        ctx = ReqContext(req_id=f"kvtier-p2p-serve-{next(self._ids)}")
        if self._filter is not None:
            ctx.load_tier_filter = self._filter
        parent.on_new_request(ctx)
        try:
            held = [parent.lookup(bytes(k), ctx) is VllmLookup.HIT for k in ask.keys]
            if not ask.pin:
                ask.held = held
                self.stats["lookups"] += len(ask.keys)
                return
            # One pin per distinct key (a FETCH may name a key twice; the sender looks slots up
            # by key).
            hits = list(dict.fromkeys(k for k, yes in zip(ask.keys, held, strict=True) if yes))
            self.stats["fetches"] += 1
            if not hits:
                ask.handle = ServedPin([], _NO_SLOTS)
                return
            job = parent.create_store_job([bytes(k) for k in hits], ctx)
            pin = ServedPin(
                keys=[BlockKey(bytes(k)) for k in job.keys],
                slots=np.asarray(job.chunk_ids, dtype=np.int64),
                job_id=int(job.job_id),
                started=time.monotonic(),
            )
            self._pinned[pin.job_id] = pin  # type: ignore[index]
            self.stats["pinned_blocks"] += len(pin.keys)
            ask.handle = pin
        finally:
            # The pin (if any) is vLLM's job now; the request's bookkeeping can go.
            parent.on_request_finished(ctx)

    def finished(self) -> list[VllmJobResult]:
        """Results of the serve jobs whose sends ended since the last call."""
        with self._lock:
            released, self._released = self._released, []
        out = []
        for job_id, nbytes, seconds in released:
            if self._pinned.pop(job_id, None) is None:
                continue  # already reported by drain
            out.append(
                VllmJobResult(job_id=job_id, success=True, transfer_time=seconds, transfer_bytes=nbytes)
            )
        return out

    def pending(self) -> bool:
        return bool(self._pinned)

    def drain(self, timeout: float) -> list[VllmJobResult]:
        """Wait up to ``timeout`` s for sends in flight; report them all (late ones as failed)."""
        deadline = time.monotonic() + timeout
        out = self.finished()
        while self._pinned and time.monotonic() < deadline:
            time.sleep(0.001)
            out += self.finished()
        if self._pinned:
            log.warning(
                "kvtier: %d p2p send(s) still running after %.0f s; their chunks are released to vLLM "
                "(the peer's checksum catches a block rewritten mid-send)",
                len(self._pinned),
                timeout,
            )
            for job_id in list(self._pinned):
                out.append(VllmJobResult(job_id=job_id, success=False, transfer_time=0.0, transfer_bytes=0))
            self._pinned.clear()
        return out

    def close(self) -> None:
        """Answer every queued request "not held" and accept no more (idempotent)."""
        with self._lock:
            self._closed = True
            asks, self._asks = list(self._asks), deque()
        for ask in asks:
            ask.event.set()


def start_serving(tier: Any, primary_kv_view: memoryview) -> tuple[BlockService, VllmPrimaryServer] | None:
    """Start the block server a p2p tier's ``serve`` options ask for, over vLLM's primary tier.

    Returns ``None`` for a tier that does not serve. The server binds ``serve.host`` (default
    127.0.0.1), authenticates peers with the tier's secret and presents its namespace and layout.
    """
    if not getattr(tier, "p2p_serves", False) or getattr(tier, "serve", None) is None:
        return None
    # serve together with a directory is refused by the config check (kvtier.config.vllm).
    options = dict(tier.serve)
    served = VllmPrimaryServer(
        namespace=tier.context.namespace,
        block_bytes=tier.block_bytes,
        primary_kv_view=primary_kv_view,
        answer_timeout=float(options.get("io_timeout", 5.0)),
    )
    service = start(served, secret=tier.secret, options=options, layout=tier.layout)
    tier.self_address = service.address
    return service, served
