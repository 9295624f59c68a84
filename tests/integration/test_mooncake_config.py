"""The mooncake tier's options: bad values are a one-line ConfigError naming the key; a master that
is down does not stop the tier from building, and its jobs fail within a bound (never a hang, never
an exception out of the tier)."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import pytest
from mooncake_servers import LOOPBACK_ENV, free_port
from needs import need_module

from kvtier.errors import ConfigError
from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing import PrimaryBuffer, wait_for_jobs

need_module("mooncake.store", "mooncake")

from kvtier.tiers.mooncake import MooncakeTier  # noqa: E402

GOOD: dict[str, Any] = {"master_server_addr": "127.0.0.1:1", "metadata_server": "http://127.0.0.1:1/metadata"}


def build(**options: Any) -> MooncakeTier:
    primary = PrimaryBuffer.heap(4, 8192, 5000)
    return MooncakeTier(primary_kv_view=primary.view, context=primary.context("mc"), **{**GOOD, **options})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("master_server_addr", None),
        ("metadata_server", ""),
        ("protocol", "udp"),
        ("local_buffer_size", 10),
        ("global_segment_size", -1),
        ("replica_num", 0),
        ("key_prefix", ""),
        ("tenant_id", 3),
        ("staging_max_block", -1),
        ("store_staging_max_block", 1.5),
        ("op_timeout", 0),
        ("threads", 0),
    ],
)
def test_bad_options_name_the_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        build(**{key: value})
    assert key in str(info.value) and "\n" not in str(info.value)


def test_a_master_that_is_down_fails_jobs_within_a_bound() -> None:
    os.environ.update(LOOPBACK_ENV)
    port = free_port()  # nothing listens there
    primary = PrimaryBuffer.heap(4, 8192, 5000)
    tier = MooncakeTier(
        primary_kv_view=primary.view,
        context=primary.context("mc"),
        master_server_addr=f"127.0.0.1:{port}",
        metadata_server=f"http://127.0.0.1:{port}/metadata",
        breaker_failures=1,
        breaker_reset=30,
    )
    try:
        t0 = time.monotonic()
        tier.submit_store(TransferJob(1, [BlockKey(b"a")], np.array([0], dtype=np.int32)))
        assert time.monotonic() - t0 < 0.05  # the engine thread never waits for the set-up
        result = wait_for_jobs(tier, [1], timeout=30)[1]
        assert not result.success and "setup" in (result.error or "")
        assert time.monotonic() - t0 < 20
        t1 = time.monotonic()
        assert tier.lookup(BlockKey(b"a")) is LookupResult.MISS  # breaker open: a miss, at once
        assert time.monotonic() - t1 < 0.05
        assert tier.get_stats()["breaker_open"] == 1
    finally:
        tier.shutdown()
