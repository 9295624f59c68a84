"""``kvtier serve --p2p-port`` serves blocks to peers; ``kvtier check`` validates a p2p config.

Real subprocesses: the ``kvtier`` CLI serving on loopback, a real client handshaking with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kvtier.config import load_config
from kvtier.engine.build import config_namespace
from kvtier.tiers.p2p.client import PeerConnection, PeerRefusedError
from kvtier.tiers.p2p.server import is_loopback


def kvtier_cmd() -> list[str]:
    return [sys.executable, "-m", "kvtier.cli.main"]  # this tree's kvtier (PYTHONPATH), not an installed one


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kvtier_cmd(), *args], capture_output=True, text=True, timeout=120, check=False)


CONFIG = {"block_bytes": 65536, "cpu_bytes_to_use": 65536 * 8}
SECRET = "cli-test-secret"


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("KVTIER_P2P_SECRET", SECRET)
    args = ["serve", "--config", json.dumps(CONFIG), "--p2p-port", "0",
            "--p2p-secret-env", "KVTIER_P2P_SECRET", "--duration", "60"]  # fmt: skip
    proc = subprocess.Popen([*kvtier_cmd(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("p2p 127.0.0.1:"), line
        yield line.split()[1]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        assert proc.returncode == 0


def test_serve_runs_the_block_server_and_check_reaches_it(served: str) -> None:
    host, port = served.rsplit(":", 1)
    ns = config_namespace(load_config(CONFIG))
    conn = PeerConnection(host, int(port), block_bytes=65536, layout="", namespace=ns, secret=SECRET.encode())
    try:
        assert conn.lookup([b"nothing-stored-yet"], 2.0) == [False]
    finally:
        conn.close()
    with pytest.raises(PeerRefusedError, match="authentication"):
        PeerConnection(host, int(port), block_bytes=65536, layout="", namespace=ns, secret=b"wrong")

    tier = {"type": "p2p", "peers": [served], "secret_env": "KVTIER_P2P_SECRET"}
    ok = run_cli("check", json.dumps({**CONFIG, "secondary_tiers": [tier]}))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    env_bad = dict(os.environ, KVTIER_P2P_SECRET="wrong")
    bad = subprocess.run([*kvtier_cmd(), "check", json.dumps({**CONFIG, "secondary_tiers": [tier]})],
                         capture_output=True, text=True, env=env_bad, timeout=60, check=False)  # fmt: skip
    assert bad.returncode == 1 and "authentication failed" in bad.stdout + bad.stderr
    assert "wrong" not in bad.stderr


def test_serve_without_a_secret_is_a_one_line_error() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_P2P_SECRET"}
    r = subprocess.run([*kvtier_cmd(), "serve", "--p2p-port", "0", "--p2p-secret-env", "KVTIER_P2P_SECRET"],
                       capture_output=True, text=True, env=env, timeout=60, check=False)  # fmt: skip
    assert r.returncode == 2
    assert "KVTIER_P2P_SECRET is not set" in r.stderr


@pytest.mark.parametrize(
    "bad",
    [{"peers": "127.0.0.1:1"}, {"peers": ["nohost"]}, {"serve": {"prot": 1}}, {"serve": {"port": 70000}}],
)
def test_check_names_the_bad_p2p_key(bad: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVTIER_P2P_SECRET", SECRET)
    tier = {"type": "p2p", "secret_env": "KVTIER_P2P_SECRET", "peers": [], **bad}
    r = run_cli("check", json.dumps({**CONFIG, "secondary_tiers": [tier]}))
    assert r.returncode == 2
    key = next(iter(bad))
    assert key in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5")
