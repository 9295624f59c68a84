"""Raw S3 references for the benchmarks: the same PUTs and GETs as a tier, without kvtier.

Every reference has ``store(keys, bodies)`` (PUT ``bodies[i]`` as ``keys[i]``) and
``load(keys, dests)`` (GET each object into ``dests[i]``, which is exactly its size), moving with
``threads`` requests in flight, and ``close()``:

* :class:`Boto3Ref`: boto3, one client per thread, either as a user would write it (default
  config, ``get_object()["Body"].read()``) or with the obj tier's client settings (no CRC32, no
  SigV4 payload signing, no parameter validation) reading each body with ``readinto``.
* :class:`CrtRef`: the AWS CRT S3 client (``pip install awscrt``), at most ``threads`` requests
  submitted at once on ``threads`` connections; its bodies arrive through a callback.
* :class:`BareHttpRef`: the wire's limit, not a client a user has: HTTP/1.1 on one kept-alive
  socket per thread, requests presigned by botocore before the timed part (``prepare``), each body
  ``recv_into`` its destination. No checksum, no parsing beyond the status line and length. It
  sends head and body with the gather-write the tier uses (``kvtier.tiers.remote.sockio``).
"""

from __future__ import annotations

import io
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

from kvtier.tiers.remote.sockio import send_pieces

MIB = 1 << 20
Bodies = Sequence[bytes | memoryview]


def boto3_config(threads: int, tuned: bool) -> Any:
    from botocore.config import Config

    if not tuned:
        return Config(s3={"addressing_style": "path"}, max_pool_connections=threads)
    return Config(  # the settings ObjTier._connect uses
        s3={"addressing_style": "path", "payload_signing_enabled": False},
        max_pool_connections=threads,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        parameter_validation=False,
    )


def timed(*steps: Callable[[], object]) -> list[float]:
    """Run ``steps`` in order; the seconds each one took."""
    out = []
    for step in steps:
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def each(pool: ThreadPoolExecutor, fn: Callable[[int], None], n: int) -> None:
    """``fn(0) .. fn(n - 1)`` on ``pool``; returns when all are done (re-raising the first error)."""
    for f in [pool.submit(fn, i) for i in range(n)]:
        f.result()


class Boto3Ref:
    def __init__(self, endpoint: str, creds: dict[str, str], threads: int, bucket: str, tuned: bool) -> None:
        import boto3

        self.bucket, self.tuned = bucket, tuned
        cfg = boto3_config(threads, tuned)
        self._make = lambda: boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", config=cfg, **creds
        )
        self._local = threading.local()
        self.pool = ThreadPoolExecutor(threads)

    def client(self) -> Any:
        c = getattr(self._local, "c", None)
        if c is None:  # one per thread, made in the untimed warm-up round
            c = self._local.c = self._make()
        return c

    def store(self, keys: list[str], bodies: Bodies) -> None:
        def put(i: int) -> None:
            self.client().put_object(Bucket=self.bucket, Key=keys[i], Body=bodies[i])

        each(self.pool, put, len(keys))

    def load(self, keys: list[str], dests: Sequence[memoryview]) -> None:
        def get(i: int) -> None:
            body = self.client().get_object(Bucket=self.bucket, Key=keys[i])["Body"]
            if not self.tuned:
                assert len(body.read()) == len(dests[i])
                return
            view, got = dests[i], 0
            while got < len(view) and (step := body.readinto(view[got:])):
                got += step
            body.close()
            assert got == len(view)

        each(self.pool, get, len(keys))

    def close(self) -> None:
        self.pool.shutdown()


