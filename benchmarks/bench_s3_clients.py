"""Which S3 client moves KV blocks fastest: boto3, the AWS CRT S3 client (awscrt), aiobotocore.

The raw clients only (no kvtier), same gateway, same run, same concurrency: ``--threads`` requests
in flight (boto3: that many threads, one client each; CRT: at most that many requests submitted at
once and ``max_active_connections_override`` = threads; aiobotocore: a semaphore of that size on one
event loop). Each round PUTs then GETs ``--mib`` MiB of fresh objects per block size; rounds rotate
the clients' order; figures are medians with the slowest and fastest round. A client that is not
installed is reported as such (``pip install awscrt`` / ``aiobotocore``). ``--json`` prints one
object; ``ratios`` are each client / boto3 (medians). This picks the client the ``obj`` tier uses
(docs/remote.md, "Choosing the S3 client"); bench_remote.py compares the tier with these clients.
``boto3_kvtier`` is boto3 with the tier's own client settings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, ClassVar

from s3_refs import CrtRef, timed

MIB = 1 << 20
BUCKET = "kvtier-bench-clients"


class Boto3:
    name = "boto3"
    #: Config options on top of the path addressing and pool size every variant has.
    options: ClassVar[dict[str, Any]] = {}

    def __init__(self, endpoint: str, creds: dict[str, str], threads: int) -> None:
        import boto3
        from botocore.config import Config

        s3_opts = {"addressing_style": "path", **self.options.get("s3", {})}
        extra = {k: v for k, v in self.options.items() if k != "s3"}
        self._local = threading.local()
        self._make = lambda: boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            config=Config(s3=s3_opts, max_pool_connections=threads, **extra), **creds,
        )  # fmt: skip
        self.pool = ThreadPoolExecutor(threads)
        first = self._make()
        with contextlib.suppress(first.exceptions.ClientError):  # already there
            first.create_bucket(Bucket=BUCKET)

    def _client(self) -> Any:
        c = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = self._make()
        return c

    def put(self, keys: list[str], data: bytes) -> None:
        list(self.pool.map(lambda k: self._client().put_object(Bucket=BUCKET, Key=k, Body=data), keys))

    def get(self, keys: list[str], size: int) -> None:
        def one(k: str) -> None:
            assert len(self._client().get_object(Bucket=BUCKET, Key=k)["Body"].read()) == size

        list(self.pool.map(one, keys))

    def close(self) -> None:
        self.pool.shutdown()


class Boto3Kvtier(Boto3):
    """boto3 with the obj tier's settings: no CRC32 (kvtier sums the block), no SigV4 payload
    signing, no parameter validation."""

    name = "boto3_kvtier"
    options: ClassVar[dict[str, Any]] = {
        "s3": {"payload_signing_enabled": False},
        "request_checksum_calculation": "when_required",
        "response_checksum_validation": "when_required",
        "parameter_validation": False,
    }


class Crt(CrtRef):
    name = "crt"

    def __init__(self, endpoint: str, creds: dict[str, str], threads: int) -> None:
        super().__init__(endpoint, creds, threads, BUCKET)

    def put(self, keys: list[str], data: bytes) -> None:
        self.store(keys, [data] * len(keys))

    def get(self, keys: list[str], size: int) -> None:
        self.load(keys, [memoryview(bytearray(size)) for _ in keys])


class AioBotocore:
    name = "aiobotocore"

    def __init__(self, endpoint: str, creds: dict[str, str], threads: int) -> None:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        self.loop = asyncio.new_event_loop()
        self.threads = threads
        cfg = AioConfig(s3={"addressing_style": "path"}, max_pool_connections=threads)
        ctx = get_session().create_client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", config=cfg, **creds
        )
        self._ctx = ctx
        self.client = self.loop.run_until_complete(ctx.__aenter__())

    def _gather(self, fn: Callable[[str], Any], keys: list[str]) -> None:
        async def main() -> None:
            sem = asyncio.Semaphore(self.threads)

            async def one(k: str) -> None:
                async with sem:
                    await fn(k)

            await asyncio.gather(*(one(k) for k in keys))

        self.loop.run_until_complete(main())

    def put(self, keys: list[str], data: bytes) -> None:
        self._gather(lambda k: self.client.put_object(Bucket=BUCKET, Key=k, Body=data), keys)

    def get(self, keys: list[str], size: int) -> None:
        async def one(k: str) -> None:
            resp = await self.client.get_object(Bucket=BUCKET, Key=k)
            async with resp["Body"] as body:
                assert len(await body.read()) == size

        self._gather(one, keys)

    def close(self) -> None:
        self.loop.run_until_complete(self._ctx.__aexit__(None, None, None))
        self.loop.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s3-endpoint", default=os.environ.get("KVTIER_TEST_S3_ENDPOINT", ""))
    ap.add_argument("--sizes", default="512KiB,4MiB")
    ap.add_argument("--mib", type=int, default=16, help="MiB per round and size")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not args.s3_endpoint:
        print("no S3 endpoint (--s3-endpoint or KVTIER_TEST_S3_ENDPOINT)", file=sys.stderr)
        return 2
    creds = {
        "aws_access_key_id": os.environ.get("KVTIER_TEST_S3_ACCESS_KEY", "kvtier"),
        "aws_secret_access_key": os.environ.get("KVTIER_TEST_S3_SECRET_KEY", "kvtier-secret"),
    }
    clients: list[Any] = []
    missing: dict[str, str] = {}
    for cls in (Boto3, Boto3Kvtier, Crt, AioBotocore):
        try:
            clients.append(cls(args.s3_endpoint, creds, args.threads))
        except ImportError as exc:
            missing[cls.name] = f"not installed: {exc}"
    doc: dict[str, Any] = {"threads": args.threads, "missing": missing, "sizes": {}, "ratios": {}}
    t0 = time.perf_counter()
    try:
        for spec in args.sizes.split(","):
            size = int(spec[:-3]) * (1024 if spec.endswith("KiB") else MIB)
            n = max(2, args.mib * MIB // size)
            data = os.urandom(size)
            secs: dict[str, list[float]] = {}
            for r in range(args.repeat + 1):  # round 0 warms connections
                order = clients[r % len(clients) :] + clients[: r % len(clients)]
                for c in order:
                    keys = [f"{c.name}-{uuid.uuid4().hex[:8]}-{i}" for i in range(n)]
                    tp, tg = timed(partial(c.put, keys, data), partial(c.get, keys, size))
                    if r:
                        secs.setdefault(f"{c.name}_put", []).append(tp)
                        secs.setdefault(f"{c.name}_get", []).append(tg)
            mib = n * size / MIB
            out: dict[str, Any] = {"blocks": n}
            for k, v in secs.items():
                rates = sorted(mib / s for s in v)
                out[f"{k}_mib_s"] = round(statistics.median(rates), 1)
                out[f"{k}_spread"] = [round(rates[0], 1), round(rates[-1], 1)]
            doc["sizes"][spec] = out
            for c in clients[1:]:
                for op in ("put", "get"):
                    ratio = out[f"{c.name}_{op}_mib_s"] / out[f"boto3_{op}_mib_s"]
                    doc["ratios"][f"{c.name}_{op}_{spec}"] = round(ratio, 3)
    finally:
        for c in clients:
            c.close()
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(doc))
    else:
        for spec, out in doc["sizes"].items():
            print(spec, {k: v for k, v in out.items() if k.endswith("_mib_s")})
        print("ratios vs boto3:", doc["ratios"], "missing:", missing, f"({doc['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
