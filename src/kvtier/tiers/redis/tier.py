"""The ``redis`` tier: KV blocks in Redis, Valkey or a Redis Cluster, shared by every instance.

Config (docs/remote.md has copyable examples)::

    {"type": "redis", "url": "redis://10.0.0.5:6379/0"}
    {"type": "redis", "url": "redis://10.0.0.5:7000", "cluster": true}

``url`` is ``redis://``, ``rediss://`` (TLS), ``unix:///path/redis.sock`` or, for a Cluster,
``redis+cluster://`` / ``rediss+cluster://`` (or ``cluster: true``) naming any one node. A password
goes in the URL or, better, in the environment variable named by ``password_env``; it is never
logged (``config_info`` shows the URL without it).

* **Keys** are ``<key_prefix>:<namespace>:<block key bytes>``: the namespace (model, layout, tenant
  salt) keeps tenants and models apart, and the block's header repeats it, so a value copied under
  another key or namespace is never served.
* **Values** are :mod:`kvtier.codec` blobs. Writes send the header and the primary slot's bytes
  straight to the socket in one gather-write per value (no concatenation, no copy through a
  packer: redis-py's hiredis packer copies every argument and makes large ``SET``\\ s several
  times slower), pipelined per chunk and per server; reads are pipelined ``GET``\\ s whose values
  are received straight into the slot and verified there (both in :mod:`kvtier.tiers.redis.wire`).
  ``ttl`` (seconds) sets an expiry on every write.
* **Capacity** is the server's: set ``maxmemory`` and an ``allkeys-*`` eviction policy on it. kvtier
  treats its own index as a hint: a key the server evicted is a miss, not an error; an out-of-memory
  reply pauses stores for ``full_backoff`` seconds.
* **Cluster**: keys are routed to their slot's master with the client's slot map; each master has
  its own circuit breaker, so a dead master makes only its keys miss. A ``MOVED`` reply refreshes
  the slot map.

Options: :class:`~kvtier.tiers.redis.options.RedisOptions` (the common ones, threads, deadlines,
breaker, back-pressure, are :class:`~kvtier.tiers.remote.options.RemoteOptions`').
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import redis
import redis.exceptions as rx
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.retry import Retry

from kvtier.errors import TierError, TierUnavailableError
from kvtier.keys import BlockKey
from kvtier.tiers.async_tier import ChunkOutcome
from kvtier.tiers.base import TierContext
from kvtier.tiers.redis.options import RedisOptions, redact
from kvtier.tiers.redis.wire import BulkReader, conn_error_parser, conn_socket, live_socket, send_vectored
from kvtier.tiers.remote.base import RemoteTier
from kvtier.tiers.remote.errors import (
    ErrorMap,
    RemoteFullError,
    RemoteRejectedError,
    RemoteTimeoutError,
)
from kvtier.tiers.remote.options import RemoteOptions
from kvtier.tiers.remote.sockio import reusable
from kvtier.transfer.workers import Priority

__all__ = ["REDIS_ERRORS", "RedisTier"]

Item = tuple[BlockKey, int]
_SMALL = 16 << 10  # pieces under this are joined before sending; larger ones go out as they are

#: Every redis-py exception, mapped (tests/integration/test_redis_errors.py checks the coverage).
REDIS_ERRORS = ErrorMap(
    "redis",
    [
        (rx.RedisError, TierError),
        (rx.ConnectionError, TierUnavailableError),
        (rx.TimeoutError, RemoteTimeoutError),
        (rx.BusyLoadingError, TierUnavailableError),
        (rx.AuthenticationError, RemoteRejectedError),
        (rx.AuthorizationError, RemoteRejectedError),
        (rx.ExternalAuthProviderError, RemoteRejectedError),
        (rx.MaxConnectionsError, TierUnavailableError),
        (rx.ResponseError, RemoteRejectedError),
        (rx.OutOfMemoryError, RemoteFullError),
        (rx.ReadOnlyError, TierUnavailableError),  # a replica after failover: retry elsewhere
        (rx.ClusterError, TierUnavailableError),
        (rx.ClusterDownError, TierUnavailableError),
        (rx.TryAgainError, TierUnavailableError),
        (rx.AskError, TierError),  # MOVED/ASK: the slot map is stale (refreshed by the tier)
        (rx.RedisClusterException, TierUnavailableError),
        (rx.ChildDeadlockedError, TierError),
        (rx.IncorrectPolicyType, TierError),
        (rx.InvalidResponse, TierUnavailableError),
    ],
)


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(_bulk(a) for a in args)


class _Conns:
    """The calling worker thread's connections, one per route (server)."""

    def __init__(self) -> None:
        self.by_route: dict[str, Any] = {}

    def close(self) -> None:
        for conn in self.by_route.values():
            conn.disconnect()
        self.by_route.clear()