class CrtRef:
    def __init__(self, endpoint: str, creds: dict[str, str], threads: int, bucket: str) -> None:
        from awscrt import auth, s3
        from awscrt import io as crt_io

        self.s3, self.threads, self.bucket = s3, threads, bucket
        self.host = urllib.parse.urlsplit(endpoint).netloc
        elg = crt_io.EventLoopGroup(max(1, threads // 2))
        bootstrap = crt_io.ClientBootstrap(elg, crt_io.DefaultHostResolver(elg))
        provider = auth.AwsCredentialsProvider.new_static(
            creds["aws_access_key_id"], creds["aws_secret_access_key"]
        )
        self.client = s3.S3Client(
            bootstrap=bootstrap, region="us-east-1", credential_provider=provider,
            tls_mode=s3.S3RequestTlsMode.DISABLED, part_size=8 * MIB, throughput_target_gbps=10.0,
            max_active_connections_override=threads,
        )  # fmt: skip

    def _run(self, make: Callable[[int], Any], n: int) -> None:
        # `threads` requests in flight (the other clients' concurrency): a new one as soon as any
        # finishes. The request objects stay referenced until they are done.
        running: dict[Any, Any] = {}
        for i in range(n):
            while len(running) >= self.threads:
                done, _ = wait(running, timeout=60, return_when=FIRST_COMPLETED)
                for f in done:
                    f.result()
                    del running[f]
            req = make(i)
            running[req.finished_future] = req
        for f in wait(running, timeout=60).done:
            f.result()

    def store(self, keys: list[str], bodies: Bodies) -> None:
        from awscrt.http import HttpHeaders, HttpRequest

        def make(i: int) -> Any:
            size = memoryview(bodies[i]).nbytes
            headers = HttpHeaders([("Host", self.host), ("Content-Length", str(size))])
            req = HttpRequest("PUT", f"/{self.bucket}/{keys[i]}", headers, io.BytesIO(bodies[i]))
            return self.client.make_request(type=self.s3.S3RequestType.PUT_OBJECT, request=req)

        self._run(make, len(keys))

    def load(self, keys: list[str], dests: Sequence[memoryview]) -> None:
        from awscrt.http import HttpHeaders, HttpRequest

        def make(i: int) -> Any:
            view, got = dests[i], [0]

            def on_body(chunk: bytes, offset: int, **_: Any) -> None:
                view[offset : offset + len(chunk)] = chunk
                got[0] += len(chunk)

            def on_done(error: Exception | None = None, **_: Any) -> None:
                assert error is None and got[0] == len(view), (error, got[0])

            req = HttpRequest("GET", f"/{self.bucket}/{keys[i]}", HttpHeaders([("Host", self.host)]))
            return self.client.make_request(
                type=self.s3.S3RequestType.GET_OBJECT, request=req, on_body=on_body, on_done=on_done
            )

        self._run(make, len(keys))

    def close(self) -> None:
        pass


class BareHttpRef:
    def __init__(self, endpoint: str, creds: dict[str, str], threads: int, bucket: str) -> None:
        import boto3

        self.bucket = bucket
        parts = urllib.parse.urlsplit(endpoint)
        self.addr = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.signer = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", config=boto3_config(threads, True), **creds
        )
        self.urls: dict[tuple[str, str], str] = {}
        self._local = threading.local()
        self.pool = ThreadPoolExecutor(threads)

    def prepare(self, keys: list[str]) -> None:
        """Presign every PUT and GET of ``keys`` (untimed)."""
        for k in keys:
            for method, op in (("PUT", "put_object"), ("GET", "get_object")):
                url = self.signer.generate_presigned_url(op, Params={"Bucket": self.bucket, "Key": k})
                split = urllib.parse.urlsplit(url)
                self.urls[(method, k)] = f"{split.path}?{split.query}"

    def _sock(self) -> socket.socket:
        s = getattr(self._local, "s", None)
        if s is None:
            s = self._local.s = socket.create_connection(self.addr, timeout=30)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.buf = bytearray(16384)  # the response head, once per thread
        return s

    def _exchange(self, head: bytes, body: bytes | memoryview, dest: memoryview | None) -> None:
        s = self._sock()
        send_pieces(s, [head, body] if len(body) else [head])  # one sendmsg, as the tier sends
        buf = self._local.buf
        got = 0
        while (end := buf.find(b"\r\n\r\n", 0, got)) < 0:
            got += s.recv_into(memoryview(buf)[got:])
        lines = bytes(buf[:end]).split(b"\r\n")
        assert lines[0].split()[1] == b"200", lines[0]
        length = next(
            int(v) for k, _, v in (x.partition(b":") for x in lines[1:]) if k.lower() == b"content-length"
        )
        extra = buf[end + 4 : got]
        view = memoryview(bytearray(length)) if dest is None else dest
        view[: len(extra)] = extra
        pos = len(extra)
        while pos < length:
            pos += s.recv_into(view[pos:], length - pos)

    def store(self, keys: list[str], bodies: Bodies) -> None:
        def put(i: int) -> None:
            size = memoryview(bodies[i]).nbytes
            head = f"PUT {self.urls[('PUT', keys[i])]} HTTP/1.1\r\nHost: {self.addr[0]}:{self.addr[1]}\r\n"
            self._exchange(f"{head}Content-Length: {size}\r\n\r\n".encode(), bodies[i], None)

        each(self.pool, put, len(keys))

    def load(self, keys: list[str], dests: Sequence[memoryview]) -> None:
        def get(i: int) -> None:
            head = (
                f"GET {self.urls[('GET', keys[i])]} HTTP/1.1\r\nHost: {self.addr[0]}:{self.addr[1]}\r\n\r\n"
            )
            self._exchange(head.encode(), b"", dests[i])

        each(self.pool, get, len(keys))

    def close(self) -> None:
        self.pool.shutdown()
