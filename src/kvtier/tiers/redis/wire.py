"""The ``redis`` tier's own paths on a redis-py connection's socket: values sent from slot memory
by gather-writes, and pipelined ``GET`` replies read straight into primary slots.

**Sending** (:func:`send_vectored`): a ``SET`` is a small piece (command, key, length, kvtier's
header) followed by the payload, which stays in the slot. redis-py's ``send_packed_command``
makes one ``sendall`` per piece; :func:`send_vectored` hands both pieces to the kernel in one
``sendmsg`` (one system call per value instead of two, and no joining copy; measured a few per
cent faster with 512 KiB values, benchmarks/bench_remote.py). A TLS socket has no ``sendmsg``;
it gets one ``sendall`` per piece.

**Receiving** (:class:`BulkReader`): redis-py's parsers (hiredis or pure Python) receive into
their own buffer, copy the value into a ``bytes`` object, and the tier then copied that into the
slot: three copies of every payload byte. :class:`BulkReader` parses the RESP2 replies of a
``GET`` pipeline itself and hands each value to the tier's
:meth:`~kvtier.tiers.remote.RemoteTier._receive` as a ``read_into`` stream: the header lands in a
small buffer, the payload is ``recv_into``-ed into the slot (one copy, kernel to slot), then
verified there exactly as before (header, key, namespace, length, checksum).

Contract:
    * :func:`send_vectored` sends every byte of its pieces in order, or raises; each call has the
      socket's timeout as its deadline (like ``sendall``: the whole call, not each system call).
    * Replies are read in order, one per ``GET``: a bulk string (the value), a nil (``$-1``, or
      RESP3's ``_``: the key is gone) or an error (``-`` line or RESP3 ``!`` blob, returned as the
      exception redis-py would raise, so the tier's error map applies). Anything else is a
      protocol error.
    * A value of the wrong length is read and thrown away (the stream stays in step) and reported
      through ``receive`` as the length error it is.
    * Socket trouble raises redis-py's own ``TimeoutError`` / ``ConnectionError``; the caller then
      drops the connection (its stream is out of step). A slot whose payload was cut off is zeroed
      first: a partly received slot never keeps bytes it was not meant to hold.

The tier owns the socket only between sending a pipeline and reading its last reply; redis-py's
parser buffer is empty at those points (every earlier exchange was read to its end, or its
connection dropped), so the two never interleave.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Any

import redis.exceptions as rx

from kvtier.tiers.remote.sockio import send_pieces

__all__ = ["REDIS_PY_RANGE", "BulkReader", "conn_error_parser", "conn_socket", "live_socket", "send_vectored"]

#: The redis-py releases whose ``Connection`` internals this module reads (``_sock``: the connected
#: socket; ``_parser.parse_error``: error reply -> exception). redis-py has no public way to reach
#: either, and the zero-copy paths need both. ``pyproject.toml`` pins the same range and
#: ``tests/unit/test_redis_internals.py`` fails when a release moves them: widen both together.
REDIS_PY_RANGE = ">=5.0,<9"


def conn_socket(conn: Any) -> socket.socket | None:
    """The socket of a redis-py ``Connection`` (``None`` until it connects)."""
    sock: socket.socket | None = conn._sock
    return sock


def live_socket(conn: Any) -> socket.socket:
    """The socket of a redis-py ``Connection``, connecting it first when it is not connected."""
    if conn_socket(conn) is None:
        conn.connect()
    sock = conn_socket(conn)
    if sock is None:  # connect() raises when it cannot connect; this is a redis-py that moved _sock
        raise rx.ConnectionError("redis-py Connection has no _sock after connect (see REDIS_PY_RANGE)")
    return sock


def conn_error_parser(conn: Any) -> Callable[[str], Exception]:
    """redis-py's own mapping of an error reply (``"ERR ..."``) to its exception class."""
    parse: Callable[[str], Exception] = conn._parser.parse_error
    return parse


#: ``receive(size, read_into) -> bool``: consume exactly ``size`` bytes through ``read_into``.
Receive = Callable[[int, Callable[[memoryview], int]], bool]
_BUF = 64 << 10