class RedisTier(RemoteTier):
    """KV blocks in Redis / Valkey / Redis Cluster (see the module doc); its options are
    :class:`~kvtier.tiers.redis.options.RedisOptions`."""

    error_map: ClassVar[ErrorMap] = REDIS_ERRORS
    options_class: ClassVar[type[RemoteOptions]] = RedisOptions
    options: RedisOptions

    def __init__(self, *, primary_kv_view: memoryview, context: TierContext, **config: Any) -> None:
        super().__init__(primary_kv_view=primary_kv_view, context=context, **config)
        o = self.options
        self.cluster = o.is_cluster
        self.ttl_ms = None if o.ttl is None else int(o.ttl * 1000)
        self._url = o.client_url()
        self._password = o.secret()
        self._shown_url = redact(self._url)
        self._tls = o.tls
        self._ca_file = o.ca_file()
        self._prefix = f"{o.key_prefix}:{context.namespace}:".encode()
        self._shared_lock = threading.Lock()
        self._conn_pool: Any = None
        self._cluster: Any = None
        self._refreshing = False

    # -- RemoteTier hooks --------------------------------------------------------------------------
    def _route(self, key: BlockKey) -> str:
        cl = self._cluster
        if cl is None:
            return ""
        try:
            node = cl.nodes_manager.get_node_from_slot(key_slot(self._prefix + key))
        except Exception:  # slot not covered (the map is being rebuilt): the cluster-wide route
            return ""
        return str(node.name)

    def _connect(self) -> _Conns:
        with self._shared_lock:
            if self.cluster and self._cluster is None:
                self._cluster = RedisCluster.from_url(self._url, **self._conn_options(cluster=True))
            elif not self.cluster and self._conn_pool is None:
                self._conn_pool = redis.ConnectionPool.from_url(
                    self._url, **self._conn_options(cluster=False)
                )
        return _Conns()

    def _close_client(self, client: Any) -> None:
        client.close()

    def _close_resources(self) -> None:
        super()._close_resources()
        if self._conn_pool is not None:
            self._conn_pool.disconnect()
        if self._cluster is not None:
            self._cluster.close()

    def _put(self, client: Any, route: str, items: list[Item]) -> ChunkOutcome:
        def send(conn: Any) -> None:
            sock = live_socket(conn)
            for pieces in self._set_commands(items):
                send_vectored(sock, pieces)

        replies = self._exchange(client, route, send, len(items))
        done = [key for (key, _), r in zip(items, replies, strict=True) if not isinstance(r, Exception)]
        return self._outcome(route, done, replies)

    def _set_commands(self, items: list[Item]) -> Iterator[tuple[bytes | memoryview, ...]]:
        """The ``SET`` pipeline of ``items`` as groups of pieces to send together, made as they
        are sent.

        Each block is summed just before its payload goes out, so the socket copy reads bytes the
        checksum pass has just brought into the CPU cache (summing the whole chunk first would
        evict them again: one more trip to memory per block). Small pieces (command, key, header,
        a small payload) are joined; a large payload is sent as the slot's own memory, in one
        group with the small piece before it (:func:`~kvtier.tiers.redis.wire.send_vectored`).
        """
        tail = b"\r\n" if self.ttl_ms is None else b"\r\n" + _bulk(b"PX") + _bulk(b"%d" % self.ttl_ms)
        argc = b"*3\r\n$3\r\nSET\r\n" if self.ttl_ms is None else b"*5\r\n$3\r\nSET\r\n"
        small: list[bytes] = []
        for key, slot in items:
            head, payload = self._blob_parts(key, slot)
            small += (argc, _bulk(self._prefix + key), b"$%d\r\n" % (len(head) + payload.nbytes), head)
            if payload.nbytes < _SMALL:
                small.append(payload.tobytes())
            else:
                yield b"".join(small), payload
                small = []
            small.append(tail)
        yield (b"".join(small),)

    def _get(self, client: Any, route: str, items: list[Item]) -> ChunkOutcome:
        """Pipelined ``GET``\\ s whose values are received straight into their slots
        (:mod:`kvtier.tiers.redis.wire`: one copy, kernel to slot) and verified there."""
        packed = b"".join(_command(b"GET", self._prefix + key) for key, _ in items)
        conn = self._connection(client, route)
        replies: list[Any] = []
        done: list[BlockKey] = []
        slot = -1
        try:
            conn.send_packed_command([packed], check_health=False)
            reader = BulkReader(live_socket(conn), conn_error_parser(conn))
            for key, slot in items:
                reply = reader.value(functools.partial(self._receive_sized, key, slot))
                if reply is None:
                    self._vanished(key)
                elif reply is True:
                    done.append(key)
                replies.append(reply)
        except BaseException:
            if slot >= 0:  # a value cut off mid-payload: never leave its partial bytes behind
                self.slot_array(slot)[:] = 0
            client.by_route.pop(route, None)
            conn.disconnect()
            raise
        return self._outcome(route, done, replies)

    def _receive_sized(self, key: BlockKey, slot: int, size: int, read_into: Any) -> bool:
        return self._receive(key, slot, read_into, size)

    def _exists(self, client: Any, route: str, keys: list[BlockKey]) -> list[bool]:
        packed = b"".join(_command(b"EXISTS", self._prefix + key) for key in keys)
        replies = self._pipeline(client, route, [packed], len(keys))
        for r in replies:
            if isinstance(r, Exception):
                raise r
        return [bool(r) for r in replies]

    def _drop_corrupt(self, key: BlockKey) -> None:
        route = self._route(key)

        def drop() -> None:
            # Best effort, after the load has answered: until then the bad value is simply a miss.
            self._call(route, lambda c: self._pipeline(c, route, [_command(b"DEL", self._prefix + key)], 1))

        self.run_on_worker(Priority.MAINTENANCE, drop)

    def config_info(self) -> dict[str, Any]:
        info = super().config_info()
        info.update(
            url=self._shown_url, cluster=self.cluster, ttl_ms=self.ttl_ms, key_prefix=self._prefix.decode()
        )
        return info

    # -- internals -----------------------------------------------------------------------------------
    def _conn_options(self, *, cluster: bool) -> dict[str, Any]:
        opts: dict[str, Any] = {
            "socket_timeout": self.op_timeout,
            "socket_connect_timeout": self.op_timeout,
        }
        if not cluster:
            opts["retry"] = Retry(NoBackoff(), 0)  # the breaker decides about retrying, not the client
            opts["health_check_interval"] = 0
        if self._password is not None:
            opts["password"] = self._password
        if self._tls:  # a rediss:// URL: verified TLS, the host name included
            opts["ssl_cert_reqs"] = "required"
            opts["ssl_check_hostname"] = True
            if self._ca_file is not None:
                opts["ssl_ca_certs"] = self._ca_file
        return opts

    def _connection(self, client: _Conns, route: str) -> Any:
        conn = client.by_route.get(route)
        if conn is None:
            if self.cluster:
                cl = self._cluster
                node = cl.get_node(node_name=route) if route else cl.get_default_node()
                if node is None:
                    raise rx.ConnectionError(f"no cluster node {route!r} in the slot map")
                pool = cl.get_redis_connection(node).connection_pool
            else:
                pool = self._conn_pool
            conn = pool.get_connection()
            client.by_route[route] = conn
        elif (sock := conn_socket(conn)) is not None and not reusable(sock):
            # The server closed it while this worker did not need it (a restart, its idle
            # `timeout`): reconnect before sending, as redis-py's own pool does, instead of
            # failing the next job on a dead socket. The send below connects again. Each exchange
            # reads exactly its replies and a failed one disconnects, so redis-py's parser holds
            # no bytes between requests: the socket alone tells (the check every tier shares).
            conn.disconnect()
        return conn

    def _pipeline(self, client: _Conns, route: str, chunks: list[bytes], n: int) -> list[Any]:
        """Send ``chunks`` (``n`` packed commands) and read the ``n`` replies (:meth:`_exchange`)."""
        return self._exchange(
            client, route, lambda conn: conn.send_packed_command(chunks, check_health=False), n
        )

    def _exchange(self, client: _Conns, route: str, send: Callable[[Any], None], n: int) -> list[Any]:
        """``send(connection)`` (``n`` commands) and read ``n`` replies; an error reply is
        returned in its place, anything else (a dead socket) closes the connection and raises."""
        conn = self._connection(client, route)
        try:
            send(conn)
            replies: list[Any] = []
            for _ in range(n):
                try:
                    replies.append(conn.read_response())
                except rx.ResponseError as exc:  # one command failed; the stream is still in step
                    replies.append(exc)
        except BaseException:
            client.by_route.pop(route, None)
            conn.disconnect()
            raise
        return replies

    def _outcome(self, route: str, done: list[BlockKey], replies: list[Any]) -> ChunkOutcome:
        errors = [r for r in replies if isinstance(r, Exception)]
        if not errors:
            return ChunkOutcome(done=done, nbytes=len(done) * self.block_bytes)
        err = self.error_map.translate(errors[0])
        self._on_error(route, err)
        if isinstance(errors[0], rx.AskError):
            self._refresh_slots()
        return ChunkOutcome(done=done, nbytes=len(done) * self.block_bytes, error=str(err))

    def _refresh_slots(self) -> None:
        if self._cluster is None or self._refreshing:
            return
        self._refreshing = True

        def refresh() -> None:
            try:
                self._cluster.nodes_manager.initialize()
            except Exception as exc:
                self.rlog.warning(
                    "slots", f"kvtier {self.name}: slot map refresh failed: {type(exc).__name__}"
                )
            finally:
                self._refreshing = False

        if not self.run_on_worker(Priority.MAINTENANCE, refresh):
            self._refreshing = False
