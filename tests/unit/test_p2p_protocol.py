"""The p2p wire format: round trips, and any byte string decodes or raises ProtocolError only."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import ConfigError
from kvtier.tiers.p2p import protocol as P

keys_st = st.lists(st.binary(min_size=1, max_size=P.MAX_KEY_BYTES), max_size=64)


@given(keys_st)
def test_key_lists_round_trip(keys: list[bytes]) -> None:
    assert P.decode_keys(P.encode_keys(keys)) == keys


@given(
    st.integers(1, 1 << 40), st.text(max_size=80), st.text(max_size=80), st.binary(min_size=32, max_size=32)
)
def test_hello_round_trips(bb: int, layout: str, ns: str, nonce: bytes) -> None:
    hello = P.Hello(P.PROTOCOL_VERSION, bb, layout, ns, nonce)
    assert P.decode_hello(P.encode_hello(hello)) == hello


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2**64 - 1)), max_size=50))
def test_fetch_reply_round_trips(entries: list[tuple[bool, int]]) -> None:
    assert P.decode_fetch_reply(P.encode_fetch_reply(entries), len(entries)) == entries


@given(st.binary(max_size=600))
def test_garbage_payloads_raise_protocol_error_only(buf: bytes) -> None:
    for decode in (P.decode_keys, P.decode_hello, lambda b: P.decode_fetch_reply(b, 3)):
        with contextlib.suppress(P.ProtocolError):
            decode(buf)


@given(st.binary(min_size=P.HEADER.size, max_size=P.HEADER.size))
def test_garbage_headers_raise_protocol_error_only(head: bytes) -> None:
    try:
        ftype, _, _, length = P.parse_header(head)
    except P.ProtocolError:
        return
    assert ftype in {int(t) for t in P.FrameType} and length <= P.MAX_CONTROL_BYTES


def test_oversized_frames_and_key_lists_are_refused() -> None:
    head = P.HEADER.pack(P.MAGIC, P.PROTOCOL_VERSION, P.FrameType.LOOKUP, 0, 1, P.MAX_CONTROL_BYTES + 1)
    with pytest.raises(P.ProtocolError, match="exceeds the limit"):
        P.parse_header(head)
    with pytest.raises(P.ProtocolError, match="limit"):
        P.encode_keys([b"k"] * (P.MAX_KEYS + 1))
    with pytest.raises(P.ProtocolError, match="limit"):
        P.decode_keys((P.MAX_KEYS + 1).to_bytes(4, "little"))


def test_hello_mismatch_names_what_differs() -> None:
    hello = P.Hello(P.PROTOCOL_VERSION, 4096, "L", "ns", b"\0" * 32)
    assert hello.mismatch(4096, "L", "ns") is None
    assert "block_bytes 4096" in (hello.mismatch(8192, "L", "ns") or "")
    assert "layout" in (hello.mismatch(4096, "M", "ns") or "")
    assert "namespace" in (hello.mismatch(4096, "L", "other") or "")
    old = P.Hello(0, 4096, "L", "ns", b"\0" * 32)
    assert "protocol version 0" in (old.mismatch(4096, "L", "ns") or "")


def test_macs_bind_role_nonces_and_hello() -> None:
    base = P.auth_mac(b"s", b"client", b"hello", b"a" * 32, b"b" * 32)
    assert base != P.auth_mac(b"s", b"server", b"hello", b"a" * 32, b"b" * 32)
    assert base != P.auth_mac(b"s", b"client", b"hellp", b"a" * 32, b"b" * 32)
    assert base != P.auth_mac(b"s", b"client", b"hello", b"a" * 32, b"c" * 32)
    assert base != P.auth_mac(b"t", b"client", b"hello", b"a" * 32, b"b" * 32)


def test_secret_from_env_and_0600_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVTIER_TEST_SECRET", "from-env")
    assert P.load_secret(secret_env="KVTIER_TEST_SECRET") == b"from-env"
    f = tmp_path / "secret"
    f.write_text("from-file\n")
    os.chmod(f, 0o644)
    with pytest.raises(ConfigError, match="chmod 600") as info:
        P.load_secret(secret_file=str(f))
    assert "from-file" not in str(info.value)  # the secret is never in a message
    os.chmod(f, stat.S_IRUSR | stat.S_IWUSR)
    assert P.load_secret(secret_file=str(f)) == b"from-file"
    with pytest.raises(ConfigError, match="not set"):
        P.load_secret(secret_env="KVTIER_TEST_SECRET_UNSET")
    with pytest.raises(ConfigError, match="shared secret"):
        P.load_secret()
    with pytest.raises(ConfigError, match="not both"):
        P.load_secret(secret_env="KVTIER_TEST_SECRET", secret_file=str(f))