def send_vectored(sock: socket.socket, pieces: Sequence[bytes | memoryview]) -> None:
    """Send ``pieces`` back to back with as few system calls as the socket takes (see the module
    doc); redis-py's ``TimeoutError`` / ``ConnectionError`` when the socket fails or the
    socket's timeout passes first."""
    try:
        send_pieces(sock, pieces)
    except TimeoutError:
        raise rx.TimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        raise rx.ConnectionError(f"Error while writing to socket: {exc}") from None


class BulkReader:
    """RESP2 reply reader over one connected redis-py connection's socket (see the module doc).

    Args:
        sock: the connection's socket (plain or TLS; its timeout is the operation deadline).
        parse_error: turns an error line into redis-py's exception (the connection parser's).
    """

    def __init__(self, sock: socket.socket, parse_error: Callable[[str], Exception]) -> None:
        self._sock = sock
        self._parse_error = parse_error
        self._buf = bytearray(_BUF)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0

    def value(self, receive: Receive) -> bool | Exception | None:
        """Read one ``GET`` reply: ``receive``'s verdict for a value, ``None`` for a nil, the
        exception for an error reply."""
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            remaining = [size]

            def read_into(view: memoryview) -> int:
                want = min(len(view), remaining[0])
                if want <= 0:
                    return 0
                got = self._read_into(view[:want])
                remaining[0] -= got
                return got

            ok = receive(size, read_into)
            self._skip(remaining[0])  # a value the tier refused (wrong length) is still consumed
            self._expect_crlf()
            return ok
        if kind == b"_":  # RESP3's null (a connection that said HELLO 3)
            return None
        if kind == b"-":
            return self._parse_error(rest.decode("utf-8", "replace"))
        if kind == b"!":  # RESP3's blob error: $-like length, then the message
            text = bytearray(int(rest))
            self._read_exact(memoryview(text))
            self._expect_crlf()
            return self._parse_error(text.decode("utf-8", "replace"))
        raise rx.InvalidResponse(f"unexpected reply to GET: {line[:40]!r}")

    # -- bytes off the socket ----------------------------------------------------------------------
    def _fill(self) -> None:
        """Receive more bytes into the buffer (compacting it first)."""
        if self._start:
            n = self._end - self._start
            self._buf[:n] = self._buf[self._start : self._end]
            self._start, self._end = 0, n
        if self._end == len(self._buf):
            self._buf.extend(bytes(len(self._buf)))  # a line longer than the buffer (never in GET)
            self._view = memoryview(self._buf)
        self._end += self._recv(self._view[self._end :])

    def _recv(self, view: memoryview) -> int:
        try:
            n = self._sock.recv_into(view)
        except TimeoutError:
            raise rx.TimeoutError("Timeout reading from socket") from None
        except OSError as exc:
            raise rx.ConnectionError(f"Error while reading from socket: {exc}") from None
        if not n:
            raise rx.ConnectionError("Connection closed by server.")
        return n

    def _line(self) -> bytes:
        while True:
            i = self._buf.find(b"\r\n", self._start, self._end)
            if i >= 0:
                line = bytes(self._buf[self._start : i])
                self._start = i + 2
                return line
            self._fill()

    def _read_into(self, view: memoryview) -> int:
        """Buffered bytes first, then straight from the socket into ``view`` (no buffer copy)."""
        have = self._end - self._start
        if have:
            n = min(have, len(view))
            view[:n] = self._view[self._start : self._start + n]
            self._start += n
            return n
        return self._recv(view)

    def _read_exact(self, view: memoryview) -> None:
        pos = 0
        while pos < len(view):
            pos += self._read_into(view[pos:])

    def _skip(self, n: int) -> None:
        scratch: Any = None
        while n > 0:
            if self._end > self._start:
                k = min(n, self._end - self._start)
                self._start += k
                n -= k
                continue
            if scratch is None:
                scratch = memoryview(bytearray(min(n, _BUF)))
            n -= self._recv(scratch[: min(n, len(scratch))])

    def _expect_crlf(self) -> None:
        while self._end - self._start < 2:
            self._fill()
        if self._buf[self._start : self._start + 2] != b"\r\n":
            raise rx.InvalidResponse("a bulk reply did not end in CRLF")
        self._start += 2
