"""Socket I/O of the network tiers: gather-writes, kernel timeouts, whole-block reads, and the check
that an idle kept connection can take the next request.

Two timeout styles, by what the caller streams:

* **Python timeouts** (the redis and obj tiers): :func:`send_pieces` sends a small header, then a
  slot's memory, back to back with as few system calls as the socket allows and no joining copy,
  within the socket's timeout for the whole call (like ``sendall``); it raises the builtin
  ``TimeoutError`` when that passes and ``OSError`` when the peer or the network fails. A plain
  socket gets ``sendmsg`` with every piece at once, TLS one ``sendall`` per piece.
* **Kernel timeouts** (the p2p data path). A Python socket with a timeout is non-blocking
  underneath: every ``recv``/``send`` is preceded by a ``poll`` and a big buffer goes out in as many
  partial sends as the socket buffer takes, each a trip through the interpreter. A plain TCP socket
  here is instead left *blocking* with the timeout set in the kernel (``SO_RCVTIMEO``/
  ``SO_SNDTIMEO``, :func:`use_kernel_timeouts`): a ``recv_into(..., MSG_WAITALL)`` fills a whole
  block in one call and one ``sendmsg`` queues a reply table and all its blocks
  (:func:`send_buffers`), while a stalled peer still fails the call within the timeout (the kernel
  returns what it has, or ``EAGAIN``, which is raised as :class:`TimeoutError`). TLS sockets keep
  Python's timeouts (the ``ssl`` module supports neither ``MSG_WAITALL`` nor ``sendmsg``).

:func:`reusable` is the one dead-idle-connection check every tier that keeps connections uses.
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import time
from collections.abc import Sequence

__all__ = [
    "is_plain",
    "recv_flags",
    "reusable",
    "send_buffers",
    "send_pieces",
    "set_recv_timeout",
    "use_kernel_timeouts",
]

#: Buffers per ``sendmsg`` (Linux's IOV_MAX is 1024).
_IOV_MAX = 1024


def is_plain(sock: socket.socket) -> bool:
    """A plain TCP socket (not TLS): the fast path applies."""
    return not isinstance(sock, ssl.SSLSocket)


def _timeval(seconds: float) -> bytes:
    seconds = max(seconds, 1e-3)  # 0 would mean "no timeout" to the kernel
    whole = int(seconds)
    return struct.pack("@ll", whole, int((seconds - whole) * 1e6))


def use_kernel_timeouts(sock: socket.socket, timeout: float) -> None:
    """Make a plain socket blocking with ``timeout`` on every read and write, in the kernel."""
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(timeout))


def set_recv_timeout(sock: socket.socket, timeout: float) -> None:
    """The timeout of each read: the kernel's on a plain socket, Python's on TLS."""
    if is_plain(sock):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout))
    else:
        sock.settimeout(timeout)


def reusable(sock: socket.socket) -> bool:
    """Whether an idle request/response connection can take the next request.

    Between requests nothing may arrive. A readable socket therefore means the peer closed it (a
    restart, its idle timeout), reset it, or sent something unasked: in each case the next request
    would fail or read out of step, so the caller opens a new connection instead (one ``poll``,
    no I/O, when all is well). On TLS a record without data (a TLS 1.3 session ticket) also makes
    the socket readable; it is consumed here by a non-blocking read and does not count.
    """
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        readable = bool(poller.poll(0))
    except (OSError, ValueError):  # closed already
        return False
    if is_plain(sock):
        return not readable
    assert isinstance(sock, ssl.SSLSocket)
    if not readable and not sock.pending():
        return True
    timeout = sock.gettimeout()
    try:
        sock.settimeout(0)
        sock.recv(1)  # b"" is the peer's close; a byte is data nobody asked for
        return False
    except (ssl.SSLWantReadError, BlockingIOError):
        return True  # only TLS housekeeping arrived
    except OSError:
        return False
    finally:
        sock.settimeout(timeout)


def recv_flags(sock: socket.socket) -> int:
    """``MSG_WAITALL`` where it works (plain sockets): one read per block, not per segment burst."""
    return socket.MSG_WAITALL if is_plain(sock) else 0


def send_buffers(sock: socket.socket, buffers: Sequence[memoryview | bytes], deadline: float) -> None:
    """Send every buffer, in order, before ``deadline`` (monotonic seconds).

    Plain sockets: ``sendmsg`` of up to 1024 buffers at a time (a partial send resumes where it
    stopped); each call waits at most the socket's send timeout. TLS: ``sendall`` of each.
    Raises :class:`TimeoutError` past the deadline or when the peer stops reading.
    """
    if not is_plain(sock):
        for buf in buffers:
            sock.sendall(buf)
        return
    pending = [memoryview(b).cast("B") for b in buffers if len(b)]
    first = 0  # pending[first:] is still to send; pending[first] may be partly sent already
    while first < len(pending):
        if time.monotonic() > deadline:
            raise TimeoutError("peer too slow: send deadline passed")
        try:
            sent = sock.sendmsg(pending[first : first + _IOV_MAX])
        except BlockingIOError:
            raise TimeoutError("peer stopped reading: send timed out") from None
        while sent and first < len(pending):
            head = pending[first]
            if sent >= head.nbytes:
                sent -= head.nbytes
                first += 1
            else:
                pending[first] = head[sent:]
                sent = 0


def send_pieces(sock: socket.socket, pieces: Sequence[bytes | bytearray | memoryview]) -> None:
    """Send ``pieces`` in order within the socket's (Python) timeout for the whole call (module doc)."""
    if isinstance(sock, ssl.SSLSocket):
        for piece in pieces:
            sock.sendall(piece)
        return
    views = [memoryview(p).cast("B") for p in pieces]
    timeout = sock.gettimeout()
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while views:
            sent = sock.sendmsg(views)
            while views and sent >= views[0].nbytes:
                sent -= views.pop(0).nbytes
            if sent:
                views[0] = views[0][sent:]
            if views and deadline is not None:  # a partial send: the rest within the same deadline
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("timed out")
                sock.settimeout(left)
    finally:
        if deadline is not None and sock.gettimeout() != timeout:
            sock.settimeout(timeout)
