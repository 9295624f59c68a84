"""The block server against strangers who never finish a handshake (real sockets on loopback).

Issue 28: unauthenticated connections used to take an authenticated slot and keep it as long as
they sent a byte per ``io_timeout``; 64 of them locked out every peer that had the secret.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from kvtier.engine import Engine
from kvtier.errors import ConfigError
from kvtier.keys import BlockKey
from kvtier.tiers.p2p import protocol as P
from kvtier.tiers.p2p.client import PeerConnection, PeerRefusedError
from kvtier.tiers.p2p.server import BlockServer
from kvtier.tiers.p2p.service import check_serve_options

BB = 4096
SECRET = b"handshake-bounds-secret"
KEYS = [BlockKey(bytes([i]) * 16) for i in range(4)]


@pytest.fixture
def served() -> Iterator[tuple[Engine, BlockServer, np.ndarray]]:
    engine = Engine({"block_bytes": BB, "cpu_bytes_to_use": BB * 16})
    data = np.random.default_rng(28).integers(0, 256, size=(len(KEYS), BB), dtype=np.uint8)
    assert engine.store_blocks(KEYS, data) == len(KEYS)
    # The defaults' max_connections (64); io_timeout 1 s is the whole handshake's deadline.
    server = BlockServer(engine, secret=SECRET, io_timeout=1.0, idle_timeout=5.0)
    try:
        yield engine, server, data
    finally:
        server.close()
        engine.close()


def peer(engine: Engine, server: BlockServer, **kw: object) -> PeerConnection:
    args: dict[str, object] = {
        "block_bytes": BB,
        "layout": "",
        "namespace": engine.namespace,
        "secret": SECRET,
    }
    args.update(kw)
    return PeerConnection("127.0.0.1", server.port, timeout=2.0, **args)  # type: ignore[arg-type]


class Slowloris:
    """``n`` connections that each send one byte of a HELLO every ``every`` seconds."""

    def __init__(self, port: int, n: int, every: float) -> None:
        self.socks = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(n)]
        self.every = every
        self.stop = threading.Event()
        self.head = P.encode_frame(P.FrameType.HELLO, 1, b"x" * 1000)  # a frame that takes long to trickle
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stop.wait(self.every):
            for s in self.socks:
                with contextlib.suppress(OSError):  # the server dropped it: as intended
                    s.send(self.head[i : i + 1])
            i += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for s in self.socks:
            s.close()


def test_64_slowloris_connections_do_not_lock_out_a_peer_with_the_secret(served) -> None:  # type: ignore[no-untyped-def]
    engine, server, data = served
    attack = Slowloris(server.port, 64, every=0.2)  # well inside io_timeout per byte
    try:
        time.sleep(0.5)  # the attack is established and trickling
        for _ in range(3):  # during the attack, and after its connections' deadline passed
            conn = peer(engine, server)
            try:
                out = np.zeros((len(KEYS), BB), dtype=np.uint8)
                assert conn.fetch(KEYS, [out[i].data for i in range(len(KEYS))], 2.0) == [True] * len(KEYS)
                assert np.array_equal(out, data)
            finally:
                conn.close()
            assert len(server._pending) <= server.max_pending  # strangers stay within their pool
            time.sleep(0.6)
        time.sleep(server.io_timeout + 0.5)
        assert not server._pending  # every stranger was dropped, however often it sent a byte
        assert server.stats["pending_dropped"] + server.stats["handshake_timeouts"] >= 64
    finally:
        attack.close()


def test_a_handshake_has_one_deadline_however_often_bytes_arrive(served) -> None:  # type: ignore[no-untyped-def]
    _, server, _ = served
    attack = Slowloris(server.port, 1, every=0.1)
    try:
        s = attack.socks[0]
        s.settimeout(server.io_timeout + 3)
        t0 = time.monotonic()
        try:
            got = s.recv(1 << 16)  # the server ends it: EOF (or an ERROR frame first) or a reset
        except ConnectionResetError:
            got = b""
        elapsed = time.monotonic() - t0
        assert elapsed < server.io_timeout + 1.0, f"the handshake lasted {elapsed:.1f} s"
        assert got == b"" or got[:4] == P.MAGIC
    finally:
        attack.close()
    assert server.stats["handshake_timeouts"] >= 1


def test_nothing_about_the_server_is_said_before_authentication(served) -> None:  # type: ignore[no-untyped-def]
    engine, server, _ = served
    server.layout = "model-layout-xyz"  # what a stranger must not learn
    sent = []
    for hello in (
        P.Hello(P.PROTOCOL_VERSION, BB * 2, "other", "ns-other", P.new_nonce()),  # every field off
        P.Hello(P.PROTOCOL_VERSION, BB, "model-layout-xyz", engine.namespace, P.new_nonce()),
    ):
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as s:
            s.sendall(P.encode_frame(P.FrameType.HELLO, 1, P.encode_hello(hello)))
            first = P.read_frame(s)
            assert first.type == P.FrameType.CHALLENGE  # the same answer whatever the hello said
            s.sendall(P.encode_frame(P.FrameType.AUTH, 2, b"\0" * 32))  # a guessed MAC
            reply = P.read_frame(s)
            assert reply.type == P.FrameType.ERROR
            sent.append(first.payload + reply.payload)
    for blob in sent:
        for secret_fact in (engine.namespace, "model-layout-xyz", str(BB)):
            assert secret_fact.encode() not in blob
    with pytest.raises(PeerRefusedError, match="authentication") as err:
        peer(engine, server, secret=b"wrong", namespace="ns-other")
    assert engine.namespace not in str(err.value)
    # A peer with the secret still learns exactly what is wrong.
    with pytest.raises(PeerRefusedError, match="handshake refused: namespace"):
        peer(engine, server, namespace="ns-other", layout="model-layout-xyz")


@pytest.mark.parametrize("value", [0, -1, 10**9, 2.5, float("nan"), True, "64"])
@pytest.mark.parametrize("key", ["max_connections", "max_pending"])
def test_connection_limits_are_range_checked(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"serve.{key}"):
        check_serve_options({key: value})
    with (
        Engine({"block_bytes": BB, "cpu_bytes_to_use": BB * 4}) as engine,
        pytest.raises(ConfigError, match=f"serve.{key}"),
    ):
        BlockServer(engine, secret=SECRET, **{key: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["idle_timeout", "io_timeout", "directory_ttl"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e300, -1, 0])
def test_serve_seconds_are_finite_and_in_range(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"serve.{key}"):
        check_serve_options({key: value})
