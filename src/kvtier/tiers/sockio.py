"""Gather-writes on a socket: several pieces (a small header, then a slot's memory) sent back to
back with as few system calls as the socket allows and no joining copy.

Contract: :func:`send_pieces` sends every byte of ``pieces`` in order or raises the builtin
``TimeoutError`` (the socket's timeout passed; like ``sendall`` it bounds the whole call, not each
system call) or ``OSError`` (the peer or the network failed). A plain socket gets ``sendmsg``
with every piece at once; a TLS socket, which has no ``sendmsg``, gets one ``sendall`` per piece.
The network tiers that stream slots (redis, obj) share it and wrap its errors in their own.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Sequence

__all__ = ["send_pieces"]


def send_pieces(sock: socket.socket, pieces: Sequence[bytes | bytearray | memoryview]) -> None:
    """Send ``pieces`` in order within the socket's timeout (see the module doc)."""
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
