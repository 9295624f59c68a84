r"""The ``obj`` tier (alias ``s3``): KV blocks as objects in S3-compatible storage (AWS S3, Ceph RGW,
MinIO), shared by every instance that uses the same bucket and prefix.

Config (docs/remote.md has copyable examples)::

    {"type": "obj", "bucket": "kv-cache", "prefix": "prod", "region": "eu-west-1"}
    {"type": "obj", "bucket": "kv-cache", "endpoint_url": "http://rgw:7480", "addressing_style": "path"}

* **Objects** are ``<prefix>/<namespace>/<hex of the block key>`` (keys over 200 bytes: ``x`` and
  their xxh3-128; the header holds the real key). The body is the block's bytes exactly and the
  :mod:`kvtier.codec` header (key, namespace tag, length, checksum) travels as the user metadata
  ``x-amz-meta-kvtier-head`` (base64), so a 4 MiB block is a 4 MiB object: one more byte would
  make Ceph RGW store it as two RADOS objects (its head and stripe size is 4 MiB) and read 4 MiB
  blocks ~20% slower. Headers over 1 KiB (keys over ~980 bytes; S3 allows 2 KB of metadata) lead
  the body instead; loads read either layout. Every object is verified on load, so a truncated,
  foreign or damaged one (or one whose metadata was lost) is a miss (``stats.corrupt``), never
  served.
* **Less work per request.** Object ``GET``\ s and single ``PUT``\ s go over kvtier's own
  connection per worker (:mod:`kvtier.tiers.obj.s3_wire`, ``data_path="direct"``, the default): SigV4
  headers signed in a few microseconds, the payload sent from the slot's memory and received into
  it, no botocore event chain per request. boto3 keeps everything else (listing, ``HEAD``,
  deletes, multipart, bucket creation), and the direct path takes its endpoint, addressing style,
  region and credentials from the worker's boto3 client. ``data_path="boto3"`` (or
  ``sign_payload``, or a proxy in the environment) sends every request through boto3, with
  kvtier's checksum replacing botocore's (``request_checksum_calculation="when_required"``), SigV4
  payload signing off unless ``sign_payload``, and parameter validation off so the slot's memory
  is the body. Both paths write the same objects and read each other's.
* **Lookups never touch the network.** The index is warmed at start by a bounded listing
  (``warm_listing`` objects at most) and kept by the tier's own writes; an unknown key answers
  MISS at once and is checked with a HEAD on a worker (RETRY instead while the listing runs), a
  missing one is re-checked after ``negative_ttl`` s: another instance's writes become visible.
* **Large blocks** above ``multipart_threshold`` are written with a multipart upload in
  ``multipart_chunk`` parts (S3's minimum part is 5 MiB).
* **Timeouts and retries:** every request has ``op_timeout`` as connect and read timeout and is
  retried ``retries`` times (botocore's standard retry mode; on the direct path after a failed
  connection or a 500/502/504), with jittered exponential backoff.
* **Capacity:** S3 never evicts. ``max_bytes`` makes kvtier delete the oldest objects it knows of
  (this instance's writes and what the listing found) past that size. Several writers sharing a
  bucket each enforce their own view; give the bucket a lifecycle rule (expire after N days) as
  the real bound (docs/remote.md).
* **Credentials** come from ``access_key_id``/``secret_access_key`` (or the environment variables
  named by ``access_key_env``/``secret_key_env``) or else from the standard AWS chain (environment,
  shared config, instance role). They are never logged or shown by ``config_info``.

Client choice: benchmarks/bench_s3_clients.py measured boto3, aiobotocore and the AWS CRT client
(the CRT ~2x boto3 at 512 KiB, level at 4 MiB); the direct path is faster than all three at both
sizes (benchmarks/bench_remote.py, docs/remote.md "Choosing the S3 client").
"""

from __future__ import annotations

import base64
import binascii
import http.client
import threading
from collections import OrderedDict
from functools import partial
from typing import Any, ClassVar

import boto3
import botocore.exceptions as bx
import urllib3.exceptions as ux
import xxhash
from botocore.config import Config

from kvtier.config import parse_size
from kvtier.errors import TierError, TierUnavailableError
from kvtier.keys import BlockKey
from kvtier.tiers.async_tier import ChunkOutcome
from kvtier.tiers.base import TierContext
from kvtier.tiers.obj.clients import META as _META
from kvtier.tiers.obj.clients import ObjectBody, WorkerClients, direct_path, open_object, put_object
from kvtier.tiers.obj.options import MAX_RETRIES, ObjOptions
from kvtier.tiers.remote.base import RemoteTier
from kvtier.tiers.remote.errors import (
    ErrorMap,
    RemoteFullError,
    RemoteRejectedError,
    RemoteTimeoutError,
)
from kvtier.tiers.remote.options import RemoteOptions
from kvtier.transfer.workers import Priority

