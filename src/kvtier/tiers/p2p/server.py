"""The block server: serves an engine's primary-tier blocks to authenticated peers over TCP.

One accept thread and one thread per connection (at most ``max_connections``; a connection over
the limit gets an ``ERROR`` frame and is closed). Each connection: handshake (HELLO checked against
block size, layout fingerprint and namespace; HMAC challenge-response both ways), then LOOKUP and
FETCH requests until the peer closes, idles past ``idle_timeout`` or breaks the protocol.

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
        max_connections: concurrent peer connections.
        idle_timeout: seconds a connection may sit between requests.
        io_timeout: seconds one socket operation may take (handshake, sending a block).
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
        idle_timeout: float = 60.0,
        io_timeout: float = 5.0,
    ) -> None:
        if not secret:
            raise ConfigError("p2p.secret_env", "the block server needs a non-empty shared secret")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ConfigError("p2p.max_connections", f"expected an integer >= 1, got {max_connections!r}")
        self.engine = engine
        self._secret = secret
        self.layout = layout
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self.idle_timeout = float(idle_timeout)
        self.io_timeout = float(io_timeout)
        self.rlog = RateLimitedLog(log, 10.0)
        self._rows = np.asarray(engine.primary_kv_view)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self.stats = {"connections": 0, "auth_failures": 0, "refused": 0, "protocol_errors": 0,
                      "lookups": 0, "fetches": 0, "blocks_sent": 0, "bytes_sent": 0}  # fmt: skip
        warn_if_exposed(
            log, "p2p block server", host,
            "peers on the network can connect (they still need the shared secret; enable TLS on "
            "untrusted networks)",
        )  # fmt: skip
        try:
            self._listener = socket.create_server((host, port), backlog=max_connections)
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
            try:
                conn, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            if not self._slots.acquire(blocking=False):
                self._count("refused")
                self._refuse(conn, E_BUSY, "server busy: too many connections")
                continue
            t = threading.Thread(
                target=self._serve_conn, args=(conn, addr), daemon=True, name="kvtier-p2p-conn"
            )
            with self._lock:
                self._threads.add(t)
            t.start()

    def _refuse(self, conn: socket.socket, code: int, message: str) -> None:
        try:
            conn.settimeout(0.5)
            conn.sendall(P.encode_frame(P.FrameType.ERROR, 0, P.encode_error(code, message)))
        except OSError:
            pass
        finally:
            conn.close()

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n

    def _serve_conn(self, conn: socket.socket, addr: Any) -> None:
        peer = f"{addr[0]}:{addr[1]}"
        sock: socket.socket = conn
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
            if not self._handshake(sock, peer):
                return
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
                self._threads.discard(threading.current_thread())
            with contextlib.suppress(OSError):
                sock.close()
            self._slots.release()

    def _send_error(self, sock: socket.socket, code: int, message: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            sock.sendall(P.encode_frame(P.FrameType.ERROR, 0, P.encode_error(code, message)))

    def _handshake(self, sock: socket.socket, peer: str) -> bool:
        frame = P.read_frame(sock, limit=1024)
        if frame.type != P.FrameType.HELLO:
            raise P.ProtocolError(f"expected HELLO, got frame type {frame.type}")
        hello = P.decode_hello(frame.payload)
        why = hello.mismatch(self.engine.block_bytes, self.layout, self.engine.namespace)
        if why is not None:
            log.warning("kvtier p2p: refused peer %s: %s", peer, why)
            self._send_error(sock, E_MISMATCH, f"handshake refused: {why}")
            return False
        nonce = P.new_nonce()
        sock.sendall(P.encode_frame(P.FrameType.CHALLENGE, frame.request_id, nonce))
        auth = P.read_frame(sock, limit=64)
        expect = P.auth_mac(self._secret, b"client", frame.payload, hello.nonce, nonce)
        if auth.type != P.FrameType.AUTH or not hmac.compare_digest(auth.payload, expect):
            self._count("auth_failures")
            self.rlog.warning(f"auth{peer}", f"kvtier p2p: peer {peer} failed authentication")
            self._send_error(sock, E_AUTH, "authentication failed")
            return False
        mine = P.auth_mac(self._secret, b"server", frame.payload, hello.nonce, nonce)
        sock.sendall(P.encode_frame(P.FrameType.WELCOME, auth.request_id, mine))
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
