"""The fleet directory in Redis: which instance's block server holds which block.

One Redis string per (namespace, block key): ``<prefix>:<namespace>:<key hex>`` -> ``host:port``
of the holder, with a TTL. Holders publish on store (which also refreshes the TTL) and remove on
eviction -- removal is compare-and-delete, so an instance never removes another's entry. An
instance that dies leaves entries that expire after ``ttl``; meanwhile readers find the peer down
and miss. An instance that restarts publishes again as it stores, and is found again.

:class:`DirectoryPublisher` is the holder's side: engine events go into a queue (the callback
never blocks the engine) and a thread writes them in pipelined batches, and re-publishes every
held key each ``ttl / 3`` seconds so live entries never expire.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import redis

__all__ = ["MAX_HOLDER_BYTES", "DirectoryPublisher", "PeerDirectory"]

log = logging.getLogger("kvtier.tiers.p2p.directory")

#: Longest directory value read back ("host:port" fits easily); anyone who can write the directory
#: could otherwise make every reader download megabytes per key.
MAX_HOLDER_BYTES = 256

# Delete the entry only when it still names this holder.
_CAS_DELETE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class PeerDirectory:
    """Client of the directory (thread-safe: redis-py pools connections).

    Args:
        url: ``redis://host:port/db`` (``rediss://`` for TLS). namespace: the engine's namespace.
        ttl: seconds an entry lives without a refresh. timeout: seconds per Redis call.
    """

    def __init__(
        self, url: str, namespace: str, *, ttl: float = 30.0, timeout: float = 0.5, prefix: str = "kvtier:p2p"
    ) -> None:
        self.ttl_ms = max(1, int(ttl * 1000))
        self._prefix = f"{prefix}:{namespace}:".encode()
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._cas = self._redis.register_script(_CAS_DELETE)

    def _name(self, key: bytes) -> bytes:
        return self._prefix + bytes(key).hex().encode()

    def publish(self, holder: str, keys: Sequence[bytes]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for k in keys:
            pipe.set(self._name(k), holder, px=self.ttl_ms)
        pipe.execute()

    def remove(self, holder: str, keys: Sequence[bytes]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for k in keys:
            self._cas(keys=[self._name(k)], args=[holder], client=pipe)
        pipe.execute()

    def holders(self, keys: Sequence[bytes]) -> list[str | None]:
        """The holder of each key (``None``: nobody published it, its entry expired, or its value
        is not a plausible ``host:port``: longer than :data:`MAX_HOLDER_BYTES` or not UTF-8).

        At most ``MAX_HOLDER_BYTES`` + 1 bytes of each value cross the network (``GETRANGE``).
        Whether a holder may be connected to is the reader's decision (the p2p tier's
        ``peer_networks``)."""
        if not keys:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for k in keys:
            pipe.getrange(self._name(k), 0, MAX_HOLDER_BYTES)
        values: list[Any] = pipe.execute()
        out: list[str | None] = []
        for v in values:
            try:
                ok = bool(v) and len(v) <= MAX_HOLDER_BYTES
                out.append(v.decode("utf-8") if ok else None)
            except UnicodeDecodeError:
                out.append(None)
        return out

    def close(self) -> None:
        self._redis.close()


class DirectoryPublisher:
    """Keeps the directory in step with one engine's primary tier (see the module doc).

    ``on_event`` is the engine subscriber; ``close`` stops the thread and removes this holder's
    entries (best effort: entries of a crashed holder expire instead).
    """

    def __init__(self, directory: PeerDirectory, holder: str, *, interval: float = 0.1) -> None:
        self.directory = directory
        self.holder = holder
        self._held: set[bytes] = set()
        self._add: set[bytes] = set()
        self._drop: set[bytes] = set()
        self._cv = threading.Condition()
        self._stop = False
        self._busy = False
        self._interval = interval
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="kvtier-p2p-directory", daemon=True)
        self._thread.start()

    def on_event(self, event: Any) -> None:
        kind = event.kind
        if kind in ("stored", "promoted") and (kind == "promoted" or event.tier is None):
            with self._cv:
                for k in event.keys:
                    self._add.add(bytes(k))
                    self._drop.discard(bytes(k))
                self._cv.notify()
        elif kind in ("evicted", "reset"):
            with self._cv:
                for k in event.keys:
                    self._drop.add(bytes(k))
                    self._add.discard(bytes(k))
                self._cv.notify()

    def flush(self, timeout: float = 2.0) -> None:
        """Wait until queued changes are written (tests, shutdown)."""
        with self._cv:
            self._cv.notify()
            self._cv.wait_for(lambda: not (self._add or self._drop or self._busy) or self._stop, timeout)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=5)
        try:
            self.directory.remove(self.holder, sorted(self._held | self._add))
        except redis.RedisError as exc:
            log.warning("kvtier p2p: could not remove directory entries on close (they expire): %s", exc)
        self.directory.close()

    def _run(self) -> None:
        refresh_every = self.directory.ttl_ms / 3000.0
        since_refresh = 0.0
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._stop or bool(self._add or self._drop), self._interval)
                if self._stop:
                    return
                add, self._add = self._add, set()
                drop, self._drop = self._drop, set()
                self._busy = True
            since_refresh += self._interval
            try:
                if drop:
                    self.directory.remove(self.holder, sorted(drop))
                if since_refresh >= refresh_every:
                    since_refresh = 0.0
                    add |= self._held
                if add:
                    self.directory.publish(self.holder, sorted(add))
            except redis.RedisError as exc:  # the directory is a hint: readers then miss, never fail
                self.errors += 1
                log.warning("kvtier p2p: directory update failed (will retry): %s", exc)
                with self._cv:
                    self._add |= add - self._drop
                    self._drop |= drop - self._add
                    self._busy = False
                continue
            self._held |= add
            self._held -= drop
            with self._cv:
                self._busy = False
                self._cv.notify_all()
