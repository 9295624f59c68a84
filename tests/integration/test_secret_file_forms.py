"""The README's secret-file forms work (issue 28): ``KVTIER_SECONDARY_TIERS__0__PASSWORD_FILE``
gives a redis tier its password (a real redis-server with ``requirepass``), and
``KVTIER_SECONDARY_TIERS__0__SECRET_FILE`` gives a p2p tier its shared secret (a real block
server a peer authenticates against). Neither secret is ever printed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from remote_servers import redis_server

from kvtier.cli.main import main
from kvtier.config.layers import resolve_config
from kvtier.engine import Engine
from kvtier.keys import BlockKey
from kvtier.tiers.p2p.client import PeerConnection

BASE = json.dumps({"cpu_bytes_to_use": 16 * 4096, "block_bytes": 4096})


def secret_file(tmp_path: Path, name: str, value: str) -> Path:
    path = tmp_path / name
    path.write_text(value + "\n")
    os.chmod(path, 0o600)
    return path


def test_password_file_gives_a_redis_tier_its_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    password = "file-pw-8c1d"
    with redis_server(tmp_path / "redis") as server:
        server.cli("CONFIG", "SET", "requirepass", password)
        monkeypatch.setenv("KVTIER_SECONDARY_TIERS__0__TYPE", "redis")
        monkeypatch.setenv("KVTIER_SECONDARY_TIERS__0__URL", server.url)
        monkeypatch.setenv(
            "KVTIER_SECONDARY_TIERS__0__PASSWORD_FILE", str(secret_file(tmp_path, "pw", password))
        )
        code = main(["check", BASE])
        out = capsys.readouterr()
        assert code == 0, out.err
        assert "ok" in out.out and password not in out.out + out.err
        # And without it the same server refuses: the password really came from the file.
        monkeypatch.delenv("KVTIER_SECONDARY_TIERS__0__PASSWORD_FILE")
        assert main(["check", BASE]) != 0
        capsys.readouterr()


def test_secret_file_gives_a_p2p_tier_its_shared_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "p2p-file-secret-77"
    env = {
        "KVTIER_SECONDARY_TIERS__0__TYPE": "p2p",
        "KVTIER_SECONDARY_TIERS__0__SECRET_FILE": str(secret_file(tmp_path, "s", secret)),
        "KVTIER_SECONDARY_TIERS__0__SERVE": '{"port": 0}',
    }
    config = resolve_config(BASE, env=env).config
    key = BlockKey(b"secret-file-key!")
    with Engine(config) as engine:
        engine.store_blocks([key], np.full((1, 4096), 7, dtype=np.uint8))
        port = int(engine.serving.block_service.address.rpartition(":")[2])
        conn = PeerConnection(
            "127.0.0.1", port, block_bytes=4096, layout="", namespace=engine.namespace,
            secret=secret.encode(), timeout=2.0,
        )  # fmt: skip
        try:
            assert conn.lookup([key], 2.0) == [True]
        finally:
            conn.close()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["check", "--show-config", BASE]) == 0
    out = capsys.readouterr()
    assert secret not in out.out + out.err
