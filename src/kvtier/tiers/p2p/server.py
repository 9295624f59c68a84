"""The block server: serves an engine's primary-tier blocks to authenticated peers over TCP.

One accept thread and one thread per connection. Each connection: handshake (HMAC
challenge-response both ways, then HELLO checked against block size, layout fingerprint and
namespace), then LOOKUP and FETCH requests until the peer closes, idles past ``idle_timeout`` or
breaks the protocol.

Connections are counted in two pools so that strangers cannot lock out peers: at most
``max_pending`` unauthenticated ones (a new one over the limit pushes out the oldest, so holding
the pool takes a constant stream of connections, not a few slow ones), each with ``io_timeout``
for its *whole* handshake (a byte now and then does not extend it), and at most
``max_connections`` authenticated ones (more get ``ERROR`` "busy"). Nothing about this server's
namespace, layout or block size is said to a peer before it proved it has the secret.

A FETCH pins the blocks it sends (:meth:`Serving.pin_resident`) and releases them only after the
last byte went out, so eviction never tears a block mid-send; block bytes are written to the
socket from the primary tier's buffer (no copy). Every socket operation has a timeout, so a stalled
peer costs one thread for at most that long; a malformed frame ends only its connection.

The engine side is :class:`ServedEngine`: ``namespace``, ``block_bytes``, ``primary_kv_view``,
``serving`` (:class:`~kvtier.engine.serving.Serving`: ``resident``, ``pin_resident``) and
``complete_load``.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import socket
import ssl
import threading
import time
from typing import Any, Protocol

import numpy as np

from kvtier.errors import ConfigError
from kvtier.keys import BlockKey
from kvtier.netaddr import is_loopback, warn_if_exposed
from kvtier.numbers import CONNECTIONS, SECONDS, check_number
from kvtier.tiers.p2p import protocol as P
from kvtier.tiers.p2p.protocol import block_checksum
from kvtier.tiers.ratelog import RateLimitedLog
from kvtier.tiers.remote.sockio import is_plain, send_buffers, set_recv_timeout, use_kernel_timeouts

__all__ = ["BlockServer", "ServedEngine", "block_checksum", "is_loopback"]

log = logging.getLogger("kvtier.tiers.p2p.server")

#: Error codes of ERROR frames.
E_MISMATCH, E_AUTH, E_PROTOCOL, E_BUSY, E_INTERNAL = 1, 2, 3, 4, 5


class ServingSlots(Protocol):
    """What the server needs of an engine's peer-serving component (``kvtier.engine.serving``):
    named structurally, so this package sits below the engine and never imports it."""

    def resident(self, keys: Any) -> Any: ...

    def pin_resident(self, keys: Any) -> Any: ...


class ServedEngine(Protocol):
    namespace: str
    block_bytes: int
    primary_kv_view: memoryview

    @property
    def serving(self) -> ServingSlots: ...  # read-only, so an engine's own Serving type conforms

    def complete_load(self, handle: Any) -> None: ...


class BlockServer:
    """Serve ``engine``'s primary blocks on ``host:port`` (``port`` 0: any free port).

    Args:
        secret: the shared secret (see :func:`kvtier.tiers.p2p.protocol.load_secret`); never logged.
        layout: the layout fingerprint peers must present (same model and KV layout).
        ssl_context: a server-side context for TLS (``None``: plain TCP).
        max_connections: concurrent authenticated peer connections (1..MAX_CONNECTIONS).
        max_pending: concurrent unauthenticated connections (1..MAX_CONNECTIONS); the oldest is
            dropped when a new one arrives over the limit.
        idle_timeout: seconds a connection may sit between requests.
        io_timeout: seconds one socket operation may take (sending a block), and the deadline of
            the whole handshake.
    """

    def __init__(
        self,
        engine: ServedEngine,
        *,
        secret: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        layout: str = "",
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = 64,
        max_pending: int = 16,
        idle_timeout: float = 60.0,
        io_timeout: float = 5.0,
    ) -> None:
        if not secret:
            raise ConfigError("p2p.secret_env", "the block server needs a non-empty shared secret")
        self.max_connections = int(check_number("serve.max_connections", max_connections, CONNECTIONS))
        self.max_pending = int(check_number("serve.max_pending", max_pending, CONNECTIONS))
        self.idle_timeout = check_number("serve.idle_timeout", idle_timeout, SECONDS)
        self.io_timeout = check_number("serve.io_timeout", io_timeout, SECONDS)
        self.engine = engine
        self._secret = secret
        self.layout = layout
        self.ssl_context = ssl_context
        self.rlog = RateLimitedLog(log, 10.0)
        self._rows = np.asarray(engine.primary_kv_view)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        #: Unauthenticated connections -> the deadline of their handshake (accept thread enforces it).
        self._pending: dict[socket.socket, float] = {}
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self.stats = {"connections": 0, "auth_failures": 0, "refused": 0, "protocol_errors": 0,
                      "handshake_timeouts": 0, "pending_dropped": 0,
                      "lookups": 0, "fetches": 0, "blocks_sent": 0, "bytes_sent": 0}  # fmt: skip
        warn_if_exposed(
            log, "p2p block server", host,
            "peers on the network can connect (they still need the shared secret; enable TLS on "
            "untrusted networks)",
        )  # fmt: skip
        try:
            self._listener = socket.create_server(
                (host, port), backlog=min(self.max_pending + self.max_connections, 1024)
            )
        except OSError as exc:
            raise ConfigError("p2p.port", f"cannot listen on {host}:{port}: {exc.strerror}") from None
        self._listener.settimeout(0.2)  # the accept loop checks for close() this often
        self.host, self.port = self._listener.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept_loop, name="kvtier-p2p-accept", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """``host:port`` as peers and the directory name this server."""
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        """Stop accepting, end every connection and wait for their threads (bounded), so no thread
        still reads the primary buffer when the engine releases it. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
            threads = list(self._threads)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + self.io_timeout + 1.0
        for t in threads:  # a shut-down socket fails their next send/recv at once
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> BlockServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connections ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            self._end_late_handshakes()
            try:
                conn, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            with self._lock:
                if len(self._pending) >= self.max_pending:
                    # Push out the oldest stranger: a few slow connections cannot hold the pool.
                    oldest = min(self._pending, key=self._pending.__getitem__)
                    del self._pending[oldest]
                    self.stats["pending_dropped"] += 1
                    _shut(oldest)
                self._pending[conn] = time.monotonic() + self.io_timeout
            t = threading.Thread(
                target=self._serve_conn, args=(conn, addr), daemon=True, name="kvtier-p2p-conn"
            )
            with self._lock:
                self._threads.add(t)
            t.start()

    def _end_late_handshakes(self) -> None:
        """Shut down every connection whose handshake passed its deadline (its thread's next read
        fails at once), however often it sent a byte."""
        now = time.monotonic()
        with self._lock:
            late = [c for c, deadline in self._pending.items() if deadline <= now]
            for c in late:
                del self._pending[c]
            self.stats["handshake_timeouts"] += len(late)
        for c in late:
            _shut(c)

    def _authenticated(self, conn: socket.socket) -> bool:
        """Move ``conn`` from the pending pool to an authenticated slot; ``False`` when it was
        already dropped from the pool or every slot is taken."""
        with self._lock:
            if self._pending.pop(conn, None) is None:
                return False  # dropped or timed out between its last read and now
        if not self._slots.acquire(blocking=False):
            self._count("refused")
            return False
        return True

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n

    def _serve_conn(self, conn: socket.socket, addr: Any) -> None:
        peer = f"{addr[0]}:{addr[1]}"
        sock: socket.socket = conn
        slot = False
        with self._lock:
            self._conns.add(conn)
            self.stats["connections"] += 1
        try:
            conn.settimeout(self.io_timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ssl_context is not None:
                sock = self.ssl_context.wrap_socket(conn, server_side=True)
            if is_plain(sock):
                use_kernel_timeouts(sock, self.io_timeout)  # one sendmsg per FETCH (remote.sockio)
            slot = self._handshake(sock, conn, peer)
            if slot:
                self._request_loop(sock)
        except P.ProtocolError as exc:
            self._count("protocol_errors")
            self.rlog.warning("protocol", f"kvtier p2p: peer {peer} broke the protocol: {exc}")
            self._send_error(sock, E_PROTOCOL, str(exc))
        except (OSError, ssl.SSLError):  # the peer went away, stalled, or TLS failed: end quietly
            pass
        except Exception:  # a bug must end this connection only, never the server
            self.rlog.warning("internal", f"kvtier p2p: error serving {peer}", exc_info=True)
            self._send_error(sock, E_INTERNAL, "internal server error")
        finally:
            with self._lock:
                self._conns.discard(conn)
                self._pending.pop(conn, None)
                self._threads.discard(threading.current_thread())
            with contextlib.suppress(OSError):
                sock.close()
            if slot:
                self._slots.release()

    def _send_error(self, sock: socket.socket, code: int, message: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            sock.sendall(P.encode_frame(P.FrameType.ERROR, 0, P.encode_error(code, message)))

    def _handshake(self, sock: socket.socket, conn: socket.socket, peer: str) -> bool:
        """Authenticate the peer and take an authenticated slot for ``conn``; ``False`` (an
        ERROR sent) when it fails, mismatches or no slot is free."""
        frame = P.read_frame(sock, limit=1024)
        if frame.type != P.FrameType.HELLO:
            raise P.ProtocolError(f"expected HELLO, got frame type {frame.type}")
        hello = P.decode_hello(frame.payload)
        nonce = P.new_nonce()
        sock.sendall(P.encode_frame(P.FrameType.CHALLENGE, frame.request_id, nonce))
        auth = P.read_frame(sock, limit=64)
        expect = P.auth_mac(self._secret, b"client", frame.payload, hello.nonce, nonce)
        if auth.type != P.FrameType.AUTH or not hmac.compare_digest(auth.payload, expect):
            self._count("auth_failures")
            self.rlog.warning(f"auth{peer}", f"kvtier p2p: peer {peer} failed authentication")
            self._send_error(sock, E_AUTH, "authentication failed")
            return False
        # Only an authenticated peer learns why its settings do not match ours.
        why = hello.mismatch(self.engine.block_bytes, self.layout, self.engine.namespace)
        if why is not None:
            log.warning("kvtier p2p: refused peer %s: %s", peer, why)
            self._send_error(sock, E_MISMATCH, f"handshake refused: {why}")
            return False
        if not self._authenticated(conn):
            self._send_error(sock, E_BUSY, "server busy: too many connections")
            return False
        mine = P.auth_mac(self._secret, b"server", frame.payload, hello.nonce, nonce)
        try:
            sock.sendall(P.encode_frame(P.FrameType.WELCOME, auth.request_id, mine))
        except BaseException:
            self._slots.release()  # the caller never learns it held one
            raise
        return True

    def _request_loop(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            set_recv_timeout(sock, self.idle_timeout)
            try:
                frame = P.read_frame(sock)
            except ConnectionError:
                return
            set_recv_timeout(sock, self.io_timeout)
            if frame.type == P.FrameType.LOOKUP:
                keys = [BlockKey(k) for k in P.decode_keys(frame.payload)]
                held = self.engine.serving.resident(keys)
                self._count("lookups", len(keys))
                reply = P.encode_frame(P.FrameType.LOOKUP_REPLY, frame.request_id, bytes(map(int, held)))
                sock.sendall(reply)
            elif frame.type == P.FrameType.FETCH:
                self._fetch(sock, frame)
            else:
                raise P.ProtocolError(f"unexpected frame type {frame.type} after the handshake")

    def _fetch(self, sock: socket.socket, frame: P.Frame) -> None:
        keys = [BlockKey(k) for k in P.decode_keys(frame.payload)]
        handle = self.engine.serving.pin_resident(keys)
        try:
            slot_of = dict(zip(handle.keys, np.asarray(handle.slots).tolist(), strict=True))
            bb = self.engine.block_bytes
            views = []
            entries = []
            for k in keys:
                s = slot_of.get(k)
                if s is None:
                    entries.append((False, 0))
                    continue
                view = self._rows[s, :bb].data
                views.append(view)
                entries.append((True, block_checksum(k, view) if frame.flags & P.FLAG_CHECKSUM else 0))
            reply = P.encode_frame(P.FrameType.FETCH_REPLY, frame.request_id, P.encode_fetch_reply(entries))
            # The reply table and every block in one scatter-gather send, straight from the
            # pinned rows; as before, each block may take io_timeout.
            send_buffers(sock, [reply, *views], time.monotonic() + self.io_timeout * max(len(views), 1))
            with self._lock:
                self.stats["fetches"] += 1
                self.stats["blocks_sent"] += len(views)
                self.stats["bytes_sent"] += len(views) * bb
        finally:
            self.engine.complete_load(handle)  # only now may the blocks be evicted or rewritten


def _shut(conn: socket.socket) -> None:
    """End ``conn`` from another thread: its owner's blocked read returns at once."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
