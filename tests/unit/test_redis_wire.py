"""BulkReader, the redis tier's RESP2 reader of GET replies, and send_vectored, its gather-writer,
over real socket pairs.

Property (send_vectored): any pieces (empty, small, larger than the socket's buffers, bytes or
memoryviews) arrive whole and in order, however slowly the other end reads; a peer that stops
reading is a ``TimeoutError`` within the socket's timeout for the whole call, a closed peer a
``ConnectionError``.

Property (BulkReader): any sequence of replies (values of any length, nils, error lines), cut into arbitrary
pieces by the sender, is read in order and in step: each value reaches ``receive`` byte-exact (or
is skipped whole when ``receive`` refuses it), nils are ``None``, errors are redis-py's exceptions;
a connection that ends mid-reply raises ``ConnectionError``, a socket timeout ``TimeoutError``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from needs import need_module

rx = need_module("redis.exceptions", "redis")

from redis._parsers.base import BaseParser  # noqa: E402

from kvtier.tiers.redis.wire import BulkReader, send_vectored  # noqa: E402

Reply = bytes | None | str | int  # a value, a nil, an error message, a RESP3 marker

replies_st = st.lists(
    st.one_of(
        st.binary(max_size=300),
        st.binary(min_size=65_600, max_size=65_700),  # longer than the reader's buffer
        st.none(),
        st.sampled_from(["ERR wrong number", "OOM command not allowed", "WRONGTYPE bad"]),
        st.sampled_from([0, 1]),  # RESP3: 0 = null ("_"), 1 = a blob error ("!")
    ),
    max_size=12,
)


def _wire(replies: list[Reply]) -> bytes:
    out = []
    for r in replies:
        if isinstance(r, int):
            out.append(b"_\r\n" if r == 0 else b"!14\r\nERR blob error\r\n")
        elif r is None:
            out.append(b"$-1\r\n")
        elif isinstance(r, str):
            out.append(b"-" + r.encode() + b"\r\n")
        else:
            out.append(b"$%d\r\n%s\r\n" % (len(r), r))
    return b"".join(out)


def _serve(data: bytes, cuts: list[int], close: bool = True) -> socket.socket:
    """The reading end of a socket pair whose other end sends ``data`` in pieces of ``cuts``."""
    a, b = socket.socketpair()
    a.settimeout(10)

    def send() -> None:
        pos, i = 0, 0
        while pos < len(data):
            n = max(1, cuts[i % len(cuts)]) if cuts else len(data)
            b.sendall(data[pos : pos + n])
            pos, i = pos + n, i + 1
        if close:
            b.close()

    threading.Thread(target=send, daemon=True).start()
    return a


def _collector(refuse: Callable[[int], bool]) -> tuple[list[bytes], Callable[..., bool]]:
    got: list[bytes] = []

    def receive(size: int, read_into: Callable[[memoryview], int]) -> bool:
        if refuse(size):
            return False  # reads nothing: the reader must skip the value itself
        buf = bytearray(size)
        view, pos = memoryview(buf), 0
        while pos < size:
            n = read_into(view[pos:])
            assert n > 0
            pos += n
        assert read_into(memoryview(bytearray(1))) == 0  # never past the value
        got.append(bytes(buf))
        return True

    return got, receive


# Pieces of 1..20000 bytes, cycled (at least 64 bytes per cycle, so a large value is not sent a
# byte at a time): lines and values are split anywhere, CRLFs included.
cuts_st = st.lists(st.integers(1, 20_000), min_size=1, max_size=6).filter(lambda c: sum(c) >= 64)


@settings(max_examples=30, deadline=None)
@given(replies_st, cuts_st, st.integers(0, 400))
def test_replies_are_read_in_order_and_in_step(replies: list[Reply], cuts: list[int], limit: int) -> None:
    sock = _serve(_wire(replies) + b"$2\r\nok\r\n", cuts)
    try:
        got, receive = _collector(lambda size: size > limit)
        reader = BulkReader(sock, BaseParser.parse_error)
        for r in replies:
            out = reader.value(receive)
            if r is None or r == 0:
                assert out is None
            elif r == 1:
                assert isinstance(out, rx.ResponseError) and "blob error" in str(out)
            elif isinstance(r, str):
                assert isinstance(out, rx.ResponseError) and r.split(" ", 1)[1] in str(out)
            else:
                assert out is (len(r) <= limit)
        assert got == [r for r in replies if isinstance(r, bytes) and len(r) <= limit]
        tail, receive = _collector(lambda size: False)
        assert reader.value(receive) is True and tail == [b"ok"]  # still in step at the end
    finally:
        sock.close()


@given(st.binary(min_size=1, max_size=200), st.integers(0, 10))
def test_a_reply_cut_off_raises_connection_error(value: bytes, cut: int) -> None:
    data = _wire([value])
    sock = _serve(data[: max(0, len(data) - 1 - cut)], [7])
    try:
        _, receive = _collector(lambda size: False)
        with pytest.raises(rx.ConnectionError):
            BulkReader(sock, BaseParser.parse_error).value(receive)
    finally:
        sock.close()


def test_a_silent_server_is_a_timeout_and_garbage_is_invalid() -> None:
    a, b = socket.socketpair()
    try:
        a.settimeout(0.2)
        _, receive = _collector(lambda size: False)
        with pytest.raises(rx.TimeoutError):
            BulkReader(a, BaseParser.parse_error).value(receive)
        b.sendall(b"+OK\r\n")
        with pytest.raises(rx.InvalidResponse):
            BulkReader(a, BaseParser.parse_error).value(receive)
        b.sendall(b"$2\r\nokXX")
        with pytest.raises(rx.InvalidResponse, match="CRLF"):
            BulkReader(a, BaseParser.parse_error).value(receive)
    finally:
        a.close()
        b.close()


def _large(size_and_seed: tuple[int, int]) -> bytes:
    """A piece larger than the socket buffers; its bytes depend on its seed (pieces differ)."""
    size, seed = size_and_seed
    return bytes((i * 131 + seed) % 251 for i in range(251)) * (size // 251)


pieces_st = st.lists(
    st.one_of(
        st.binary(max_size=200),
        st.tuples(st.integers(300_000, 300_500), st.integers(0, 250)).map(_large),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=25, deadline=None)
@given(pieces_st, st.booleans(), st.sampled_from([1000, 65_536]))
def test_vectored_pieces_arrive_whole_and_in_order(pieces: list[bytes], views: bool, read: int) -> None:
    a, b = socket.socketpair()
    a.settimeout(10)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16_384)  # partial sends on large pieces
    want = b"".join(pieces)
    got = bytearray()

    def drain() -> None:
        try:
            while len(got) < len(want):
                chunk = b.recv(read)
                if not chunk:
                    return
                got.extend(chunk)
        except OSError:  # the test failed and closed the socket: the assertion below reports it
            return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        send_vectored(a, [memoryview(p) if views else p for p in pieces])
        reader.join(10)
        assert bytes(got) == want
        assert a.gettimeout() == 10  # the socket's own timeout is left as it was
    finally:
        a.close()
        b.close()


def test_vectored_send_to_a_stalled_or_trickling_peer_times_out_within_the_deadline() -> None:
    a, b = socket.socketpair()
    a.settimeout(0.3)
    stop = threading.Event()

    def trickle() -> None:  # every system call makes progress, the whole send never ends in time
        while not stop.wait(0.02):
            b.recv(16_384)

    reader = threading.Thread(target=trickle, daemon=True)

    try:
        with pytest.raises(rx.TimeoutError):
            send_vectored(a, [b"x" * 100, memoryview(bytes(64 << 20))])  # b reads nothing
        reader.start()
        t0 = time.monotonic()
        with pytest.raises(rx.TimeoutError):
            send_vectored(a, [b"y" * 100, memoryview(bytes(16 << 20))])
        assert time.monotonic() - t0 < 1.5  # one deadline for the call, not one per system call
        assert a.gettimeout() == 0.3
    finally:
        stop.set()
        if reader.is_alive():
            reader.join(5)  # before b closes under it
        a.close()
        b.close()


def test_vectored_send_to_a_closed_peer_is_a_connection_error() -> None:
    c, d = socket.socketpair()
    d.close()
    try:
        with pytest.raises(rx.ConnectionError):
            send_vectored(c, [b"abc", bytes(1 << 20)])
    finally:
        c.close()
