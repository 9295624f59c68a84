"""An obj tier whose endpoint is down reports every job within a bounded time whatever its
options (issue 28: ``retries: 100000`` kept ``drain()`` running for minutes). ``retries`` is
capped (:data:`kvtier.tiers.obj.MAX_RETRIES`) and the direct path stops retrying at
``RETRY_WINDOW`` x ``op_timeout``; here the endpoint is a closed port on 127.0.0.1 (real boto3,
real connection refusals)."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
from needs import need_module

need_module("boto3", "s3")

from kvtier.errors import ConfigError  # noqa: E402
from kvtier.jobs import TransferJob  # noqa: E402
from kvtier.keys import BlockKey  # noqa: E402
from kvtier.testing import PrimaryBuffer, wait_for_jobs  # noqa: E402
from kvtier.tiers.obj.s3_wire import RETRY_WINDOW  # noqa: E402
from kvtier.tiers.obj.tier import MAX_RETRIES, ObjTier  # noqa: E402

OP_TIMEOUT = 0.5


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def obj_tier(primary: PrimaryBuffer, **kw: object) -> ObjTier:
    return ObjTier(
        primary_kv_view=primary.view, context=primary.context("obj"), bucket="b",
        endpoint_url=f"http://127.0.0.1:{closed_port()}", region="us-east-1", access_key_id="test",
        secret_access_key="test", op_timeout=OP_TIMEOUT, warm_listing=0, breaker_failures=1000, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("data_path", ["direct", "boto3"])
def test_jobs_against_a_dead_endpoint_end_in_bounded_time_at_the_most_retries(data_path: str) -> None:
    primary = PrimaryBuffer.heap(4, 8192, 5000)
    tier = obj_tier(primary, retries=MAX_RETRIES, data_path=data_path)
    # botocore's standard backoff is at most 2**attempt s per retry; the direct path's is tiny.
    bound = (1 + MAX_RETRIES) * RETRY_WINDOW * OP_TIMEOUT + 2**MAX_RETRIES + 2
    try:
        for i, load in enumerate([False, True, False], 1):
            job = TransferJob(i, [BlockKey(b"dead-%d" % i)], np.array([i], dtype=np.int32), is_promotion=load)
            t0 = time.monotonic()
            (tier.submit_load if load else tier.submit_store)(job)
            result = wait_for_jobs(tier, [i], timeout=bound + 30)[i]
            took = time.monotonic() - t0
            assert not result.success and took < bound, f"job {i} took {took:.1f} s (bound {bound:.1f} s)"
    finally:
        tier.shutdown()


def test_a_huge_retry_count_is_refused_up_front() -> None:
    primary = PrimaryBuffer.heap(4, 8192, 5000)
    with pytest.raises(ConfigError, match="retries: expected an integer"):
        obj_tier(primary, retries=100_000)
