"""A real self-signed TLS certificate for 127.0.0.1, made by the ``openssl`` CLI (key file 0600),
for the tests that run TLS servers on loopback (p2p, redis, the S3 direct path)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from needs import need


def self_signed(directory: Path) -> tuple[Path, Path]:
    """``(certificate, key)`` files in ``directory`` naming 127.0.0.1 (subjectAltName IP), valid
    one day. Without ``openssl`` the test skips locally and fails under ``CI=true``."""
    need(shutil.which("openssl") is not None, "openssl is not installed (apt-get install openssl)")
    key, crt = directory / "server.key", directory / "server.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    key.chmod(0o600)
    return crt, key
