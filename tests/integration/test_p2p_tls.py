"""TLS between peers: the block server with a certificate, the p2p tier verifying it with a CA file.

The certificate is a real self-signed one made by the ``openssl`` CLI for this test.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from selfsigned import self_signed

from kvtier.engine import Engine
from kvtier.keys import BlockKey, LookupCode
from kvtier.tiers.p2p.client import PeerConnection

BB = 64 * 1024
SECRET = "tls-test-secret"


@pytest.fixture
def cert(tmp_path: Path) -> tuple[str, str]:
    crt, key = self_signed(tmp_path)
    return str(crt), str(key)


def test_blocks_travel_over_tls_and_a_plain_client_gets_nothing(
    cert: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVTIER_P2P_SECRET", SECRET)
    crt, key = cert
    keys = [BlockKey(b"tls-key-%02d" % i) for i in range(3)]
    data = np.random.default_rng(9).integers(0, 256, size=(3, BB), dtype=np.uint8)
    serve = {"port": 0, "tls_cert": crt, "tls_key": key}
    holder_cfg = {"type": "p2p", "secret_env": "KVTIER_P2P_SECRET", "serve": serve}
    with Engine({"block_bytes": BB, "cpu_bytes_to_use": BB * 8, "secondary_tiers": [holder_cfg]}) as holder:
        holder.store_blocks(keys, data)
        address = holder.serving.block_service.address
        with pytest.raises((OSError, ConnectionError)):  # no TLS against a TLS server: nothing served
            PeerConnection("127.0.0.1", int(address.rsplit(":", 1)[1]), block_bytes=BB, layout="",
                           namespace=holder.namespace, secret=SECRET.encode(), timeout=1.0)  # fmt: skip
        reader_cfg = {"type": "p2p", "secret_env": "KVTIER_P2P_SECRET", "peers": [address], "tls_ca": crt}
        with Engine(
            {"block_bytes": BB, "cpu_bytes_to_use": BB * 8, "secondary_tiers": [reader_cfg]}
        ) as reader:
            deadline = time.monotonic() + 10
            while not all(c == LookupCode.HIT for c in reader.lookup(keys).codes):
                assert time.monotonic() < deadline, reader.stats()["tiers"]
                reader.poll()
                time.sleep(0.01)
            out = np.zeros((3, BB), dtype=np.uint8)
            assert reader.load_blocks(keys, out) == 3 and np.array_equal(out, data)
