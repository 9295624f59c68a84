"""kvtier.tiers.obj.s3_wire, the obj tier's direct GET/PUT path, against botocore and real sockets.

Signing: the AWS documentation's published SigV4 example for S3 gives the documented signature,
and for any method, object name, header set and credentials :func:`sign` gives exactly the
``Authorization`` botocore's own S3 signer computes at the same instant (Hypothesis). Object
paths are quoted as boto3 quotes them in its own URLs.

Responses (a scripted HTTP server on a loopback socket, its bytes cut into arbitrary pieces):
bodies arrive byte-exact and the connection stays in step for the next request; error statuses
are botocore ``ClientError``\\ s carrying the S3 code; a body cut off, a malformed status line or
oversized headers raise; a server that closed a kept-alive connection gets the request once more
on a new one; a silent server is a ``TimeoutError`` within the timeout.
"""

from __future__ import annotations

import datetime
import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from needs import need_module
from selfsigned import self_signed

bx = need_module("botocore.exceptions", "s3")

import botocore.auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.config import Config  # noqa: E402
from botocore.credentials import Credentials as BotoCredentials  # noqa: E402

from kvtier.errors import ConfigError  # noqa: E402
from kvtier.tiers.obj.s3_wire import RETRY_WINDOW, Credentials, Endpoint, S3Wire, sign  # noqa: E402
from kvtier.tiers.obj.tier import MAX_RETRIES  # noqa: E402

# -- signing ----------------------------------------------------------------------------------------


def test_the_aws_documentation_example_signs_as_documented() -> None:
    # "Example: GET Object" of the SigV4 header-signing page of the Amazon S3 API reference.
    ep = Endpoint("https", "examplebucket.s3.amazonaws.com", 443, "/", "us-east-1")
    creds = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    when = datetime.datetime(2013, 5, 24, tzinfo=datetime.UTC).timestamp()
    out = sign("GET", ep, "/test.txt", {"range": "bytes=0-9"}, creds, now=when, payload_hash=empty)
    assert out["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


names_st = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=40
).filter(lambda s: not s.startswith("/"))
meta_st = st.dictionaries(
    st.sampled_from(["x-amz-meta-kvtier-head", "x-amz-meta-other", "content-type", "range"]),
    st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=30),
    max_size=3,
)


@settings(max_examples=60, deadline=None)
@given(
    method=st.sampled_from(["GET", "PUT", "HEAD", "DELETE"]),
    name=names_st,
    headers=meta_st,
    token=st.one_of(
        st.none(), st.text(st.characters(min_codepoint=48, max_codepoint=122), min_size=8, max_size=40)
    ),
    region=st.sampled_from(["us-east-1", "eu-west-1", "default"]),
    port=st.sampled_from([80, 7480]),
    when=st.integers(1_500_000_000, 2_000_000_000),
)
def test_signatures_match_botocore(
    method: str,
    name: str,
    headers: dict[str, str],
    token: str | None,
    region: str,
    port: int,
    when: int,
) -> None:
    ep = Endpoint("http", "127.0.0.1", port, "/bucket/", region)
    path = ep.path_of(name)
    fields = dict(headers)
    if method == "PUT":
        fields["content-length"] = "1234"
    ours = sign(method, ep, path, fields, Credentials("AKID", "secret/key+1", token), now=when)

    moment = datetime.datetime.fromtimestamp(when, datetime.UTC).replace(tzinfo=None)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(botocore.auth, "get_current_datetime", lambda: moment)
        req = AWSRequest(method, f"http://{ep.host_header}{path}", headers=dict(fields))
        req.context["client_config"] = Config(s3={"payload_signing_enabled": False})
        botocore.auth.S3SigV4Auth(BotoCredentials("AKID", "secret/key+1", token), "s3", region).add_auth(req)
    assert ours["authorization"] == req.headers["Authorization"]
    assert ours["x-amz-date"] == req.headers["X-Amz-Date"]


