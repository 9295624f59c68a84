"""Remote failures say what to do (issue 28): a timeout suggests raising ``op_timeout`` (a cold
gateway's first requests), ``NoSuchBucket`` suggests ``create_bucket``, and Mooncake's
``INTERNAL_ERROR`` without ``MC_TCP_BIND_ADDRESS`` names that variable. The hints are part of the
error, so ``kvtier check`` shows them.

The timeout runs against a real redis-server stopped with SIGSTOP. The bucket case needs an S3
gateway that answers ``NoSuchBucket``; as Ceph is not always here, a scripted HTTP server on
127.0.0.1 answers every request with the 404 ``NoSuchBucket`` document RGW and S3 send (boto3 and
the obj tier are the real ones).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from needs import need_module
from remote_servers import redis_server

from kvtier.cli.main import main

BASE = {"cpu_bytes_to_use": 16 * 4096, "block_bytes": 4096}


def check(capsys: pytest.CaptureFixture[str], tier: dict[str, object]) -> tuple[int, str]:
    code = main(["check", "--json", "--timeout", "10", json.dumps({**BASE, "secondary_tiers": [tier]})])
    report = json.loads(capsys.readouterr().out)
    return code, " ".join(str(t["error"]) for t in report["tiers"])


def test_a_timeout_suggests_raising_op_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    need_module("redis", "redis")
    with redis_server(tmp_path / "redis") as server:
        server.pause()
        try:
            code, text = check(capsys, {"type": "redis", "url": server.url, "op_timeout": 0.3})
        finally:
            server.resume()
    assert code == 1
    assert "raise op_timeout (now 0.3 s)" in text, text


class NoSuchBucket(BaseHTTPRequestHandler):
    BODY = (
        b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchBucket</Code>'
        b"<Message>The specified bucket does not exist</Message><BucketName>kv-missing</BucketName></Error>"
    )

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(404)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(self.BODY)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(self.BODY)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def gateway() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), NoSuchBucket)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_no_such_bucket_suggests_create_bucket(capsys: pytest.CaptureFixture[str]) -> None:
    need_module("boto3", "s3")
    with gateway() as url:
        tier = {"type": "obj", "bucket": "kv-missing", "endpoint_url": url, "region": "us-east-1",
                "addressing_style": "path", "access_key_id": "test", "secret_access_key": "test",
                "warm_listing": 0, "op_timeout": 2.0, "retries": 0}  # fmt: skip
        code, text = check(capsys, tier)
    assert code == 1
    assert "bucket 'kv-missing' does not exist: create it, or set create_bucket: true" in text, text


def test_mooncake_internal_error_names_mc_tcp_bind_address() -> None:
    from kvtier.tiers.mooncake.tier import mooncake_hint

    message = "mooncake: put_parts: INTERNAL_ERROR (-1)"
    assert "MC_TCP_BIND_ADDRESS" in (mooncake_hint(message, {}) or "")
    assert mooncake_hint(message, {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}) is None
    assert mooncake_hint("mooncake: OBJECT_NOT_FOUND (-704)", {}) is None
