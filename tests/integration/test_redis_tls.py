"""``rediss://``: the redis tier over TLS to a real redis-server on 127.0.0.1.

The certificate is a real self-signed one (the ``openssl`` CLI, key 0600 in tmp_path) naming
127.0.0.1; the server listens with ``--tls-port`` (its plain port, on loopback, is only the
fixture's readiness probe). Redis builds without TLS exist (``BUILD_TLS=no``): there the test skips
locally with the reason; under ``CI=true`` it fails, because ``.ci/run`` installs Debian's
redis-server, which is built with TLS, and a CI that lost TLS would leave ``rediss://`` untested.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from needs import need, need_module
from remote_servers import RedisServer, free_port
from selfsigned import self_signed

from kvtier.errors import ConfigError
from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing import PrimaryBuffer, wait_for_jobs

redis = need_module("redis", "redis")

from kvtier.tiers.redis import RedisTier  # noqa: E402

BLOCK = 64 << 10


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, int, Path]]:
    need(shutil.which("redis-server") is not None, "redis-server is not installed")
    work = tmp_path_factory.mktemp("redis-tls")
    crt, key = self_signed(work)
    port = free_port()
    tls = ("--tls-port", str(port), "--tls-cert-file", str(crt), "--tls-key-file", str(key),
           "--tls-ca-cert-file", str(crt), "--tls-auth-clients", "no")  # fmt: skip
    try:
        server = RedisServer(work / "data", extra=tls)
    except RuntimeError as exc:  # a build without TLS refuses the --tls-* options and exits
        need(False, f"redis-server has no TLS support ({exc}; build it with BUILD_TLS=yes)")
        raise
    yield server, port, crt
    server.kill()


def test_a_block_round_trips_over_rediss_with_the_ca_file(tls_server: tuple[RedisServer, int, Path]) -> None:
    server, port, crt = tls_server
    primary = PrimaryBuffer.heap(4, BLOCK, BLOCK)
    tier = RedisTier(
        primary_kv_view=primary.view, context=primary.context("redis-tls"),
        url=f"rediss://127.0.0.1:{port}/0", tls_ca_file=str(crt), key_prefix="tls",
    )  # fmt: skip
    try:
        primary.fill_random([0], seed=7)
        want = primary.block(0).tobytes()
        k = BlockKey(b"tls-block-0001")
        tier.submit_store(TransferJob(1, [k], np.array([0], dtype=np.int32)))
        assert wait_for_jobs(tier, [1], timeout=20)[1].success
        assert tier.lookup(k) is LookupResult.HIT
        tier.submit_load(TransferJob(2, [k], np.array([3], dtype=np.int32), True))
        assert wait_for_jobs(tier, [2], timeout=20)[2].success
        assert primary.block(3).tobytes() == want
        assert tier.config_info()["url"].startswith("rediss://")
    finally:
        tier.shutdown()
    # The bytes really went to the TLS port: the value is there, and a client that does not
    # trust the certificate is refused there.
    assert int(server.cli("DBSIZE").strip()) == 1
    with pytest.raises(redis.exceptions.ConnectionError, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
        redis.Redis(host="127.0.0.1", port=port, ssl=True, socket_timeout=5).ping()


def test_tls_options_are_checked(tmp_path: Path) -> None:
    primary = PrimaryBuffer.heap(2, BLOCK, BLOCK)
    ctx = primary.context("redis-tls")
    with pytest.raises(ConfigError, match=r"tls_ca_file.*rediss://"):
        RedisTier(primary_kv_view=primary.view, context=ctx, url="redis://127.0.0.1:1/0", tls_ca_file="x")
    with pytest.raises(ConfigError, match=r"tls_ca_file.*not a readable file"):
        RedisTier(
            primary_kv_view=primary.view, context=ctx, url="rediss://127.0.0.1:1/0",
            tls_ca_file=str(tmp_path / "missing.pem"),
        )  # fmt: skip
