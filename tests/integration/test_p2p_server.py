"""The block server against real sockets: authentication, handshake checks, pinning, bounds, fuzz.

The server runs in this process on a real Engine; clients are real TCP connections on loopback
(the protocol's own client, or hand-written frames for what a correct client never sends).
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.engine import Engine
from kvtier.keys import BlockKey
from kvtier.tiers.p2p import protocol as P
from kvtier.tiers.p2p.client import PeerConnection, PeerRefusedError
from kvtier.tiers.p2p.server import BlockServer

BB = 64 * 1024
SECRET = b"server-test-secret"
KEYS = [BlockKey(bytes([i]) * 16) for i in range(8)]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Engine, BlockServer, np.ndarray]]:
    engine = Engine({"block_bytes": BB, "cpu_bytes_to_use": BB * 32})
    data = np.random.default_rng(7).integers(0, 256, size=(len(KEYS), BB), dtype=np.uint8)
    assert engine.store_blocks(KEYS, data) == len(KEYS)
    server = BlockServer(engine, secret=SECRET, max_connections=8, idle_timeout=2.0, io_timeout=1.0)
    try:
        yield engine, server, data
    finally:
        server.close()
        engine.close()


def connect(engine: Engine, server: BlockServer, secret: bytes = SECRET, **kw: object) -> PeerConnection:
    args: dict[str, object] = {"block_bytes": BB, "layout": "", "namespace": engine.namespace}
    args.update(kw)
    return PeerConnection("127.0.0.1", server.port, secret=secret, timeout=2.0, **args)  # type: ignore[arg-type]


def fetch_all(conn: PeerConnection) -> tuple[list[bool], np.ndarray]:
    out = np.zeros((len(KEYS), BB), dtype=np.uint8)
    ok = conn.fetch(KEYS, [out[i].data for i in range(len(KEYS))], 5.0)
    return ok, out


def assert_serving(engine: Engine, server: BlockServer, data: np.ndarray) -> None:
    conn = connect(engine, server)
    try:
        ok, out = fetch_all(conn)
        assert all(ok) and np.array_equal(out, data)
    finally:
        conn.close()


def test_an_authenticated_peer_gets_byte_exact_blocks_and_lookups(served) -> None:  # type: ignore[no-untyped-def]
    engine, server, data = served
    conn = connect(engine, server)
    try:
        assert conn.lookup([KEYS[0], b"absent", KEYS[7]], 1.0) == [True, False, True]
        out = np.zeros((2, BB), dtype=np.uint8)
        assert conn.fetch([KEYS[3], b"absent"], [out[0].data, out[1].data], 2.0) == [True, None]
        assert np.array_equal(out[0], data[3])
    finally:
        conn.close()


def test_a_wrong_secret_gets_nothing_and_is_logged_without_the_secret(served, caplog) -> None:  # type: ignore[no-untyped-def]
    engine, server, data = served
    before = server.stats["auth_failures"]
    with (
        caplog.at_level(logging.WARNING, "kvtier.tiers.p2p.server"),
        pytest.raises(PeerRefusedError, match="authentication"),
    ):
        connect(engine, server, secret=b"wrong-secret")
    assert server.stats["auth_failures"] == before + 1
    assert "failed authentication" in caplog.text
    assert "wrong-secret" not in caplog.text and SECRET.decode() not in caplog.text
    assert_serving(engine, server, data)


def test_an_unauthenticated_client_gets_no_block(served) -> None:  # type: ignore[no-untyped-def]
    engine, server, data = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=2) as s:
        s.sendall(P.encode_frame(P.FrameType.FETCH, 1, P.encode_keys(KEYS)))  # no handshake at all
        frame = P.read_frame(s)
        assert frame.type == P.FrameType.ERROR
        assert s.recv(1 << 20) == b""  # closed, no block bytes
    with socket.create_connection(("127.0.0.1", server.port), timeout=2) as s:
        hello = P.encode_hello(P.Hello(P.PROTOCOL_VERSION, BB, "", engine.namespace, P.new_nonce()))
        s.sendall(P.encode_frame(P.FrameType.HELLO, 1, hello))
        assert P.read_frame(s).type == P.FrameType.CHALLENGE
        s.sendall(P.encode_frame(P.FrameType.AUTH, 2, b"\0" * 32))  # a guessed MAC
        assert P.read_frame(s).type == P.FrameType.ERROR
        assert s.recv(1 << 20) == b""
    assert_serving(engine, server, data)


def test_a_server_without_the_secret_is_detected_by_the_client(served) -> None:  # type: ignore[no-untyped-def]
    engine, _, _ = served
    impostor = BlockServer(engine, secret=b"impostor")
    try:
        with pytest.raises(PeerRefusedError):
            PeerConnection("127.0.0.1", impostor.port, block_bytes=BB, layout="", namespace=engine.namespace,
                           secret=SECRET, timeout=2.0)  # fmt: skip
    finally:
        impostor.close()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("block_bytes", BB * 2, "block_bytes"),
        ("layout", "other", "layout"),
        ("namespace", "ns2", "namespace"),
    ],
)
def test_handshake_mismatch_is_refused_clearly(served, field: str, value: object, message: str) -> None:  # type: ignore[no-untyped-def]
    engine, server, _ = served
    with pytest.raises(PeerRefusedError, match=f"handshake refused: {message}"):
        connect(engine, server, **{field: value})


def test_blocks_stay_pinned_while_sent() -> None:
    bb, n = 4 << 20, 8  # 32 MiB: more than the loopback socket buffers hold, so the send blocks
    keys = [BlockKey(bytes([i]) * 16) for i in range(n)]
    data = np.random.default_rng(3).integers(0, 256, size=(n, bb), dtype=np.uint8)
    with Engine({"block_bytes": bb, "cpu_bytes_to_use": bb * (n + 2)}) as engine:
        engine.store_blocks(keys, data)
        with BlockServer(engine, secret=SECRET) as server:
            conn = PeerConnection(
                "127.0.0.1", server.port, block_bytes=bb, layout="", namespace=engine.namespace,
                secret=SECRET, timeout=2.0,
            )  # fmt: skip
            try:
                conn.sock.sendall(P.encode_frame(P.FrameType.FETCH, 99, P.encode_keys(keys)))
                time.sleep(0.3)  # the server is mid-send, blocked on the full socket
                engine.reset()  # drops every unpinned block
                assert all(engine.serving.resident(keys))  # the blocks being sent survived, untouched
                assert P.read_frame(conn.sock).type == P.FrameType.FETCH_REPLY
                got = bytearray(n * bb)
                P.recv_exact_into(conn.sock, memoryview(got))
                assert bytes(got) == data.tobytes()
                deadline = time.monotonic() + 2
                while engine.stats()["loads"] < n and time.monotonic() < deadline:
                    time.sleep(0.01)  # the server unpins after its last sendall
                engine.reset()
                assert not any(engine.serving.resident(keys))  # unpinned once sent: evictable again
            finally:
                conn.close()


def test_authenticated_connections_are_bounded(served) -> None:  # type: ignore[no-untyped-def]
    engine, server, data = served
    held = [connect(engine, server) for _ in range(server.max_connections)]
    try:
        with pytest.raises(PeerRefusedError, match="busy"):
            connect(engine, server)
    finally:
        for c in held:
            c.close()
    time.sleep(0.3)
    assert_serving(engine, server, data)


def _random_frame(rng: random.Random) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 200))
    ftype = rng.randrange(0, 12)
    payload = rng.randbytes(rng.randrange(0, 300))
    if kind == 1:
        return (
            P.HEADER.pack(
                P.MAGIC, P.PROTOCOL_VERSION, ftype, rng.randrange(4), rng.getrandbits(32), len(payload)
            )
            + payload
        )
    if kind == 2:  # a length that lies
        return P.HEADER.pack(P.MAGIC, P.PROTOCOL_VERSION, ftype, 0, 1, rng.getrandbits(32)) + payload
    keys = [rng.randbytes(rng.randrange(1, 40)) for _ in range(rng.randrange(0, 20))]
    return P.encode_frame(
        rng.choice([P.FrameType.LOOKUP, P.FrameType.FETCH]), 1, P.encode_keys(keys), rng.randrange(2)
    )


def _blast(port: int, stream: bytes, authenticate: PeerConnection | None) -> None:
    s = (
        authenticate.sock
        if authenticate is not None
        else socket.create_connection(("127.0.0.1", port), timeout=2)
    )
    try:
        s.settimeout(1.0)
        s.sendall(stream)
        s.shutdown(socket.SHUT_WR)
        while s.recv(1 << 20):  # the server answers, then closes (or closes at once): never hangs
            pass
    except OSError:
        pass
    finally:
        s.close()


def test_seeded_fuzz_of_random_frame_streams_never_crashes_or_wedges_the_server(served) -> None:  # type: ignore[no-untyped-def]
    engine, server, data = served
    rng = random.Random(1234)
    errors = server.stats["protocol_errors"]
    for i in range(150):
        stream = b"".join(_random_frame(rng) for _ in range(rng.randrange(1, 5)))
        _blast(server.port, stream, connect(engine, server) if i % 2 else None)
    time.sleep(0.3)
    assert_serving(engine, server, data)
    assert server.stats["protocol_errors"] > errors + 20  # the fuzz did reach the parser
    deadline = time.monotonic() + 10  # a loaded machine ends the last connection threads later
    while threading.active_count() >= 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() < 20  # connection threads ended


@settings(max_examples=60)
@given(st.binary(min_size=1, max_size=2000))
def test_any_bytes_after_the_handshake_never_crash_the_server(served, stream: bytes) -> None:  # type: ignore[no-untyped-def]
    engine, server, _ = served
    _blast(server.port, stream, connect(engine, server))
    conn = connect(engine, server)
    try:
        assert conn.lookup([KEYS[0]], 2.0) == [True]
    finally:
        conn.close()


def test_closing_the_engine_mid_send_ends_the_connection_first(monkeypatch: pytest.MonkeyPatch) -> None:
    bb, n = 4 << 20, 8
    keys = [BlockKey(bytes([i]) * 16) for i in range(n)]
    monkeypatch.setenv("KVTIER_P2P_SECRET", SECRET.decode())
    tier = {"type": "p2p", "secret_env": "KVTIER_P2P_SECRET", "serve": {"port": 0}}
    cfg = {
        "block_bytes": bb,
        "cpu_bytes_to_use": bb * (n + 2),
        "primary_backing": "shm",
        "secondary_tiers": [tier],
    }
    engine = Engine(cfg)
    engine.store_blocks(keys, np.ones((n, bb), dtype=np.uint8))
    server = engine.serving.block_service.server
    conn = PeerConnection("127.0.0.1", server.port, block_bytes=bb, layout="", namespace=engine.namespace,
                          secret=SECRET, timeout=2.0)  # fmt: skip
    try:
        conn.sock.sendall(P.encode_frame(P.FrameType.FETCH, 1, P.encode_keys(keys)))
        time.sleep(0.3)  # the server is blocked mid-send on the full socket, reading the shm buffer
        t0 = time.monotonic()
        engine.close()  # stops the server and waits for its threads before unmapping the buffer
        assert time.monotonic() - t0 < server.io_timeout + 2
        assert not server._threads  # every connection thread ended before the buffer went away
    finally:
        conn.close()
