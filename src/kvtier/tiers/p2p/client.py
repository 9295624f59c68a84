"""A connection to one peer's block server: handshake, batched lookups, fetches into slots.

A :class:`PeerConnection` is used by one thread at a time (the p2p tier keeps one per worker and
peer). Every call has a deadline, and no single read waits longer than the connect timeout, so a
stalled peer raises :class:`TimeoutError` in bounded time, a dead one ``ConnectionError``, a garbling one
:class:`~kvtier.tiers.p2p.protocol.ProtocolError`. After any exception the connection is unusable (the
stream position is unknown): close it and open a new one.
"""

from __future__ import annotations

import contextlib
import hmac
import socket
import ssl
import time
from collections.abc import Sequence

from kvtier.errors import KvtierError
from kvtier.tiers.p2p import protocol as P
from kvtier.tiers.p2p.protocol import block_checksum
from kvtier.tiers.remote.sockio import is_plain, recv_flags, reusable, set_recv_timeout, use_kernel_timeouts

__all__ = ["PeerConnection", "PeerRefusedError", "parse_peer"]


class PeerRefusedError(KvtierError):
    """The peer answered with an ERROR frame (handshake mismatch, authentication, busy)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_peer(text: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``; ``ValueError`` naming the entry otherwise."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"peer {text!r} is not host:port")
    return host.strip("[]"), int(port)


class PeerConnection:
    """An authenticated connection to the block server at ``host:port``.

    Args:
        block_bytes, layout, namespace: what the handshake presents (the server refuses a mismatch).
        secret: the shared secret. timeout: seconds for connecting and the handshake.
        ssl_context: a client-side context for TLS (``None``: plain TCP).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        block_bytes: int,
        layout: str,
        namespace: str,
        secret: bytes,
        timeout: float = 1.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.block_bytes = block_bytes
        self._rid = 0
        #: The longest any one read may wait (a peer silent that long is stalled), and the current one.
        self._read_timeout = self._timeout = timeout
        deadline = time.monotonic() + timeout
        raw = socket.create_connection((host, port), timeout=timeout)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock: socket.socket = (
                ssl_context.wrap_socket(raw, server_hostname=host) if ssl_context is not None else raw
            )
            if is_plain(self.sock):
                use_kernel_timeouts(self.sock, timeout)  # whole-block reads (kvtier.tiers.remote.sockio)
            self._flags = recv_flags(self.sock)
            self._handshake(
                P.Hello(P.PROTOCOL_VERSION, block_bytes, layout, namespace, P.new_nonce()), secret, deadline
            )
        except BaseException:
            raw.close()
            raise

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def reusable(self) -> bool:
        """Whether this idle connection can take the next request
        (:func:`~kvtier.tiers.remote.sockio.reusable`)."""
        return reusable(self.sock)

    # -- requests ------------------------------------------------------------------------------
    def lookup(self, keys: Sequence[bytes], timeout: float) -> list[bool]:
        """Whether the peer holds each key now (one round trip)."""
        deadline = time.monotonic() + timeout
        rid = self._send(P.FrameType.LOOKUP, P.encode_keys(keys))
        frame = self._expect(P.FrameType.LOOKUP_REPLY, rid, deadline)
        if len(frame.payload) != len(keys) or any(b > 1 for b in frame.payload):
            raise P.ProtocolError("lookup reply does not match the request")
        return [b == 1 for b in frame.payload]

    def fetch(
        self, keys: Sequence[bytes], dests: Sequence[memoryview], timeout: float, verify: bool = True
    ) -> list[bool | None]:
        """Fetch ``keys[i]`` into ``dests[i]`` (``block_bytes`` each, written by ``recv_into``).

        Per key: ``True`` filled (and, with ``verify``, its checksum matched), ``None`` the peer
        does not hold it, ``False`` its bytes failed the checksum. Only ``True`` destinations hold
        a valid block.
        """
        deadline = time.monotonic() + timeout
        rid = self._send(P.FrameType.FETCH, P.encode_keys(keys), P.FLAG_CHECKSUM if verify else 0)
        frame = self._expect(P.FrameType.FETCH_REPLY, rid, deadline)
        entries = P.decode_fetch_reply(frame.payload, len(keys))
        out: list[bool | None] = []
        for key, dest, (present, checksum) in zip(keys, dests, entries, strict=True):
            if not present:
                out.append(None)
                continue
            self._recv_into(dest, deadline)
            out.append(not verify or block_checksum(key, dest) == checksum)
        return out

    # -- internals -------------------------------------------------------------------------------
    def _handshake(self, hello: P.Hello, secret: bytes, deadline: float) -> None:
        body = P.encode_hello(hello)
        rid = self._send(P.FrameType.HELLO, body)
        challenge = self._expect(P.FrameType.CHALLENGE, rid, deadline)
        if len(challenge.payload) != P.NONCE_BYTES:
            raise P.ProtocolError("bad challenge")
        mac = P.auth_mac(secret, b"client", body, hello.nonce, challenge.payload)
        rid = self._send(P.FrameType.AUTH, mac)
        welcome = self._expect(P.FrameType.WELCOME, rid, deadline)
        expect = P.auth_mac(secret, b"server", body, hello.nonce, challenge.payload)
        if not hmac.compare_digest(welcome.payload, expect):
            raise PeerRefusedError(P.FrameType.WELCOME, "the peer does not know the shared secret")

    def _send(self, ftype: int, payload: bytes, flags: int = 0) -> int:
        self._rid = (self._rid + 1) & 0xFFFFFFFF
        try:
            self.sock.sendall(P.encode_frame(ftype, self._rid, payload, flags))
        except BlockingIOError:  # the kernel's send timeout (a plain socket)
            raise TimeoutError("peer stopped reading requests") from None
        return self._rid

    def _expect(self, ftype: int, rid: int, deadline: float) -> P.Frame:
        head = bytearray(P.HEADER.size)
        self._recv_into(memoryview(head), deadline)
        got, flags, got_rid, length = P.parse_header(bytes(head))
        payload = bytearray(length)
        if length:
            self._recv_into(memoryview(payload), deadline)
        if got == P.FrameType.ERROR:
            code, message = P.decode_error(bytes(payload))
            raise PeerRefusedError(code, message)
        if got != ftype or got_rid != rid:
            raise P.ProtocolError(f"expected frame {ftype} #{rid}, got {got} #{got_rid}")
        return P.Frame(got, got_rid, bytes(payload), flags)

    def _recv_into(self, view: memoryview, deadline: float) -> None:
        got, n = 0, view.nbytes
        sock, flags = self.sock, self._flags
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("peer too slow: request deadline passed")
            # Each read waits at most the connect timeout (a peer silent that long is stalled) and
            # never much past the deadline. Setting it is a syscall, so it changes only when it is
            # off by more than 10%, not on every read of a block.
            want = min(self._timeout, left)
            if abs(want - self._read_timeout) > 0.1 * self._read_timeout:
                set_recv_timeout(sock, want)
                self._read_timeout = want
            try:
                k = sock.recv_into(view[got:], n - got, flags)
            except BlockingIOError:  # the kernel's read timeout passed with nothing received
                raise TimeoutError("peer stalled: nothing received within the read timeout") from None
            if k == 0:
                raise ConnectionError("peer closed the connection mid-transfer")
            got += k