@settings(max_examples=60, deadline=None)
@given(name=names_st)
def test_object_paths_are_quoted_as_boto3_quotes_them(name: str) -> None:
    import boto3

    client = boto3.session.Session().client(
        "s3", endpoint_url="http://127.0.0.1:7480", region_name="us-east-1",
        aws_access_key_id="a", aws_secret_access_key="b",
        config=Config(s3={"addressing_style": "path"}),
    )  # fmt: skip
    url = client.generate_presigned_url("get_object", Params={"Bucket": "bkt", "Key": name})
    ep = Endpoint.from_object_url(url, name, "us-east-1")
    assert (ep.scheme, ep.host, ep.port, ep.base_path) == ("http", "127.0.0.1", 7480, "/bkt/")
    assert url.split("?")[0] == f"http://127.0.0.1:7480{ep.path_of(name)}"


# -- responses on real sockets ---------------------------------------------------------------------------


class Script:
    """A loopback HTTP server answering each request on a connection with the next scripted
    response, written in pieces at ``cuts``; ``close_after`` closes a connection after that
    many responses. Records the requests it read (head and body)."""

    def __init__(
        self,
        responses: list[bytes],
        cuts: list[int] = (),
        close_after: int | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.tls = tls
        self.responses, self.cuts, self.close_after = list(responses), list(cuts), close_after
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.lsock.settimeout(10)
        while self.responses:
            try:
                conn, _ = self.lsock.accept()
            except OSError:
                return
            self.connections += 1
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except (OSError, ssl.SSLError):
                    conn.close()  # a client that refused our certificate
                    continue
            with conn:
                served = 0
                while self.responses and (self.close_after is None or served < self.close_after):
                    if not self._one(conn):
                        break
                    served += 1

    def _one(self, conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (
                int(v)
                for k, _, v in (x.partition(b":") for x in head.split(b"\r\n"))
                if k.lower() == b"content-length"
            ),
            0,
        )
        while len(body) < length:
            body += conn.recv(65536)
        self.requests.append((head, body))
        out = self.responses.pop(0)
        pos = 0
        for cut in sorted(c % (len(out) + 1) for c in self.cuts):
            conn.sendall(out[pos:cut])
            pos = max(pos, cut)
            time.sleep(0.001)
        conn.sendall(out[pos:])
        return True

    def close(self) -> None:
        self.lsock.close()
        self.thread.join(5)


@contextmanager
def wire_to(script: Script, timeout: float = 2.0, retries: int = 0) -> Iterator[S3Wire]:
    ep = Endpoint("http", "127.0.0.1", script.port, "/bkt/", "us-east-1")
    frozen = BotoCredentials("AKID", "SECRET").get_frozen_credentials()
    w = S3Wire(ep, lambda: frozen, timeout=timeout, retries=retries)
    try:
        yield w
    finally:
        w.close()
        script.close()


def ok(body: bytes, **headers: str) -> bytes:
    extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def read_all(resp: Any) -> bytes:
    out = bytearray(max(resp.length, 0))
    view, got = memoryview(out), 0
    while got < len(out) and (n := resp.read_into(view[got:])):
        got += n
    resp.finish()
    return bytes(out[:got])


# Bodies past the 64 KiB head buffer, made from a seed (Hypothesis draws bounded entropy).
LARGE = st.tuples(st.integers(70_000, 70_100), st.integers(0, 2**32)).map(
    lambda t: random.Random(t[1]).randbytes(t[0])
)


@settings(max_examples=40, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=3000) | LARGE, min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 80_000), max_size=5),
)
def test_bodies_arrive_whole_and_the_connection_stays_in_step(bodies: list[bytes], cuts: list[int]) -> None:
    script = Script([ok(b, x_amz_meta_kvtier_head="aGVhZA==") for b in bodies], cuts)
    with wire_to(script) as w:
        for i, body in enumerate(bodies):
            resp = w.request("GET", f"obj/{i}", operation="GetObject")
            assert resp.headers["x-amz-meta-kvtier-head"] == "aGVhZA=="
            assert read_all(resp) == body
    assert script.connections == 1
    assert [h.split(b" ")[1] for h, _ in script.requests] == [
        f"/bkt/obj/{i}".encode() for i in range(len(bodies))
    ]


