"""Directory entries are trusted only inside ``peer_networks`` (issue 28), against a real
redis-server and a real serving engine on loopback.

Whoever can write the directory must not steer an engine's connections: a planted entry naming
an address outside the allow-list is never connected to. The test records every connect the p2p
client attempts and lets through only those to 127.0.0.1, so no packet leaves for anywhere else;
the allow-list is narrowed to ``127.0.0.1/32`` and the planted entry names ``127.0.0.2``, a
loopback address outside it (no non-loopback address appears anywhere).
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from polling import wait_for
from remote_servers import redis_server

from kvtier.engine import Engine
from kvtier.errors import ConfigError
from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing import PrimaryBuffer, wait_for_jobs
from kvtier.tiers.p2p import P2PTier
from kvtier.tiers.p2p.directory import PeerDirectory

BB = 4096
SECRET = "peer-networks-secret"


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every (host, port) the p2p client tries; only 127.0.0.1 is really connected."""
    seen: list[tuple[str, int]] = []
    real = socket.create_connection

    def recording(address: Any, *args: Any, **kw: Any) -> socket.socket:
        host, port = address[0], int(address[1])
        seen.append((host, port))
        if host != "127.0.0.1":
            raise ConnectionRefusedError(f"test: refused to connect to {host}")
        return real(address, *args, **kw)

    import kvtier.tiers.p2p.client as client

    monkeypatch.setattr(client.socket, "create_connection", recording)
    return seen


def test_a_planted_entry_outside_peer_networks_is_never_connected_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connects: list[tuple[str, int]], caplog: Any
) -> None:
    monkeypatch.setenv("KVTIER_P2P_SECRET", SECRET)
    rng = np.random.default_rng(28)
    with redis_server(tmp_path / "redis") as server:
        holder_cfg = {"type": "p2p", "secret_env": "KVTIER_P2P_SECRET", "serve": {"port": 0}}
        with Engine(
            {"block_bytes": BB, "cpu_bytes_to_use": BB * 8, "secondary_tiers": [holder_cfg]}
        ) as holder:
            port = int(holder.serving.block_service.address.rpartition(":")[2])
            good, planted, huge, named = (BlockKey(b"pn-%d" % i) for i in range(4))
            data = rng.integers(0, 256, size=(1, BB), dtype=np.uint8)
            holder.store_blocks([good], data)
            directory = PeerDirectory(server.url, holder.namespace)
            directory.publish(f"127.0.0.1:{port}", [good])  # inside the allow-list: the real holder
            directory.publish(f"127.0.0.2:{port}", [planted])  # loopback, but outside 127.0.0.1/32
            directory.publish(f"localhost:{port}", [named])  # a host name: never resolved for it
            raw = redis.Redis.from_url(server.url)
            bomb = b"127.0.0.1:" + b"9" * (5 << 20)
            raw.set(b"kvtier:p2p:" + holder.namespace.encode() + b":" + bytes(huge).hex().encode(), bomb)

            primary = PrimaryBuffer.heap(8, BB, BB)
            tier = P2PTier(
                primary_kv_view=primary.view, context=primary.context("p2p", holder.namespace),
                directory=server.url, secret_env="KVTIER_P2P_SECRET", peer_networks=["127.0.0.1/32"],
                negative_ttl=0.2,
            )  # fmt: skip
            try:
                with caplog.at_level(logging.WARNING):
                    for key in (good, planted, huge, named):
                        tier.lookup(key)
                    assert wait_for(lambda: tier.lookup(good) is LookupResult.HIT)
                    time.sleep(0.5)  # the checks of the other keys have run too
                    for key in (planted, huge, named):
                        assert tier.lookup(key) is not LookupResult.HIT
                job = TransferJob(1, [good], np.asarray([0], dtype=np.int32), is_promotion=True)
                tier.submit_load(job)
                assert wait_for_jobs(tier, [1], timeout=10)[1].success
                assert primary.block(0).tobytes() == data[0].tobytes()
            finally:
                tier.shutdown()
                directory.close()
                raw.close()
    hosts = {h for h, _ in connects}
    assert ("127.0.0.1", port) in connects  # the trusted holder was used (the recorder works)
    assert hosts == {"127.0.0.1"}, connects  # never 127.0.0.2, never a name
    assert tier.get_stats()["untrusted_entries"] >= 2
    assert "127.0.0.2" in caplog.text and "peer_networks" in caplog.text
    assert "9" * 1000 not in caplog.text  # the 5 MB value was neither read whole nor logged
    assert max(len(r.getMessage()) for r in caplog.records) < 1000


def test_directory_values_are_read_bounded(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        directory = PeerDirectory(server.url, "ns")
        raw = redis.Redis.from_url(server.url)
        try:
            raw.set(b"kvtier:p2p:ns:" + b"k1".hex().encode(), b"x" * (5 << 20))
            raw.set(b"kvtier:p2p:ns:" + b"k2".hex().encode(), b"\xff\xfe:1")
            directory.publish("127.0.0.1:7", [b"k3"])
            assert directory.holders([b"k1", b"k2", b"k3", b"k4"]) == [None, None, "127.0.0.1:7", None]
        finally:
            directory.close()
            raw.close()


@pytest.mark.parametrize("value", ["127.0.0.0/8", ["not-a-network"], [7], {"a": 1}])
def test_peer_networks_is_checked(value: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVTIER_P2P_SECRET", SECRET)
    primary = PrimaryBuffer.heap(2, BB, BB)
    with pytest.raises(ConfigError, match="peer_networks"):
        P2PTier(
            primary_kv_view=primary.view, context=primary.context("p2p"), peers=["127.0.0.1:9"],
            secret_env="KVTIER_P2P_SECRET", peer_networks=value,  # type: ignore[arg-type]
        )  # fmt: skip
