"""``RemoteTier``: the base of every network tier (Redis, S3-compatible ``obj``, Mooncake, p2p).

It sits on :class:`~kvtier.tiers.async_tier.AsyncTier` (chunking, exactly-once reports, shutdown,
back-pressure) and adds what a shared remote store needs:

* **A client per worker thread.** :meth:`RemoteTier._connect` is called lazily on each worker the
  first time it needs the server, so no client is shared between threads and a tier whose server is
  down at start-up still builds (it answers MISS until the server is there). A client that failed
  with an availability error is closed and rebuilt on next use.
* **Routes and circuit breakers.** :meth:`RemoteTier._route` names the server a key lives on (``""``
  for one server; a Cluster node, a peer). Each route has a
  :class:`~kvtier.tiers.remote.breaker.CircuitBreaker` fed by the outcome of every real operation
  (never by a health call). While a route's breaker is open its keys answer MISS, its stores are
  dropped and counted (``dropped_stores``) and its loads fail at once; after ``breaker_reset`` s one
  trial goes through (the next job, or a :meth:`RemoteTier._probe` the tier starts itself when a
  lookup finds the breaker due), and the breaker closes when it succeeds.
* **Deadlines.** ``op_timeout`` (default 1 s) is passed by each backend to its client as the socket
  connect/read timeout of every request, so a worker never waits longer than that per attempt; the
  engine thread never waits at all (lookups are answered from memory).
* **One error map.** Everything a client raises goes through the class's ``error_map``
  (:class:`~kvtier.tiers.remote.errors.ErrorMap`): unavailability trips the breaker and rebuilds the
  client, "full" pauses stores for ``full_backoff`` s, anything else fails only the chunk.
* **An existence index** (:class:`~kvtier.tiers.remote.index.ExistenceIndex`): known keys HIT,
  an unknown key answers MISS while a batched existence check runs on a worker (or RETRY, with
  ``unknown_keys: wait``), a checked-missing key stays MISS for ``negative_ttl`` s, then is checked
  again (so another instance's writes appear).
* **The block format.** Values are :mod:`kvtier.codec` blobs (header with key, namespace tag,
  lengths and checksum, then the payload); :meth:`RemoteTier._fill` verifies a fetched blob and
  copies it into the slot, counting a corrupt or truncated one in ``stats.corrupt`` and never
  serving it.

Writing a network tier: subclass, set ``error_map``, implement ``_connect``, ``_put``, ``_get`` and
``_exists`` (all on worker threads, may raise client exceptions freely: the base translates them),
optionally ``_route``, ``_probe`` and ``_close_client``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np

from kvtier import codec
from kvtier.errors import TierError, TierUnavailableError
from kvtier.keys import BlockKey, LookupResult
from kvtier.numbers import SECONDS, Range, Ranges, check_number
from kvtier.tiers.async_tier import AsyncTier, ChunkOutcome, JobState
from kvtier.tiers.backpressure import GateConfig, StoreGate
from kvtier.tiers.base import TierContext
from kvtier.tiers.remote.breaker import CircuitBreaker
from kvtier.tiers.remote.errors import ErrorMap, RemoteFullError, RemoteTimeoutError
from kvtier.tiers.remote.index import ExistenceIndex
from kvtier.tiers.remote.options import RemoteOptions
from kvtier.transfer.workers import Priority

__all__ = ["RemoteTier", "positive_number"]

Item = tuple[BlockKey, int]
#: A backend operation on one route's items (``_put``, ``_get``).
RouteOp = Callable[[Any, str, list[Item]], ChunkOutcome]
T = TypeVar("T")
_CHECK_BATCH = 256


def positive_number(name: str, value: Any, *, maximum: float | None = None) -> float:
    """``value`` as finite seconds > 0 (and <= ``maximum``, default :data:`SECONDS`'s), else a
    :class:`ConfigError` naming ``name`` (:func:`kvtier.numbers.check_number`)."""
    rng = SECONDS if maximum is None else Range(0, maximum, open_low=True, unit="seconds")
    return float(check_number(name, value, rng))


def with_hint(err: TierError, hint_of: Callable[[TierError], str | None]) -> TierError:
    """``err`` with ``hint_of(err)`` appended to its message (same class, same cause)."""
    hint = hint_of(err)
    if not hint or hint in str(err):
        return err
    hinted = type(err)(f"{err}; {hint}")
    hinted.__cause__ = err.__cause__
    return hinted


class RemoteTier(AsyncTier):
    """A shared network tier (see the module doc).

    Its config keys are those of its ``options_class`` (:class:`~kvtier.tiers.remote.options.RemoteOptions`
    for every network tier, plus each tier's own); the constructor takes them as keyword arguments,
    checks them all before anything is built, and keeps them as ``self.options``. A subclass that
    sets ``options_class`` gets its ``option_ranges`` and constructor signature from it.
    """

    medium: ClassVar[str] = "REMOTE"
    persistent: ClassVar[bool] = True
    shared: ClassVar[bool] = True
    tolerates_off_thread_polling: ClassVar[bool] = True
    #: The backend's exception map (subclasses set it).
    error_map: ClassVar[ErrorMap] = ErrorMap("remote", [])
    #: The tier's options (subclasses set their own :class:`RemoteOptions` subclass).
    options_class: ClassVar[type[RemoteOptions]] = RemoteOptions
    option_ranges: ClassVar[Ranges] = RemoteOptions.option_ranges()
    #: Old config keys still accepted (old -> new; the plug-in factory does not suggest them).
    renamed_options: ClassVar[Mapping[str, str]] = RemoteOptions.renamed
    options: RemoteOptions

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "options_class" in cls.__dict__:
            cls.option_ranges = cls.options_class.option_ranges()
            cls.renamed_options = cls.options_class.renamed
            setattr(cls, "__signature__", cls.options_class.signature())  # noqa: B010 (mypy: type has none)
        elif "__init__" in cls.__dict__:
            setattr(cls, "__signature__", None)  # noqa: B010 (its own __init__ says what it takes)

    def __init__(self, *, primary_kv_view: memoryview, context: TierContext, **config: Any) -> None:
        # Every option checked first, before any worker thread or connection exists.
        o = self.options = self.options_class.from_config(config, owner=type(self).__name__)
        super().__init__(
            primary_kv_view=primary_kv_view,
            context=context,
            threads=o.threads,
            batch_blocks=o.batch_blocks,
            log_interval=o.log_interval,
            store_gate=StoreGate(GateConfig.from_options(o.backpressure)),
        )
        self.op_timeout = float(o.op_timeout)
        self.breaker_failures = int(o.breaker_failures)
        self.breaker_reset = float(o.breaker_reset)
        self.full_backoff = float(o.full_backoff)
        self.index = ExistenceIndex(o.index_capacity, float(o.negative_ttl), o.unknown_keys, self.removals)
        self.ns_tag = codec.namespace_tag(context.namespace)
        #: This namespace's block headers (``self.headers(key, payload)``).
        self.headers = codec.HeaderMaker(self.ns_tag, self.block_bytes)
        self._breakers: dict[str, CircuitBreaker] = {}
        # Keys spread over several servers (a Redis Cluster, p2p peers): routed one by one.
        # Otherwise every key is on route "" and the per-key routing calls are skipped.
        self._routed = type(self)._route is not RemoteTier._route
        self._local = threading.local()
        self._clients: list[Any] = []
        self._checkers = 0
        self._probing: set[str] = set()

    @classmethod
    def check_options(cls, context: TierContext, options: Mapping[str, Any]) -> None:
        """Every option check of the constructor, building nothing (``kvtier check``)."""
        cls.options_class.from_config(options, owner=cls.__name__)

    # -- to implement (worker threads; client exceptions may escape: the base maps them) ---------
    def _connect(self) -> Any:
        """A new client for the calling worker thread."""
        raise NotImplementedError

    def _close_client(self, client: Any) -> None:
        """Release one client (default: its ``close()`` if it has one)."""
        close = getattr(client, "close", None)
        if callable(close):
            close()

    def _route(self, key: BlockKey) -> str:
        """The server ``key`` lives on (engine or worker thread, memory only). Default: one server."""
        return ""

    def _put(self, client: Any, route: str, items: list[Item]) -> ChunkOutcome:
        """Write ``items`` (all on ``route``) with :meth:`_blob_parts`; return the outcome."""
        raise NotImplementedError

    def _get(self, client: Any, route: str, items: list[Item]) -> ChunkOutcome:
        """Fetch ``items`` (all on ``route``) and :meth:`_fill` each slot; return the outcome."""
        raise NotImplementedError

    def _exists(self, client: Any, route: str, keys: list[BlockKey]) -> list[bool]:
        """Whether each key is on the server (one batched round trip where the backend allows)."""
        raise NotImplementedError

    def _probe(self, client: Any, route: str) -> None:
        """A real data-path operation on ``route`` (not a health call); raises if it fails."""
        self._exists(client, route, [BlockKey(b"kvtier-probe")])

    # -- helpers for subclasses -------------------------------------------------------------------
    def _blob_parts(self, key: BlockKey, slot: int) -> tuple[bytes, memoryview]:
        """The codec header and a zero-copy view of the payload of ``slot`` (stored as ``key``)."""
        payload = self.slot_array(slot).data
        return self.headers(bytes(key), payload), payload

    def _fill(self, key: BlockKey, slot: int, blob: bytes | memoryview | bytearray | None) -> bool:
        """Verify ``blob`` (``None`` = missing) and copy its payload into ``slot``; ``False`` for a
        missing, foreign, truncated or corrupt blob (counted, never served)."""
        if blob is None:
            self._vanished(key)
            return False
        try:
            payload = codec.decode(blob, key=bytes(key), ns_tag=self.ns_tag)
            if payload.nbytes != self.block_bytes:
                raise codec.CorruptBlockError(
                    "length", f"payload {payload.nbytes} B, block is {self.block_bytes} B"
                )
        except codec.CorruptBlockError as exc:
            return self._corrupt(key, exc)
        np.copyto(self.slot_array(slot), np.frombuffer(payload, dtype=np.uint8))
        return True

    def _receive(
        self,
        key: BlockKey,
        slot: int,
        read_into: Callable[[memoryview], int],
        size: int,
        head: bytes | bytearray | None = None,
    ) -> bool:
        """Stream one blob of ``size`` bytes straight into ``slot``: the header into a small
        buffer, the payload into the slot itself (no intermediate copy), then verify it there.
        ``read_into(view)`` fills a prefix of ``view`` and returns its length (0 at the end), like
        ``socket.recv_into`` or a response body's ``readinto``. ``head``: the header when it
        travelled apart from the value (S3 metadata); the stream then holds the payload alone. A
        blob of the wrong size or one that fails verification is counted and leaves the slot
        zeroed (never another key's bytes).
        """
        head_len = 0 if head is not None else codec.header_size(len(key))
        if size != head_len + self.block_bytes:
            return self._corrupt(
                key,
                codec.CorruptBlockError(
                    "length", f"blob is {size} bytes, expected {head_len + self.block_bytes}"
                ),
            )
        target = memoryview(self.slot_array(slot).data)
        if head is None:
            head = bytearray(head_len)
            complete = _read_exact(read_into, memoryview(head)) and _read_exact(read_into, target)
        else:
            complete = _read_exact(read_into, target)
        if not complete:
            target[:] = bytes(len(target))
            return self._corrupt(key, codec.CorruptBlockError("short", "blob ended early"))
        try:
            header = codec.parse_header(
                head, expected_key=bytes(key), ns_tag=self.ns_tag, payload_len=self.block_bytes
            )
            codec.verify_payload(header, target)
        except codec.CorruptBlockError as exc:
            target[:] = bytes(len(target))
            return self._corrupt(key, exc)
        return True

    def _corrupt(self, key: BlockKey, exc: codec.CorruptBlockError) -> bool:
        with self._lock:
            self.stats.corrupt += 1
            self.index.forget(key, self.context.clock())
        self.rlog.warning("corrupt", f"kvtier {self.name}: dropped a bad value ({exc.reason}): {exc}")
        self._drop_corrupt(key)
        return False

    def _drop_corrupt(self, key: BlockKey) -> None:
        """Remove a value that failed verification (default: leave it; a later store overwrites it)."""

    def _vanished(self, key: BlockKey) -> None:
        with self._lock:
            self.index.forget(key, self.context.clock())

    def breaker(self, route: str = "") -> CircuitBreaker:
        """The breaker of ``route`` (created closed on first use)."""
        br = self._breakers.get(route)
        if br is None:
            br = self._breakers.setdefault(
                route, CircuitBreaker(self.breaker_failures, self.breaker_reset, self.context.clock)
            )
        return br

    # -- the contract -------------------------------------------------------------------------------
    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        probe: str | None = None
        check = False
        with self._lock:
            self.stats.lookups += 1
            route = self._route(key)
            br = self._breakers.get(route)
            if br is not None and not br.peek():
                answer = LookupResult.MISS
                if br.due() and route not in self._probing:
                    self._probing.add(route)
                    probe = route
            else:
                answer = self.index.lookup(key, self.context.clock())
                if answer is LookupResult.HIT:
                    self.stats.hits += 1
                elif self.index.has_queue() and self._checkers < max(1, self.threads // 2):
                    self._checkers += 1
                    check = True
        # Queued outside the lock: the worker pool is created under it on first use.
        if probe is not None and not self.run_on_worker(
            Priority.MAINTENANCE, lambda: self._probe_task(route)
        ):
            with self._lock:
                self._probing.discard(route)
        if check and not self.run_on_worker(Priority.LOAD, self._check_task):
            with self._lock:
                self._checkers -= 1
                self.index.clear_pending()
        return answer

    def lookup_many(self, keys: Sequence[BlockKey], req_context: Any = None) -> list[LookupResult]:
        """:meth:`lookup` of each key; on one server with a closed breaker, the keys the index
        knows are answered in one pass under one lock hold (the same answers and counts)."""
        if self._routed:
            return [self.lookup(k, req_context) for k in keys]
        hit = LookupResult.HIT
        with self._lock:
            br = self._breakers.get("")
            if br is not None and not br.peek():
                answers: list[LookupResult | None] = [None] * len(keys)
            else:
                known = self.index.known
                answers = [hit if k in known else None for k in keys]
                hits = len(keys) - answers.count(None)
                self.stats.lookups += hits
                self.stats.hits += hits
        return [
            a if a is not None else self.lookup(k, req_context) for k, a in zip(keys, answers, strict=True)
        ]

    def touch(self, keys: Iterable[BlockKey]) -> None:
        with self._lock:
            for key in keys:
                if key in self.index.known:
                    self.index.known.move_to_end(key)

    def get_stats(self) -> dict[str, int]:
        out = super().get_stats()
        breakers = list(self._breakers.values())
        out["breaker_open"] = sum(b.code != 0 for b in breakers)
        out["breaker_opens"] = sum(b.opens for b in breakers)
        out["breaker_rejected"] = sum(b.rejected for b in breakers)
        return out

    def config_info(self) -> dict[str, Any]:
        info = super().config_info()
        info["op_timeout"] = self.op_timeout
        info["breakers"] = {r or "server": b.state for r, b in self._breakers.items()}
        return info

    # -- AsyncTier hooks -------------------------------------------------------------------------------
    def _before_store(self, state: JobState) -> None:
        known = self.index.known
        # A hint: keys name content, so a known key needs no write.
        held = [key for key, _ in state.items if key in known]
        new = [(key, slot) for key, slot in state.items if key not in known] if held else state.items
        keep, refused = self._allowed(new)
        state.ok.update(held)
        state.items = keep
        if refused:
            self.stats.dropped_stores += refused
            state.error = state.error or "server unreachable (circuit breaker open); store dropped"

    def _allowed(self, items: list[Item]) -> tuple[list[Item], int]:
        """The items whose route's breaker lets an operation through, and how many it refused
        (each breaker asked once)."""
        if not items:
            return items, 0  # no operation: a breaker asked now would make a trial of nothing
        if not self._routed:
            return (items, 0) if self.breaker("").allow() else ([], len(items))
        keep: list[Item] = []
        allowed: dict[str, bool] = {}
        for key, slot in items:
            route = self._route(key)
            if route not in allowed:
                allowed[route] = self.breaker(route).allow()
            if allowed[route]:
                keep.append((key, slot))
        return keep, len(items) - len(keep)

    def _before_load(self, state: JobState) -> None:
        keep, refused = self._allowed(state.items)
        state.items = keep
        if refused:
            state.error = state.error or "server unreachable (circuit breaker open)"

    def _store_chunk(self, state: JobState, items: list[Item]) -> ChunkOutcome:
        return self._transfer(items, self._put)

    def _load_chunk(self, state: JobState, items: list[Item]) -> ChunkOutcome:
        outcome = self._transfer(items, self._get)
        if outcome.error is None and len(outcome.done) < len(items):
            missing = len({k for k, _ in items}) - len(set(outcome.done))
            if missing:
                return ChunkOutcome(outcome.done, outcome.nbytes, f"{missing} key(s) missing or corrupt")
        return outcome

    def _close_resources(self) -> None:
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            try:
                self._close_client(client)
            except Exception:  # closing a broken connection may fail; nothing to do about it
                self.log.debug("kvtier %s: error closing a client", self.name, exc_info=True)

    # -- internals ------------------------------------------------------------------------------------------
    def _transfer(self, items: list[Item], op: RouteOp) -> ChunkOutcome:
        """``op`` (``_put`` or ``_get``) per route; the keys it moved are known to be on the server
        (and the index has heard from it)."""
        outcome = self._per_route(items, op)
        if outcome.done:
            with self._lock:
                self.index.warm = True
                self.index.add_many(outcome.done)
        return outcome

    def _per_route(self, items: list[Item], op: RouteOp) -> ChunkOutcome:
        # The client first: building it may load what routing needs (a Cluster's slot map).
        ready = self._call("", lambda client: client, answered=False)
        if isinstance(ready, TierError):
            return ChunkOutcome(error=str(ready))
        groups: dict[str, list[Item]] = {}
        if not self._routed:
            groups[""] = items
        else:
            for key, slot in items:
                groups.setdefault(self._route(key), []).append((key, slot))
        done: list[BlockKey] = []
        nbytes = 0
        error: str | None = None
        for route, group in groups.items():
            result = self._call(route, lambda client, r=route, g=group: op(client, r, g))  # type: ignore[misc]
            if isinstance(result, TierError):
                error = error or str(result)
                continue
            done.extend(result.done)
            nbytes += result.nbytes
            error = error or result.error
        return ChunkOutcome(done=done, nbytes=nbytes, error=error)

    def _call(self, route: str, fn: Callable[[Any], T], *, answered: bool = True) -> T | TierError:
        """Run ``fn(client)``; feed the route's breaker (a success only if ``answered``: the server
        took part); return the result or the mapped error."""
        try:
            result = fn(self._client())
        except Exception as exc:
            err = with_hint(self.error_map.translate(exc), self.failure_hint)
            self._on_error(route, err)
            return err
        if answered:
            self.breaker(route).success()
        return result

    def failure_hint(self, err: TierError) -> str | None:
        """What the user can do about ``err`` (appended to its message, so logs, failed jobs and
        ``kvtier check`` show it), or ``None``. Subclasses add their backend's cases."""
        if isinstance(err, RemoteTimeoutError):
            return (
                f"if the server is only slow (a cold gateway's first requests), raise op_timeout "
                f"(now {self.op_timeout:g} s)"
            )
        return None

    def _on_error(self, route: str, err: TierError) -> None:
        where = f" ({route})" if route else ""
        if isinstance(err, TierUnavailableError):
            self.breaker(route).failure()
            self._reset_client()
            self.rlog.warning(f"unavailable{route}", f"kvtier {self.name}: server unreachable{where}: {err}")
        elif isinstance(err, RemoteFullError):
            self.breaker(route).success()  # it answered
            self.store_gate.pause(self.full_backoff, f"server full{where}: {err}")
            self.rlog.warning("full", f"kvtier {self.name}: server full{where}; stores paused: {err}")
        else:
            self.breaker(route).success()
            self.rlog.warning(type(err).__name__, f"kvtier {self.name}: request failed{where}: {err}")

    def _client(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._connect()
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def _reset_client(self) -> None:
        client = getattr(self._local, "client", None)
        self._local.client = None
        if client is None:
            return
        with self._lock:
            if client in self._clients:
                self._clients.remove(client)
        try:
            self._close_client(client)
        except Exception:
            self.log.debug("kvtier %s: error closing a client", self.name, exc_info=True)

    def _check_task(self) -> None:
        while True:
            with self._lock:
                keys = self.index.take_queue(_CHECK_BATCH)
                if not keys:
                    self._checkers -= 1
                    return
            ready = self._call("", lambda client: client, answered=False)
            if isinstance(ready, TierError):
                with self._lock:
                    self.index.abandon(keys)
                continue
            groups: dict[str, list[BlockKey]] = {}
            for key in keys:
                groups.setdefault(self._route(key), []).append(key)
            for route, group in groups.items():
                if not self.breaker(route).peek():
                    answers: list[bool] | TierError = TierUnavailableError("breaker open")
                else:
                    answers = self._call(route, lambda c, r=route, g=group: self._exists(c, r, g))  # type: ignore[misc]
                with self._lock:
                    if isinstance(answers, TierError):
                        self.index.abandon(group)
                    else:
                        self.index.resolve(group, answers, self.context.clock())
                        self.index.warm = True

    def _probe_task(self, route: str) -> None:
        try:
            if self.breaker(route).allow():
                self._call(route, lambda c: self._probe(c, route))
        finally:
            with self._lock:
                self._probing.discard(route)


setattr(RemoteTier, "__signature__", RemoteOptions.signature())  # noqa: B010


def _read_exact(read_into: Callable[[memoryview], int], view: memoryview) -> bool:
    """Fill ``view`` completely; ``False`` if the stream ends first."""
    got = 0
    while got < len(view):
        n = read_into(view[got:])
        if not n:
            return False
        got += n
    return True