def test_a_put_sends_its_pieces_as_one_body_signed_unsigned_payload() -> None:
    script = Script([ok(b"")])
    payload = memoryview(bytearray(range(256)) * 1000)
    with wire_to(script) as w:
        w.request(
            "PUT", "k", {"x-amz-meta-kvtier-head": "abc"}, [b"lead", payload], operation="PutObject"
        ).finish()
    head, body = script.requests[0]
    assert body == b"lead" + payload.tobytes()
    lower = head.lower()
    assert b"content-length: %d" % (4 + payload.nbytes) in lower
    assert b"x-amz-content-sha256: unsigned-payload" in lower
    assert b"authorization: aws4-hmac-sha256 credential=akid/" in lower


@pytest.mark.parametrize(
    ("status", "xml", "code"),
    [
        (404, b"<Error><Code>NoSuchKey</Code></Error>", "NoSuchKey"),
        (403, b"<Error><Code>SignatureDoesNotMatch</Code></Error>", "SignatureDoesNotMatch"),
        (503, b"<Error><Code>SlowDown</Code></Error>", "SlowDown"),
        (500, b"", "500"),
    ],
)
def test_error_statuses_are_client_errors_with_the_s3_code(status: int, xml: bytes, code: str) -> None:
    err = f"HTTP/1.1 {status} X\r\nContent-Length: {len(xml)}\r\n\r\n".encode() + xml
    script = Script([err, ok(b"after")])
    with wire_to(script) as w:
        with pytest.raises(bx.ClientError) as info:
            w.request("GET", "k", operation="GetObject")
        assert info.value.response["Error"]["Code"] == code
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
        assert read_all(w.request("GET", "k2", operation="GetObject")) == b"after"  # still in step
    assert script.connections == 1


@pytest.mark.parametrize("status", [500, 502, 504])
def test_passing_gateway_errors_are_retried_as_configured(status: int) -> None:
    err = f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n".encode()
    script = Script([err, err, ok(b"third time")])
    with wire_to(script, retries=2) as w:
        assert read_all(w.request("GET", "k", operation="GetObject")) == b"third time"
    assert len(script.requests) == 3
    script = Script([err, err, ok(b"never")])
    with wire_to(script, retries=1) as w, pytest.raises(bx.ClientError):
        w.request("GET", "k", operation="GetObject")
    assert len(script.requests) == 2


def test_slow_down_is_not_retried() -> None:
    script = Script([b"HTTP/1.1 503 X\r\nContent-Length: 0\r\n\r\n", ok(b"")])
    with wire_to(script, retries=3) as w, pytest.raises(bx.ClientError):
        w.request("GET", "k", operation="GetObject")
    assert len(script.requests) == 1


def test_a_closed_keepalive_connection_is_retried_once_on_a_new_one() -> None:
    script = Script([ok(b"one"), ok(b"two")], close_after=1)
    with wire_to(script) as w:
        assert read_all(w.request("GET", "a", operation="GetObject")) == b"one"
        time.sleep(0.05)  # the server has closed the connection by now
        assert read_all(w.request("GET", "b", operation="GetObject")) == b"two"
    assert script.connections == 2


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",  # the body is cut off
        b"SSH-2.0-OpenSSH\r\n\r\n",  # not HTTP
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * (70 << 10) + b"\r\n\r\n",  # headers past the limit
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    ],
)
def test_damaged_responses_raise_and_drop_the_connection(reply: bytes) -> None:
    import http.client

    script = Script([reply])
    with wire_to(script) as w:
        with pytest.raises(http.client.HTTPException):
            read_all(w.request("GET", "k", operation="GetObject"))
        assert w.sock is None


def wire_at(port: int, timeout: float, scheme: str = "http", ca_file: str | None = None) -> S3Wire:
    ep = Endpoint(scheme, "127.0.0.1", port, "/bkt/", "us-east-1")
    frozen = BotoCredentials("AKID", "SECRET").get_frozen_credentials()
    return S3Wire(ep, lambda: frozen, timeout=timeout, ca_file=ca_file)


def test_a_silent_server_times_out_within_the_timeout() -> None:
    lsock = socket.create_server(("127.0.0.1", 0))
    w = wire_at(lsock.getsockname()[1], 0.3)
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            w.request("GET", "k", operation="GetObject")
    finally:
        w.close()
        lsock.close()
    assert time.monotonic() - t0 < 1.0


