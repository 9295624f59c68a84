"""The ``obj`` tier's data path: one object's ``GET`` streamed into a slot, or ``PUT`` from a slot,
over a kept-alive HTTP/1.1 connection per worker, signed with AWS Signature Version 4.

Why not boto3 for these two calls: botocore builds, signs and parses every request through its
event system, and urllib3 reads a body through three layers of Python buffering. On this
project's 2-core test host a 4 MiB ``GET`` cost ~5.6 ms of client CPU through boto3 and ~2.4 ms
on a bare socket, and the gateway shares those cores (benchmarks/bench_remote.py measures the
tier against boto3 in the same run). Everything else (listing, ``HEAD``, ``DELETE``, multipart
uploads, bucket creation) stays on boto3, and this path takes its endpoint, addressing style,
region and credentials from the worker's boto3 client, so both speak to the same URLs.

Contract:
    * :func:`sign` adds SigV4 ``Authorization``, ``x-amz-date``, ``x-amz-content-sha256``
      (``UNSIGNED-PAYLOAD``: kvtier's checksum covers the bytes, TLS the transport) and, with
      temporary credentials, ``x-amz-security-token``. Every header passed in is signed.
    * :meth:`S3Wire.request` sends one request (its body: pieces sent by gather-write, the slot
      itself never copied) and returns the :class:`Response` once its status line and headers
      are in. A ``2xx`` body is read by :meth:`Response.read_into` (never past its
      ``Content-Length``, so the connection stays in step); any other status is raised as
      botocore's ``ClientError`` with the S3 error code from its XML body, the exception the
      boto3 path raises, so the tier's one error map and missing-key test apply unchanged.
    * Deadlines: the connect has the timeout; sending a request and receiving its final status
      line and headers share one deadline of the timeout (a server trickling its head cannot hold
      a worker longer); each receive of a body then has the timeout. Interim ``1xx`` responses
      are skipped. A request on a kept-alive connection the server had closed is re-sent once on
      a new one (``GET`` and ``PUT`` are idempotent), and a failed connection or a 500/502/504
      is retried ``retries`` times; a timeout is not (unlike botocore, which also retries read
      timeouts: a cache would rather miss than wait twice).
    * Socket failures raise builtin ``OSError`` / ``TimeoutError``; malformed responses raise
      ``http.client.HTTPException``. After any failure (of any kind) or a body not read to its
      end the connection is closed, never reused out of step, and a :class:`Response` of a
      closed connection cannot be read. A body with a transfer coding, or without a length, is
      never taken as sized (the caller refuses it).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import random
import re
import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import botocore.exceptions as bx

from kvtier.tiers.remote.sockio import send_pieces

__all__ = ["Credentials", "Endpoint", "Response", "S3Wire", "sign"]

UNSIGNED = "UNSIGNED-PAYLOAD"
_HEAD_MAX = 64 << 10  # a response's status line and headers
_HEAD_STEP = 8 << 10  # bytes asked for per receive while looking for the head's end
_ERROR_BODY_MAX = 64 << 10  # an error response's XML body, read to learn its code
#: A request and its retries end within this many ``timeout``\ s, whatever ``retries`` says.
RETRY_WINDOW = 2
_RETRY_STATUS = (500, 502, 504)  # a gateway's passing trouble; 503 "slow down" pauses stores instead
_CODE = re.compile(rb"<Code>([^<]{1,128})</Code>")


@dataclass(frozen=True)
class Credentials:
    """One frozen set of AWS credentials (``token``: the session token of temporary ones)."""

    access_key: str
    secret_key: str = field(repr=False)
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Endpoint:
    """Where a bucket's objects are: ``scheme://host:port`` and the path in front of each object
    name (``/bucket/`` for path-style addressing, ``/`` for virtual-hosted), as boto3 resolved them."""

    scheme: str
    host: str
    port: int
    base_path: str
    region: str

    @classmethod
    def from_object_url(cls, url: str, name: str, region: str) -> Endpoint:
        """The endpoint of ``url``, the address boto3 gives object ``name`` (a presigned URL)."""
        parts = urlsplit(url)
        tail = "/" + quote(name, safe="/~")
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.path.endswith(tail):
            raise ValueError(f"cannot tell the endpoint from {parts.scheme}://{parts.netloc}{parts.path}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path[: -len(tail) + 1], region)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        return host if self.port == (443 if self.scheme == "https" else 80) else f"{host}:{self.port}"

    def path_of(self, name: str) -> str:
        """The request path of object ``name``: S3 URI-encodes every byte but ``/`` and
        unreserved characters, once (the canonical path is the same string)."""
        return self.base_path + quote(name, safe="/~")


_keys: dict[tuple[str, str, str], bytes] = {}  # (secret, date, region) -> signing key


def _signing_key(secret: str, date: str, region: str) -> bytes:
    key = _keys.get((secret, date, region))
    if key is None:  # once per day and region: four HMACs
        key = ("AWS4" + secret).encode()
        for part in (date, region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        if len(_keys) > 64:
            _keys.clear()
        _keys[(secret, date, region)] = key
    return key


def sign(
    method: str,
    endpoint: Endpoint,
    path: str,
    headers: dict[str, str],
    creds: Credentials,
    *,
    now: float | None = None,
    payload_hash: str = UNSIGNED,
) -> dict[str, str]:
    """``headers`` (names in any case, no ``host``) plus ``host`` and the SigV4 headers, all with
    lower-case names (see the module doc); ``now`` is the signing time (default: the clock).
    ``ValueError`` for a value with a line break (it would split the request's head)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    out = {k.lower(): v for k, v in headers.items()}
    if any("\r" in v or "\n" in v for v in out.values()):
        raise ValueError("a header value holds a line break")
    out["host"] = endpoint.host_header
    out["x-amz-date"] = stamp
    out["x-amz-content-sha256"] = payload_hash
    if creds.token:
        out["x-amz-security-token"] = creds.token
    names = sorted(out)
    canonical = "\n".join(
        [
            method,
            path,
            "",
            *(f"{n}:{' '.join(out[n].split())}" for n in names),
            "",
            ";".join(names),
            payload_hash,
        ]
    )
    scope = f"{stamp[:8]}/{endpoint.region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = _signing_key(creds.secret_key, stamp[:8], endpoint.region)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return out


def _number(text: str | None) -> int | None:
    """A decimal header value (``None``: absent or not plain ASCII digits)."""
    if text is None or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


class Response:
    """One response's status, headers (lower-case names) and body stream (see the module doc).

    The body is read from the socket the response came on; once the wire has moved to another
    connection (the body was abandoned, or an error closed it) reading raises.
    """

    def __init__(self, wire: S3Wire, sock: socket.socket, head: str, rest: bytes) -> None:
        """``head``: the status line and header lines, without the blank line that ends them
        (raises ``http.client.HTTPException`` when malformed); ``rest``: the bytes received after
        it on ``sock``."""
        lines = head.split("\r\n")
        status_line = lines[0].split(" ", 2)
        status = _number(status_line[1]) if len(status_line) >= 2 else None
        version = status_line[0]
        if status is None or version not in ("HTTP/1.0", "HTTP/1.1"):
            raise http.client.BadStatusLine(lines[0][:80])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise http.client.HTTPException(f"malformed header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        self.status = status
        self.headers = headers
        self._wire = wire
        self._sock = sock
        self._rest = memoryview(rest)  # body bytes that arrived with the headers
        conn = headers.get("connection", "").lower()
        self._keep = conn == "keep-alive" if version == "HTTP/1.0" else conn != "close"
        length = _number(headers.get("content-length"))
        if length is None or "transfer-encoding" in headers:
            # Chunked or unbounded (a transfer coding wins over a length, RFC 9112): an error's
            # body is read up to its end marker for the code, then the connection is dropped.
            self._keep = False
            self.length = -1
            self._left = _ERROR_BODY_MAX if status >= 300 else 0
        else:
            self.length = self._left = length

    def read_into(self, view: memoryview) -> int:
        """Fill a prefix of ``view`` with the next body bytes; their count, 0 at the body's end."""
        want = min(len(view), self._left)
        if want <= 0:
            return 0
        if self._rest:
            got = min(want, len(self._rest))
            view[:got] = self._rest[:got]
            self._rest = self._rest[got:]
        else:
            if self._wire.sock is not self._sock:
                raise http.client.IncompleteRead(b"", self._left)  # its connection is gone
            try:
                got = self._sock.recv_into(view, want)
            except BaseException:
                self._wire.close()  # out of step: never reused
                raise
            if not got:
                self._wire.close()
                raise http.client.IncompleteRead(b"", self._left)
        self._left -= got
        return got

    def rest_bytes(self) -> bytes:
        """The bytes received after the head and not read yet (after an interim response: the
        start of the next one)."""
        return bytes(self._rest)

    def finish(self) -> None:
        """Hand the connection back for the next request, or close it when the body was not read
        to its end (a caller that stops early, an error, a server that closes)."""
        if (self._left or not self._keep) and self._wire.sock is self._sock:
            self._wire.close()

    def error(self, operation: str) -> bx.ClientError:
        """The ``ClientError`` boto3 would raise for this non-2xx response (reads its body: to
        its length, or for an unsized one to the end of the XML or of the chunked coding)."""
        body = bytearray()
        chunk = bytearray(min(self._left, _ERROR_BODY_MAX) or 1)
        try:
            while self._left and len(body) < _ERROR_BODY_MAX:
                n = self.read_into(memoryview(chunk))
                body += chunk[:n]
                if self.length < 0 and (b"</Error>" in body or body.endswith(b"0\r\n\r\n")):
                    break  # unsized: a server keeping the connection open must not cost a timeout
        except (OSError, http.client.HTTPException):
            self._keep = False
        self.finish()
        found = _CODE.search(body)
        code = found.group(1).decode("ascii", "replace") if found else str(self.status)
        reply: Any = {
            "Error": {"Code": code, "Message": f"HTTP {self.status}"},
            "ResponseMetadata": {"HTTPStatusCode": self.status},
        }
        return bx.ClientError(reply, operation)


class S3Wire:
    """A worker's connection to one endpoint (not thread-safe: one per worker thread).

    Args:
        endpoint: where the bucket is (:meth:`Endpoint.from_object_url`).
        credentials: returns the current credentials (called per request, so refreshed
            temporary credentials are picked up).
        timeout: seconds for the connect, for sending a request and receiving its status line
            and headers (one deadline), and for each receive of a body.
        retries: times a request is sent again after a connection failure or a 500, 502 or 504
            (jittered exponential backoff from 20 ms; a timeout is not retried: the deadline is
            spent, and a cache would rather miss); retries also stop once ``RETRY_WINDOW``
            timeouts have passed since the request began.
        ca_file: certificates to trust for ``https`` (``None``: the system's store; the obj tier
            passes botocore's bundle, so both paths trust the same CAs).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        credentials: Any,
        *,
        timeout: float,
        retries: int = 0,
        ca_file: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.retries = retries
        self._credentials = credentials
        self.timeout = timeout
        self.sock: socket.socket | None = None
        https = endpoint.scheme == "https"
        self._tls = ssl.create_default_context(cafile=ca_file) if https else None
        self._head = bytearray(_HEAD_MAX)
        self._pending = b""  # bytes received past an interim response's head

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def request(
        self,
        method: str,
        name: str,
        headers: Mapping[str, str] | None = None,
        body: Sequence[bytes | bytearray | memoryview] = (),
        *,
        operation: str,
    ) -> Response:
        """Send one ``GET`` or ``PUT`` for object ``name``; raise ``ClientError`` unless the
        status is 2xx (see the module doc)."""
        if method not in ("GET", "PUT"):
            raise ValueError(f"the direct path sends GET and PUT only, not {method}")
        path = self.endpoint.path_of(name)
        fields = dict(headers or {})
        if method == "PUT":
            fields["content-length"] = str(sum(memoryview(p).nbytes for p in body))
        frozen = self._credentials()  # botocore's ReadOnlyCredentials (refreshed when temporary)
        creds = Credentials(frozen.access_key, frozen.secret_key, frozen.token)
        signed = sign(method, self.endpoint, path, fields, creds)
        lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in signed.items()), "", ""]
        head = "\r\n".join(lines).encode("latin-1")
        retried, stale = 0, False
        # Retries stop at a total deadline too, so no ``retries`` value makes a request outlive
        # RETRY_WINDOW timeouts (a cache would rather miss).
        give_up = time.monotonic() + RETRY_WINDOW * self.timeout
        while True:
            reused = self.sock is not None
            try:
                resp = self._exchange(head, body)
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if isinstance(exc, TimeoutError):
                    raise  # the deadline is spent
                if reused and not stale:
                    stale = True  # the server had closed the kept-alive connection: a new one, free
                    continue
                if retried >= self.retries:
                    raise
                failure: Exception = exc
            except BaseException:
                self.close()  # anything else mid-request leaves the stream out of step
                raise
            else:
                if 200 <= resp.status < 300:
                    return resp
                failure = resp.error(operation)
                if resp.status not in _RETRY_STATUS or retried >= self.retries:
                    raise failure
            retried += 1
            # Jittered exponential backoff, far under the deadline (a cache would rather miss).
            pause = random.uniform(0, min(self.timeout / 4, 0.02 * 2**retried))
            if time.monotonic() + pause >= give_up:
                raise failure
            time.sleep(pause)

    def _exchange(self, head: bytes, body: Sequence[bytes | bytearray | memoryview]) -> Response:
        """Send one request and receive its final response head, within one deadline."""
        deadline = time.monotonic() + self.timeout
        sock = self._socket()
        sock.settimeout(self.timeout)
        send_pieces(sock, [head, *body])
        while True:
            resp = self._read_head(sock, deadline)
            if not 100 <= resp.status < 200:
                sock.settimeout(self.timeout)  # each receive of the body: the full timeout
                return resp
            # An interim response (100 Continue, 103 Early Hints): its bytes past the head are
            # the start of the next one.
            self._pending = resp.rest_bytes()

    def _socket(self) -> socket.socket:
        if self.sock is None:
            sock = socket.create_connection((self.endpoint.host, self.endpoint.port), timeout=self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.endpoint.host)
            self.sock = sock
            self._pending = b""
        return self.sock

    def _read_head(self, sock: socket.socket, deadline: float) -> Response:
        """Receive one status line and its headers by ``deadline``; the body bytes that came
        with them stay in the :class:`Response`."""
        buf = memoryview(self._head)
        got = len(self._pending)
        buf[:got] = self._pending
        self._pending = b""
        end = self._head.find(b"\r\n\r\n", 0, got)
        while end < 0:
            if got == len(buf):
                raise http.client.LineTooLong("response headers")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no response head within the timeout")
            sock.settimeout(left)
            # At most 8 KiB a receive: a head is far smaller, and body bytes taken with it are
            # copied once more (into the Response) before they reach the slot.
            n = sock.recv_into(buf[got:], min(len(buf) - got, _HEAD_STEP))
            if not n:
                raise http.client.RemoteDisconnected("the server closed the connection")
            start = max(0, got - 3)
            got += n
            end = self._head.find(b"\r\n\r\n", start, got)
        return Response(self, sock, bytes(buf[:end]).decode("latin-1"), bytes(buf[end + 4 : got]))
