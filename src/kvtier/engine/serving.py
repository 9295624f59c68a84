"""What the engine serves to peer instances: residency checks, pins, and the p2p block service.

:class:`Serving` is the facade's component for the p2p block server (:mod:`kvtier.tiers.p2p.server`):
it answers "is this block readable here now" and pins blocks while they are sent, on
engine-internal keys (a peer asks for the keys its own engine uses; no tenant scoping again), with
no promotion, no policy touch and no event -- serving a peer must not change what this instance
caches. It also owns the block service a ``p2p`` tier's ``serve`` options ask for (started by
:meth:`Serving.start`, stopped by :meth:`Serving.close` before the engine tears down its buffer).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kvtier.engine.types import LoadHandle
from kvtier.keys import BlockKey
from kvtier.primary import PrimaryTier

__all__ = ["Serving"]

log = logging.getLogger("kvtier.engine")


class Serving:
    """Residency checks and pins for peers (under the engine's lock), and the block service."""

    def __init__(
        self,
        primary: PrimaryTier,
        lock: threading.Lock,
        check_open: Callable[[], None],
        issue: Callable[[LoadHandle], LoadHandle],
    ) -> None:
        self._primary = primary
        self._lock = lock
        self._check_open = check_open
        self._issue = issue
        #: The running p2p block service (``None`` when no ``p2p`` tier asked for one).
        self.block_service: Any = None

    def resident(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Whether each engine-internal key is readable in the primary tier now (no side effects)."""
        with self._lock:
            self._check_open()
            pr = self._primary
            return [pr.readable(s) for s in pr.find(keys)]

    def pin_resident(self, keys: Sequence[BlockKey]) -> LoadHandle:
        """Pin the readable ones of engine-internal ``keys``; the handle lists those keys and slots in
        order. Release it with :meth:`Engine.complete_load` (a pinned slot is never evicted or
        rewritten, so a block is never torn while it is sent)."""
        with self._lock:
            self._check_open()
            pr = self._primary
            found = [(k, s) for k, s in zip(keys, pr.find(keys), strict=True) if pr.readable(s)]
            slots = [s for _, s in found]
            pr.pin(slots)
            return self._issue(LoadHandle([k for k, _ in found], slots, None))

    def start(self, engine: Any) -> None:
        """Start the block service ``engine``'s first ``p2p`` tier with ``serve`` options asks for.

        Imported only when a p2p tier is configured. Like metrics, serving is optional to the
        cache: when it cannot start (port taken, bad TLS files) one warning is logged and the
        engine runs without it.
        """
        if not any(type(t).__module__ == "kvtier.tiers.p2p" for t in engine.tiers):
            return
        from kvtier.tiers.p2p.service import start_for_engine

        try:
            self.block_service = start_for_engine(engine)
        except Exception as exc:
            log.warning("kvtier: p2p block server not started, the engine runs without it (%s)", exc)

    def close(self) -> None:
        """Stop the block service (peers stop reading this engine's slots). Idempotent."""
        service, self.block_service = self.block_service, None
        if service is not None:
            service.close()