def test_https_checks_the_certificate_and_moves_bodies(tmp_path: Path) -> None:
    """A real TLS server (a self-signed certificate made by the openssl CLI, naming 127.0.0.1):
    trusted through ``ca_file`` it serves a GET and takes a PUT; with the system's CAs only, the
    handshake fails (the certificate is not trusted), nothing is sent."""
    crt, key = self_signed(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(crt, key)
    body = random.Random(3).randbytes(200_000)
    script = Script([ok(body), ok(b"")], tls=server_ctx)
    untrusting = wire_at(script.port, 2.0, "https")
    with pytest.raises(ssl.SSLCertVerificationError):
        untrusting.request("GET", "k", operation="GetObject")
    w = wire_at(script.port, 2.0, "https", ca_file=str(crt))
    try:
        assert read_all(w.request("GET", "k", operation="GetObject")) == body
        w.request("PUT", "k", {}, [memoryview(body)], operation="PutObject").finish()
        assert script.requests[-1][1] == body
    finally:
        w.close()
        script.close()


def test_the_obj_tier_never_takes_an_unsized_body_for_a_damaged_object() -> None:
    """A 200 without Content-Length (a chunked proxy in the way) fails the request: the object is
    neither served nor counted corrupt and deleted."""
    import http.client

    from kvtier.keys import BlockKey
    from kvtier.testing import PrimaryBuffer
    from kvtier.tiers.obj import ObjTier

    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    script = Script([chunked])
    primary = PrimaryBuffer.heap(2, 4096, 4096)
    tier = ObjTier(
        primary_kv_view=primary.view, context=primary.context("obj"), bucket="bkt", key_prefix="p",
        endpoint_url=f"http://127.0.0.1:{script.port}", addressing_style="path", region="us-east-1",
        access_key_id="AKID", secret_access_key="SECRET", warm_listing=0,
    )  # fmt: skip
    try:
        with pytest.raises(http.client.HTTPException, match="Content-Length"):
            tier._get(tier._client(), "", [(BlockKey(b"k"), 0)])
        assert tier.get_stats()["corrupt"] == 0 and len(script.requests) == 1
    finally:
        tier.shutdown()
        script.close()


def test_a_chunked_error_on_a_kept_connection_costs_no_timeout() -> None:
    """AWS sends error bodies chunked: the code is read to the XML's end, the connection dropped,
    and the worker does not wait for a body end that never comes."""
    xml = b"<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>"
    chunked = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (
        len(xml),
        xml,
    )
    script = Script([chunked, ok(b"next")])
    with wire_to(script, timeout=2.0) as w:
        t0 = time.monotonic()
        with pytest.raises(bx.ClientError) as info:
            w.request("GET", "k", operation="GetObject")
        assert time.monotonic() - t0 < 0.5
        assert info.value.response["Error"]["Code"] == "NoSuchKey"
        assert w.sock is None
        assert read_all(w.request("GET", "k2", operation="GetObject")) == b"next"


@pytest.mark.parametrize(
    "interim", [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n"]
)
def test_interim_responses_are_skipped_for_the_final_one(interim: bytes) -> None:
    script = Script([interim + ok(b"final"), interim + b"HTTP/1.1 500 X\r\nContent-Length: 0\r\n\r\n"])
    with wire_to(script) as w:
        assert read_all(w.request("GET", "k", operation="GetObject")) == b"final"
        with pytest.raises(bx.ClientError):  # a PUT is stored only when the final status says so
            w.request("PUT", "k", {}, [b"body"], operation="PutObject")


def test_a_length_beside_a_transfer_coding_is_not_trusted() -> None:
    import http.client

    from kvtier.tiers.obj.clients import open_object

    both = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\n\r\n"
    script = Script([both])
    with wire_to(script) as w, pytest.raises(http.client.HTTPException, match="Content-Length"):
        open_object("k", w)


@pytest.mark.parametrize(
    "reply", [b"HTTP/1.1 2\xc2\xb200 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: \xc2\xb2\r\n\r\nxx"]
)
def test_non_ascii_digits_are_not_numbers(reply: bytes) -> None:
    import http.client

    from kvtier.tiers.obj.clients import open_object

    script = Script([reply])
    with wire_to(script) as w:
        with pytest.raises(http.client.HTTPException):
            open_object("k", w)
        assert w.sock is None


def test_a_trickling_server_cannot_hold_the_response_head_past_the_timeout() -> None:
    lsock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = lsock.accept()
        with conn:
            conn.recv(65536)
            for b in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200:
                if stop.wait(0.05):
                    return
                conn.sendall(bytes([b]))

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    w = wire_at(lsock.getsockname()[1], 0.4)
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            w.request("GET", "k", operation="GetObject")
        assert time.monotonic() - t0 < 0.9
    finally:
        stop.set()
        w.close()
        lsock.close()
        t.join(5)


def test_a_response_cannot_be_read_once_its_connection_is_gone() -> None:
    import http.client

    script = Script([ok(b"x" * 100_000), ok(b"second")], cuts=[200])
    with wire_to(script) as w:
        first = w.request("GET", "a", operation="GetObject")
        first.finish()  # abandoned mid-body: the connection is closed
        second = w.request("GET", "b", operation="GetObject")
        with pytest.raises(http.client.IncompleteRead):  # past what came with its head
            read_all(first)
        assert read_all(second) == b"second"


def test_redirected_requests_drop_the_direct_path_for_that_worker() -> None:
    from kvtier.tiers.obj.clients import WorkerClients, open_object
    from kvtier.tiers.ratelog import RateLimitedLog

    xml = b"<Error><Code>PermanentRedirect</Code></Error>"
    script = Script([b"HTTP/1.1 301 Moved\r\nContent-Length: %d\r\n\r\n%s" % (len(xml), xml)])
    with wire_to(script) as w:

        class Boto:
            closed = False

            def close(self) -> None:
                self.closed = True

        clients = WorkerClients(Boto(), w, "obj0", RateLimitedLog(logging.getLogger("t"), 10))
        assert clients.direct(lambda wire: open_object("k", wire)) is None
        assert clients.wire is None and w.sock is None
        assert clients.direct(lambda wire: open_object("k", wire)) is None  # boto3 from now on


def test_headers_are_signed_lower_case_and_line_breaks_are_refused() -> None:
    ep = Endpoint("http", "::1", 7480, "/bkt/", "us-east-1")
    assert ep.host_header == "[::1]:7480"
    creds = Credentials("AKID", "SECRET", "TOKEN")
    assert "SECRET" not in repr(creds) and "TOKEN" not in repr(creds)
    a = sign("GET", ep, "/bkt/k", {"X-Amz-Meta-A": "v"}, creds, now=1.7e9)
    b = sign("GET", ep, "/bkt/k", {"x-amz-meta-a": "v"}, creds, now=1.7e9)
    assert a == b and a["host"] == "[::1]:7480"
    with pytest.raises(ValueError):
        sign("GET", ep, "/bkt/k", {"x-amz-meta-a": "v\r\nX-Evil: 1"}, creds)


def test_retries_stop_at_a_total_deadline_whatever_retries_says() -> None:
    # Issue 28: a huge retry count against a gateway that keeps failing must still end in bounded
    # time. The wire gives every request RETRY_WINDOW timeouts in all, retries included.
    err = b"HTTP/1.1 502 X\r\nContent-Length: 0\r\n\r\n"
    script = Script([err] * 5000)
    with wire_to(script, timeout=0.4, retries=100_000) as w:
        t0 = time.monotonic()
        with pytest.raises(bx.ClientError):
            w.request("GET", "k", operation="GetObject")
        elapsed = time.monotonic() - t0
    assert elapsed < RETRY_WINDOW * 0.4 + 1.0, f"the request took {elapsed:.1f} s"
    assert 1 < len(script.requests) < 5000  # it did retry, and it stopped


def test_obj_retries_are_range_checked_before_anything_is_built() -> None:
    from kvtier.plugins import check_tier
    from kvtier.tiers.base import TierContext

    ctx = TierContext(name="o", block_bytes=4096)
    with pytest.raises(ConfigError, match=r"secondary_tiers\[0\]\.retries: expected an integer"):
        check_tier({"type": "obj", "bucket": "b", "retries": 100_000}, ctx)
    check_tier({"type": "obj", "bucket": "b", "retries": MAX_RETRIES}, ctx)
