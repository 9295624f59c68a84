"""The obj tier while the S3 gateway (Ceph's radosgw) is killed and restarted: stores drop, lookups
miss within the deadline, no engine-thread call blocks, and the tier recovers by itself. Only the
gateway process is stopped; the Ceph cluster behind it keeps running."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
from needs import need_module
from remote_servers import CephGateway, s3_settings
from test_obj_contract import obj_options

from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing import PrimaryBuffer, wait_for_jobs

need_module("boto3", "s3")

from kvtier.tiers.obj import ObjTier  # noqa: E402

DEADLINE = 0.5


def test_gateway_stopped_then_restarted(tmp_path: Path) -> None:
    gateway = CephGateway(s3_settings()["endpoint_url"])
    primary = PrimaryBuffer.heap(16, 8192, 5000)
    primary.fill_random(range(16), seed=1)
    opts = obj_options(
        tmp_path, op_timeout=DEADLINE, retries=0, breaker_failures=2, breaker_reset=0.5, threads=2
    )
    tier = ObjTier(primary_kv_view=primary.view, context=primary.context("obj"), **opts)
    ids = itertools.count(1)
    slowest = 0.0

    def timed(fn: Any, *args: Any) -> Any:
        nonlocal slowest
        t0 = time.perf_counter()
        out = fn(*args)
        slowest = max(slowest, time.perf_counter() - t0)
        return out

    def run(keys: list[BlockKey], slots: list[int], *, load: bool) -> JobResult:
        job = TransferJob(next(ids), keys, np.asarray(slots, dtype=np.int32), is_promotion=load)
        t0 = time.monotonic()
        timed(tier.submit_load if load else tier.submit_store, job)
        result = wait_for_jobs(tier, [job.job_id], timeout=30)[job.job_id]
        assert time.monotonic() - t0 < 4 * DEADLINE + 1, "a job outlived its deadlines"
        return result

    held = [BlockKey(f"g{i}".encode()) for i in range(3)]
    restarted = False
    try:
        assert run(held, [0, 1, 2], load=False).success
        gateway.stop()
        t_fault = time.monotonic()
        while timed(tier.lookup, held[0]) is LookupResult.HIT:
            assert not run(held[:1], [8], load=True).success
            assert time.monotonic() - t_fault < 6 * DEADLINE + 2
        before = tier.get_stats()["dropped_stores"]
        assert not run([BlockKey(b"n0")], [3], load=False).success
        assert tier.get_stats()["dropped_stores"] == before + 1
        assert slowest < DEADLINE, f"an engine-thread call took {slowest:.3f}s"
        gateway.start()
        restarted = True
        # The objects survived (the cluster kept running); the tier recovers without a rebuild.
        deadline = time.monotonic() + 30
        while not run(held, [9, 10, 11], load=True).success:
            assert time.monotonic() < deadline, "the tier did not recover after the gateway came back"
            time.sleep(0.2)
        assert primary.block(9).tobytes() == primary.block(0).tobytes()
        assert run([BlockKey(b"after")], [4], load=False).success
        assert tier.get_stats()["breaker_open"] == 0 and slowest < DEADLINE
    finally:
        if not restarted and not gateway.up():
            gateway.start()  # leave the gateway running for everyone else
        tier.shutdown()
