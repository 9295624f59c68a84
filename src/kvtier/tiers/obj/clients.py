"""One ``obj`` worker's S3 clients: boto3 for every kind of request, and the direct path
(:mod:`kvtier.tiers.obj.s3_wire`) for single-object ``GET`` and ``PUT`` where it can be used.

Contract:
    * :func:`direct_path` builds a worker's direct path aimed exactly where its boto3 client
      sends requests (endpoint, addressing style, region: read from a presigned URL of boto3's),
      signing with the session's credentials and trusting botocore's CA bundle. It answers
      ``None`` (everything through boto3) with no credentials yet, with a proxy configured for
      the endpoint (boto3 speaks to proxies, the direct path does not), or for an endpoint shape
      it cannot read; the last two are logged.
    * :meth:`WorkerClients.direct` runs one call on the direct path. S3's answer to a request
      signed for the wrong region (a redirect, or ``AuthorizationHeaderMalformed``) drops the
      direct path for this worker, logs how to fix the config, and answers ``None``: the caller
      repeats the request through boto3, which follows such redirects.
    * :func:`put_object` and :func:`open_object` are the two direct calls; a ``GET`` without a
      ``Content-Length`` is refused as a protocol error, never taken for a damaged object.
"""

from __future__ import annotations

import http.client
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import botocore.exceptions as bx
from botocore.httpsession import get_cert_path

from kvtier.tiers.obj.s3_wire import Endpoint, S3Wire
from kvtier.tiers.ratelog import RateLimitedLog

__all__ = ["META", "META_HEADER", "ObjectBody", "WorkerClients", "direct_path", "open_object", "put_object"]

T = TypeVar("T")
META = "kvtier-head"  # the user metadata holding the codec header, base64 (the obj tier's module doc)
META_HEADER = "x-amz-meta-" + META
# S3's answers to a request signed for the wrong region (boto3 retries them at the bucket's region).
_REDIRECTED = ("PermanentRedirect", "TemporaryRedirect", "AuthorizationHeaderMalformed")


class ObjectBody:
    """One object body being read into a slot, from either client: its size, the codec header
    from its metadata (``None``: the body leads with it), and its stream."""

    def __init__(
        self, size: int, head: str | None, read_into: Callable[[memoryview], int], finish: Callable[[], None]
    ) -> None:
        self.size, self.head, self.read_into, self.finish = size, head, read_into, finish


@dataclass
class WorkerClients:
    """A worker's boto3 client and its direct path (``None``: off or lost)."""

    boto: Any
    wire: S3Wire | None
    name: str
    log: RateLimitedLog

    def direct(self, call: Callable[[S3Wire], T]) -> T | None:
        """``call(wire)``, or ``None`` when there is no direct path (see the module doc)."""
        wire = self.wire
        if wire is None:
            return None
        try:
            return call(wire)
        except bx.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code not in _REDIRECTED and status not in (301, 307):
                raise
            wire.close()
            self.wire = None
            self.log.warning(
                "redirect",
                f"kvtier {self.name}: S3 redirected a request ({code or status}); set region to the "
                "bucket's region; this worker sends its data through boto3",
            )
            return None

    def close(self) -> None:
        if self.wire is not None:
            self.wire.close()
        self.boto.close()


def direct_path(
    session: Any,
    client: Any,
    *,
    bucket: str,
    probe: str,
    timeout: float,
    retries: int,
    name: str,
    log: RateLimitedLog,
) -> S3Wire | None:
    """The direct path for boto3 ``client`` of ``session`` (see the module doc); ``probe`` is
    any object name in the tier's prefix (only its URL is computed)."""
    creds = session.get_credentials()
    if creds is None:
        return None  # boto3 raises NoCredentialsError on the first request instead
    try:
        url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": probe})
        endpoint = Endpoint.from_object_url(url, probe, client.meta.region_name or "us-east-1")
        # The CAs botocore trusts: its ca_bundle setting (AWS_CA_BUNDLE), else certifi's bundle.
        ca_file = session._session.get_config_variable("ca_bundle") or get_cert_path(True)
    except Exception as exc:  # an endpoint shape the direct path does not know: boto3 only
        log.warning("direct", f"kvtier {name}: data goes through boto3 ({exc})")
        return None
    if endpoint.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(endpoint.host):
        log.warning("proxy", f"kvtier {name}: a proxy is configured; data goes through boto3")
        return None
    return S3Wire(endpoint, creds.get_frozen_credentials, timeout=timeout, retries=retries, ca_file=ca_file)


def put_object(name: str, meta: dict[str, str], lead: bytes, payload: memoryview, wire: S3Wire) -> bool:
    """PUT ``lead`` + ``payload`` (the slot itself, never copied) as ``name`` with user metadata."""
    fields = {f"x-amz-meta-{k}": v for k, v in meta.items()}
    pieces: list[bytes | memoryview] = [lead, payload] if lead else [payload]
    wire.request("PUT", name, fields, pieces, operation="PutObject").finish()
    return True


def open_object(name: str, wire: S3Wire) -> ObjectBody:
    """Start a GET of ``name`` (``ClientError`` when it is missing or refused)."""
    resp = wire.request("GET", name, operation="GetObject")
    if resp.length < 0:  # no Content-Length: a server or proxy kvtier cannot read a slot from
        resp.finish()
        raise http.client.HTTPException(f"GET {name}: response without Content-Length")
    return ObjectBody(resp.length, resp.headers.get(META_HEADER), resp.read_into, resp.finish)
