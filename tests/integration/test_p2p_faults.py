"""A peer that dies, stalls or sends garbage mid-transfer fails only its keys, in bounded time.

The peer is a real TCP server on loopback that speaks the handshake correctly (it knows the
secret) and then misbehaves on FETCH in one of several ways; the client is a real Engine with a
``p2p`` tier. After each fault: the keys miss, no primary slot stays reserved, the peer's breaker
is open, and a healthy second peer's keys still load.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from selfsigned import self_signed

from kvtier.engine import Engine
from kvtier.keys import BlockKey, LookupCode
from kvtier.tiers.p2p import protocol as P
from kvtier.tiers.p2p.server import BlockServer, block_checksum

BB = 256 * 1024
SECRET = "faults-test-secret"
KEYS = [BlockKey(b"bad-peer-key-%02d" % i) for i in range(4)]


class BadPeer:
    """Handshakes like a block server, answers every LOOKUP "held", then misbehaves on FETCH."""

    def __init__(self, mode: str, namespace: str) -> None:
        self.mode = mode
        self.namespace = namespace
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            hello = P.read_frame(conn)
            h = P.decode_hello(hello.payload)
            nonce = P.new_nonce()
            conn.sendall(P.encode_frame(P.FrameType.CHALLENGE, hello.request_id, nonce))
            auth = P.read_frame(conn)
            mac = P.auth_mac(SECRET.encode(), b"server", hello.payload, h.nonce, nonce)
            conn.sendall(P.encode_frame(P.FrameType.WELCOME, auth.request_id, mac))
            while True:
                frame = P.read_frame(conn)
                keys = P.decode_keys(frame.payload)
                if frame.type == P.FrameType.LOOKUP:
                    conn.sendall(
                        P.encode_frame(P.FrameType.LOOKUP_REPLY, frame.request_id, b"\1" * len(keys))
                    )
                    continue
                payload = b"\x55" * BB
                if self.mode == "stall":
                    self.stop.wait(10)
                    return
                if self.mode == "garbage":
                    conn.sendall(b"\xde\xad" * 5000)
                    return
                good = block_checksum(keys[0], payload)
                entries = [(True, good if self.mode == "dies" else good ^ 1) for _ in keys]
                conn.sendall(
                    P.encode_frame(P.FrameType.FETCH_REPLY, frame.request_id, P.encode_fetch_reply(entries))
                )
                if self.mode == "dies":  # half of the first block, then gone
                    conn.sendall(payload[: BB // 2])
                    return
                for _ in keys:  # "corrupt": every block arrives, none matches its checksum
                    conn.sendall(payload)
        except (OSError, P.ProtocolError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.listener.close()


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVTIER_P2P_SECRET", SECRET)


def engine_with(peers: list[str]) -> Engine:
    tier = {"type": "p2p", "peers": peers, "secret_env": "KVTIER_P2P_SECRET", "op_timeout": 0.5,
            "breaker_reset": 30.0, "threads": 2}  # fmt: skip
    return Engine({"block_bytes": BB, "cpu_bytes_to_use": BB * 16, "secondary_tiers": [tier]})


def settle(engine: Engine, keys: list[BlockKey], seconds: float) -> bytes:
    """Look up and poll until every key is HIT or MISS again after a promotion was tried."""
    deadline = time.monotonic() + seconds
    tried = False
    while True:
        codes = engine.lookup(keys).codes
        tried = tried or LookupCode.HIT_PENDING in codes
        done = all(c == LookupCode.HIT for c in codes) or (tried and LookupCode.HIT_PENDING not in codes)
        if done or time.monotonic() > deadline:
            return codes
        engine.poll()
        time.sleep(0.01)


@pytest.fixture
def good_peer() -> Iterator[tuple[BlockServer, list[BlockKey], np.ndarray]]:
    keys = [BlockKey(b"good-peer-key-%02d" % i) for i in range(3)]
    data = np.random.default_rng(5).integers(0, 256, size=(3, BB), dtype=np.uint8)
    with Engine({"block_bytes": BB, "cpu_bytes_to_use": BB * 8}) as holder:
        holder.store_blocks(keys, data)
        with BlockServer(holder, secret=SECRET.encode()) as server:
            yield server, keys, data


@pytest.mark.parametrize("mode", ["dies", "stall", "garbage", "corrupt"])
def test_a_bad_peer_fails_only_its_keys_within_the_deadline(mode: str, good_peer) -> None:  # type: ignore[no-untyped-def]
    server, good_keys, data = good_peer
    with Engine({"block_bytes": BB, "cpu_bytes_to_use": BB}) as probe_ns:
        namespace = probe_ns.namespace
    bad = BadPeer(mode, namespace)
    try:
        with engine_with([bad.address, server.address]) as engine:
            t0 = time.monotonic()
            codes = settle(engine, KEYS, 5.0)
            assert time.monotonic() - t0 < 3.0  # op_timeout 0.5 s + one block at 200 MB/s, plus slack
            assert all(c == LookupCode.MISS for c in codes)  # never a HIT with bytes of nothing
            primary = engine.stats()["primary"]
            assert primary["writing"] == 0 and primary["ready"] == 0  # reserved slots were freed
            tier = engine.stats()["tiers"]["p2p0"]
            assert tier["failed_jobs"] >= 1
            assert tier["breaker_open"] == 1  # the peer is marked down
            assert (tier["corrupt"] >= 1) == (mode == "corrupt")  # wrong bytes are counted, never served
            assert all(c == LookupCode.MISS for c in engine.lookup(KEYS).codes)
            # The good peer's keys still load, byte-exact.
            assert settle(engine, good_keys, 5.0) == bytes([LookupCode.HIT]) * 3
            out = np.zeros((3, BB), dtype=np.uint8)
            assert engine.load_blocks(good_keys, out) == 3 and np.array_equal(out, data)
    finally:
        bad.close()


@pytest.mark.parametrize("tls", [False, True])
def test_a_connection_the_peer_closed_while_idle_is_replaced(tls: bool, tmp_path: Path) -> None:
    """The peer ends a connection idle past its ``idle_timeout``: the next fetch goes over a new
    connection instead of failing on the dead one, and a connection in use is kept (TLS too,
    where session tickets arrive after the handshake)."""
    keys = [BlockKey(b"idle-key-%02d" % i) for i in range(3)]
    data = np.random.default_rng(6).integers(0, 256, size=(3, BB), dtype=np.uint8)
    serve: dict[str, object] = {"port": 0, "idle_timeout": 0.5}
    reader_tier = {"type": "p2p", "secret_env": "KVTIER_P2P_SECRET", "op_timeout": 1.0, "threads": 1}
    if tls:
        crt, key = (str(p) for p in self_signed(tmp_path))
        serve.update(tls_cert=crt, tls_key=key)
        reader_tier["tls_ca"] = crt
    holder_cfg = {"type": "p2p", "secret_env": "KVTIER_P2P_SECRET", "serve": serve}
    with Engine({"block_bytes": BB, "cpu_bytes_to_use": BB * 8, "secondary_tiers": [holder_cfg]}) as holder:
        holder.store_blocks(keys, data)
        service = holder.serving.block_service
        reader_tier["peers"] = [service.address]
        cfg = {"block_bytes": BB, "cpu_bytes_to_use": BB * 8, "secondary_tiers": [reader_tier]}
        with Engine(cfg) as reader:

            def fetched(i: int) -> None:
                assert settle(reader, keys[i : i + 1], 10) == bytes([LookupCode.HIT])
                out = np.zeros((1, BB), dtype=np.uint8)
                assert reader.load_blocks(keys[i : i + 1], out) == 1 and np.array_equal(out[0], data[i])

            fetched(0)
            fetched(1)  # at once: the same connection
            assert service.server.stats["connections"] == 1, service.server.stats
            time.sleep(1.0)  # the peer closes it
            fetched(2)
            assert service.server.stats["connections"] == 2, service.server.stats
            stats = reader.tiers[0].get_stats()
            assert stats["failed_jobs"] == 0 and stats["breaker_opens"] == 0, stats