__all__ = ["MAX_RETRIES", "S3_ERRORS", "ObjTier"]

Item = tuple[BlockKey, int]
_MAX_HEX_KEY = 200
_META_HEADER_MAX = 1024  # bytes of header moved to metadata (base64: ~1.4 KB of S3's 2 KB)
_MISSING = ("NoSuchKey", "404", "NotFound")
_SLOW = ("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "503")
_DENIED = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "NoSuchBucket")


def _refine(exc: BaseException, cls: type[TierError]) -> type[TierError]:
    """S3 errors carry their kind in the code and HTTP status."""
    if not isinstance(exc, bx.ClientError):
        return cls
    err = exc.response.get("Error", {})
    code = str(err.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if code in _SLOW or status == 503:
        return RemoteFullError
    if code in _DENIED or status in (401, 403):
        return RemoteRejectedError
    if status >= 500:
        return TierUnavailableError
    return RemoteRejectedError


#: Every botocore exception, mapped (tests/unit/test_tiers_remote_base.py checks the coverage), and
#: the HTTP layers' under it (botocore wraps them; one that slips through is still mapped).
S3_ERRORS = ErrorMap(
    "s3",
    [
        (bx.BotoCoreError, TierError),
        (bx.ClientError, RemoteRejectedError),  # refined by code/status
        (bx.EndpointConnectionError, TierUnavailableError),
        (bx.ConnectionError, TierUnavailableError),
        (bx.HTTPClientError, TierUnavailableError),
        (bx.ConnectionClosedError, TierUnavailableError),
        (bx.ReadTimeoutError, RemoteTimeoutError),
        (bx.ConnectTimeoutError, RemoteTimeoutError),
        (bx.NoCredentialsError, RemoteRejectedError),
        (bx.PartialCredentialsError, RemoteRejectedError),
        (bx.CredentialRetrievalError, RemoteRejectedError),
        (bx.UnsupportedTLSVersionWarning, TierError),
        (bx.ImminentRemovalWarning, TierError),
        (bx.UndefinedModelAttributeError, TierError),
        (bx.MissingServiceIdError, TierError),
        (http.client.HTTPException, TierUnavailableError),  # IncompleteRead: the body was cut
        (ux.HTTPError, TierUnavailableError),
        (ux.HTTPWarning, TierError),
    ],
    refine=_refine,
)


#: The settings :meth:`ObjTier.config_info` shows, in this order.
_SHOWN = ("bucket", "prefix", "endpoint_url", "region", "max_bytes", "data_path")


def _is_missing(exc: bx.ClientError) -> bool:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in _MISSING or status == 404


class ObjTier(RemoteTier):
    """KV blocks as S3 objects (see the module doc); its options are
    :class:`~kvtier.tiers.obj.options.ObjOptions`."""

    error_map: ClassVar[ErrorMap] = S3_ERRORS
    options_class: ClassVar[type[RemoteOptions]] = ObjOptions
    options: ObjOptions

    def __init__(self, *, primary_kv_view: memoryview, context: TierContext, **config: Any) -> None:
        super().__init__(primary_kv_view=primary_kv_view, context=context, **config)
        o = self.options
        self.bucket = str(o.bucket)
        self.prefix = f"{o.key_prefix.strip('/')}/{context.namespace}/"
        self.endpoint_url, self.region, self.addressing_style = o.endpoint_url, o.region, o.addressing_style
        self.retries, self.sign_payload, self.warm_listing = o.retries, o.sign_payload, o.warm_listing
        self.data_path = "boto3" if o.sign_payload else o.data_path  # the direct path never hashes bodies
        self.create_bucket = bool(o.create_bucket)
        self.max_bytes = o.capacity
        self.multipart_threshold = parse_size(o.multipart_threshold, "multipart_threshold")
        self.multipart_chunk = o.part_bytes
        self._credentials = o.credentials()
        # Capacity bookkeeping (only with max_bytes): object sizes in age order, under self._lock.
        self._sizes: OrderedDict[BlockKey, int] = OrderedDict()
        self._bytes = 0
        self._boot_lock = threading.Lock()
        self._booted = False
        if self.warm_listing or self.create_bucket:
            self.run_on_worker(Priority.MAINTENANCE, self._boot)
        else:
            self.index.warm = True

    def failure_hint(self, err: TierError) -> str | None:
        if "NoSuchBucket" in str(err):
            return f"bucket {self.bucket!r} does not exist: create it, or set create_bucket: true"
        return super().failure_hint(err)

    # -- naming -------------------------------------------------------------------------------------
    def object_name(self, key: BlockKey) -> str:
        """The object holding ``key``."""
        if len(key) <= _MAX_HEX_KEY:
            return self.prefix + key.hex()
        return self.prefix + "x" + xxhash.xxh3_128_hexdigest(key)

    def _key_of(self, name: str) -> BlockKey | None:
        tail = name[len(self.prefix) :]
        if not name.startswith(self.prefix) or tail.startswith("x"):
            return None  # hashed long keys are found by a HEAD instead
        try:
            return BlockKey(bytes.fromhex(tail))
        except ValueError:
            return None

    # -- RemoteTier hooks ------------------------------------------------------------------------------
    def _connect(self) -> WorkerClients:
        # Sessions are not thread-safe: one per worker. Explicit credentials go to the session so
        # that both clients (boto3's and the direct path) sign with the same ones.
        session = boto3.session.Session(**{k: v for k, v in self._credentials.items() if v is not None})
        client = session.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            config=Config(
                connect_timeout=self.op_timeout,
                read_timeout=self.op_timeout,
                retries={"total_max_attempts": 1 + self.retries, "mode": "standard"},
                max_pool_connections=2,
                s3={"addressing_style": self.addressing_style, "payload_signing_enabled": self.sign_payload},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                parameter_validation=False,  # bodies are memoryviews of slots (see the module doc)
                tcp_keepalive=True,
            ),
        )
        if self.create_bucket and not self._booted:
            with self._boot_lock:  # before this worker's first request, once for all of them
                if not self._booted:
                    self._make_bucket(client)
                    self._booted = True
        wire = None
        if self.data_path == "direct":
            wire = direct_path(
                session, client, bucket=self.bucket, probe=self.prefix + "probe", timeout=self.op_timeout,
                retries=self.retries, name=self.name, log=self.rlog,
            )  # fmt: skip
        return WorkerClients(client, wire, self.name, self.rlog)

    def _close_client(self, client: WorkerClients) -> None:
        client.close()

    def _make_bucket(self, client: Any) -> None:
        try:
            client.create_bucket(Bucket=self.bucket)
        except bx.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def _put(self, client: WorkerClients, route: str, items: list[Item]) -> ChunkOutcome:
        done: list[BlockKey] = []
        for key, slot in items:
            head, payload = self._blob_parts(key, slot)
            name = self.object_name(key)
            meta: dict[str, str] = {}
            lead = head  # a long key's header leads the body
            if len(head) <= _META_HEADER_MAX:
                meta, lead = {_META: base64.b64encode(head).decode()}, b""
            size = len(lead) + payload.nbytes
            if size > self.multipart_threshold:
                self._put_multipart(client.boto, name, lead, payload, meta)
            elif client.direct(partial(put_object, name, meta, lead, payload)) is None:
                body = b"".join((lead, payload)) if lead else payload  # the slot itself, no copy
                client.boto.put_object(Bucket=self.bucket, Key=name, Body=body, Metadata=meta)
            done.append(key)
            self._account(key, size)
        return ChunkOutcome(done=done, nbytes=len(done) * self.block_bytes)

    def _get(self, client: WorkerClients, route: str, items: list[Item]) -> ChunkOutcome:
        done: list[BlockKey] = []
        for key, slot in items:
            try:
                body = self._open(client, self.object_name(key))
            except bx.ClientError as exc:
                if not _is_missing(exc):
                    raise
                self._vanished(key)
                continue
            try:
                # The payload straight into the slot, verified there (the header: metadata or lead).
                ok = self._receive(key, slot, body.read_into, body.size, _decode_head(body.head))
            finally:
                body.finish()  # a body not read to its end must not go back to the connection pool
            if ok:
                done.append(key)
                if self.max_bytes is not None:
                    with self._lock:
                        if key in self._sizes:
                            self._sizes.move_to_end(key)
        return ChunkOutcome(done=done, nbytes=len(done) * self.block_bytes)

    def _open(self, client: WorkerClients, name: str) -> ObjectBody:
        """Start reading object ``name`` (``ClientError`` when it is missing or refused)."""
        direct = client.direct(partial(open_object, name))
        if direct is not None:
            return direct
        got = client.boto.get_object(Bucket=self.bucket, Key=name)
        stream = got["Body"]
        head = (got.get("Metadata") or {}).get(_META)
        return ObjectBody(int(got.get("ContentLength", -1)), head, stream.readinto, stream.close)

    def _exists(self, client: WorkerClients, route: str, keys: list[BlockKey]) -> list[bool]:
        out = []
        for key in keys:
            try:
                client.boto.head_object(Bucket=self.bucket, Key=self.object_name(key))
                out.append(True)
            except bx.ClientError as exc:
                if not _is_missing(exc):
                    raise
                out.append(False)
        return out

    def _drop_corrupt(self, key: BlockKey) -> None:
        self.run_on_worker(Priority.MAINTENANCE, lambda: self._delete([key]))

    def _vanished(self, key: BlockKey) -> None:
        super()._vanished(key)
        self._unaccount([key])

    def config_info(self) -> dict[str, Any]:
        info = super().config_info()
        info.update({name: getattr(self, name) for name in _SHOWN})
        info["objects_known"] = len(self.index.known)
        return info

    # -- internals -----------------------------------------------------------------------------------------
    def _put_multipart(
        self, client: Any, name: str, lead: bytes, payload: memoryview, meta: dict[str, str]
    ) -> None:
        upload = client.create_multipart_upload(Bucket=self.bucket, Key=name, Metadata=meta)["UploadId"]
        try:
            parts = []
            total = len(lead) + payload.nbytes
            step = self.multipart_chunk
            for number, lo in enumerate(range(0, total, step), start=1):
                hi = min(total, lo + step)
                if lo >= len(lead):  # a slice of the slot, no copy
                    body: bytes | memoryview = payload[lo - len(lead) : hi - len(lead)]
                else:  # a leading header only ever lands in the first part (it is far under 5 MiB)
                    body = lead[lo:hi] + payload[: hi - len(lead)].tobytes()
                etag = client.upload_part(
                    Bucket=self.bucket, Key=name, UploadId=upload, PartNumber=number, Body=body
                )
                parts.append({"ETag": etag["ETag"], "PartNumber": number})
            client.complete_multipart_upload(
                Bucket=self.bucket, Key=name, UploadId=upload, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            try:
                client.abort_multipart_upload(Bucket=self.bucket, Key=name, UploadId=upload)
            except Exception:  # the gateway is gone too; its lifecycle rules clean up
                self.log.debug("kvtier %s: abort of a multipart upload failed", self.name, exc_info=True)
            raise

    def _boot(self) -> None:
        """List up to ``warm_listing`` objects into the index (the bucket is made by ``_connect``)."""
        result = self._call("", self._boot_with)
        if isinstance(result, TierError):
            self.rlog.warning("boot", f"kvtier {self.name}: bucket listing failed: {result}")
        with self._lock:
            self.index.warm = True  # listed or not: stop making unknown keys wait

    def _boot_with(self, client: WorkerClients) -> None:
        if not self.warm_listing:
            return
        found: list[tuple[Any, BlockKey, int]] = []
        pages = client.boto.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket,
            Prefix=self.prefix,
            PaginationConfig={"MaxItems": self.warm_listing, "PageSize": min(1000, self.warm_listing)},
        )
        for page in pages:
            for obj in page.get("Contents", ()):
                key = self._key_of(obj["Key"])
                if key is not None:
                    found.append((obj["LastModified"], key, int(obj["Size"])))
        found.sort(key=lambda t: t[0])  # oldest first: the eviction order of max_bytes
        with self._lock:
            # A key dropped or evicted while the listing ran stays out (see remote.index).
            listed = set(self.index.add_found([key for _, key, _ in found], self.context.clock()))
            for _, key, size in found:
                if self.max_bytes is not None and key in listed and key not in self._sizes:
                    self._sizes[key] = size
                    self._bytes += size
        self._trim()

    def _account(self, key: BlockKey, size: int) -> None:
        if self.max_bytes is None:
            return
        with self._lock:
            old = self._sizes.pop(key, 0)
            self._sizes[key] = size
            self._bytes += size - old
        self._trim()

    def _unaccount(self, keys: list[BlockKey]) -> None:
        if self.max_bytes is None:
            return
        with self._lock:
            for key in keys:
                self._bytes -= self._sizes.pop(key, 0)

    def _trim(self) -> None:
        """Delete the oldest known objects until the known bytes fit ``max_bytes`` (worker)."""
        if self.max_bytes is None:
            return
        victims: list[BlockKey] = []
        with self._lock:
            while self._bytes > self.max_bytes and self._sizes:
                key, size = self._sizes.popitem(last=False)
                self._bytes -= size
                self.index.forget(key, self.context.clock())
                victims.append(key)
            self.stats.evictions += len(victims)
        if victims:
            self._delete(victims)

    def _delete(self, keys: list[BlockKey]) -> None:
        for lo in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = keys[lo : lo + 1000]
            objects = [{"Key": self.object_name(k)} for k in batch]

            def delete(client: WorkerClients, objects: list[dict[str, str]] = objects) -> Any:
                which = {"Objects": objects, "Quiet": True}
                return client.boto.delete_objects(Bucket=self.bucket, Delete=which)

            result = self._call("", delete)
            if isinstance(result, TierError):
                self.rlog.warning(
                    "delete", f"kvtier {self.name}: deleting {len(batch)} object(s) failed: {result}"
                )


def _decode_head(text: str | None) -> bytes | None:
    """The codec header carried in the object's metadata; ``None`` when the body leads with it
    (long keys); ``b""`` (fails verification) when the metadata is not valid base64."""
    if text is None:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return b""
