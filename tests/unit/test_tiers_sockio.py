"""kvtier.tiers.remote.sockio on real loopback sockets: scatter-gather sends (kernel or Python
timeouts) arrive whole and in order (partial sends resumed), timeouts fail a stalled peer in bounded
time, and an idle connection the peer closed or wrote to is not reused."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.tiers.remote.sockio import (
    recv_flags,
    reusable,
    send_buffers,
    send_pieces,
    set_recv_timeout,
    use_kernel_timeouts,
)


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as lst:
        a = socket.create_connection(lst.getsockname())
        b, _ = lst.accept()
    return a, b


def _read_all(sock: socket.socket, n: int, out: bytearray) -> None:
    view = memoryview(out)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got, recv_flags(sock))
        if k == 0:
            return
        got += k


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=300_000), min_size=1, max_size=1100), st.integers(0, 255))
def test_every_byte_arrives_in_order(sizes: list[int], seed: int) -> None:
    # More buffers than one sendmsg takes (1024) and sizes past the socket buffer: partial sends.
    bufs = [bytes([(seed + i) % 256]) * n for i, n in enumerate(sizes)]
    want = b"".join(bufs)
    a, b = _pair()
    with a, b:
        use_kernel_timeouts(a, 5.0)
        use_kernel_timeouts(b, 5.0)
        got = bytearray(len(want))
        reader = threading.Thread(target=_read_all, args=(b, len(want), got))
        reader.start()
        send_buffers(a, [memoryview(x) for x in bufs], time.monotonic() + 30)
        reader.join(30)
    assert bytes(got) == want


def test_a_peer_that_stops_reading_times_the_send_out() -> None:
    a, b = _pair()
    with a, b:
        use_kernel_timeouts(a, 0.3)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            send_buffers(a, [memoryview(bytes(64 << 20))], time.monotonic() + 10)
        assert time.monotonic() - t0 < 5


def test_a_send_past_its_deadline_fails() -> None:
    a, b = _pair()
    with a, b:
        use_kernel_timeouts(a, 5.0)
        with pytest.raises(TimeoutError, match="deadline"):
            send_buffers(a, [b"x"], time.monotonic() - 1)


def test_a_silent_peer_times_the_read_out() -> None:
    a, b = _pair()
    with a, b:
        use_kernel_timeouts(b, 5.0)
        set_recv_timeout(b, 0.2)
        t0 = time.monotonic()
        with pytest.raises(BlockingIOError):  # the caller (PeerConnection) turns it into TimeoutError
            b.recv_into(bytearray(10), 10, recv_flags(b))
        assert 0.15 < time.monotonic() - t0 < 3


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=400_000), min_size=1, max_size=40), st.integers(0, 255))
def test_send_pieces_delivers_every_byte_in_order(sizes: list[int], seed: int) -> None:
    # Python timeouts (the redis and obj tiers): partial sendmsg calls resume mid-piece.
    pieces = [bytes([(seed + i) % 256]) * n for i, n in enumerate(sizes)]
    want = b"".join(pieces)
    a, b = _pair()
    with a, b:
        a.settimeout(5.0)
        got = bytearray(len(want))
        reader = threading.Thread(target=_read_all, args=(b, len(want), got))
        reader.start()
        send_pieces(a, [memoryview(x) for x in pieces])
        reader.join(30)
        assert a.gettimeout() == 5.0
    assert bytes(got) == want


def test_send_pieces_bounds_the_whole_call_by_the_socket_timeout() -> None:
    a, b = _pair()
    with a, b:
        a.settimeout(0.3)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            send_pieces(a, [b"head", memoryview(bytes(64 << 20))])
        assert time.monotonic() - t0 < 5
        assert a.gettimeout() == 0.3  # restored after the shortened partial-send waits


def test_an_idle_connection_is_reusable_until_the_peer_closes_or_writes() -> None:
    a, b = _pair()
    with a, b:
        assert reusable(a)
        b.sendall(b"x")  # nothing may arrive between requests: out of step
        time.sleep(0.05)
        assert not reusable(a)
    c, d = _pair()
    with c:
        d.close()  # the peer's idle timeout or a restart
        time.sleep(0.05)
        assert not reusable(c)
    c.close()
    assert not reusable(c)  # closed here already
