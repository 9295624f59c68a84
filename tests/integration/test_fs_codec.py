"""The block codec: round trips, and every damaged, truncated or foreign blob is rejected."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import codec
from kvtier.codec import CorruptBlockError

NS = codec.namespace_tag("model-a")


@settings(max_examples=100, deadline=None)
@given(
    key=st.binary(min_size=0, max_size=80),
    payload=st.binary(max_size=3000),
    align=st.sampled_from([1, 8, 4096]),
)
def test_round_trip(key: bytes, payload: bytes, align: int) -> None:
    blob = codec.encode(key, payload, ns_tag=NS, align=align)
    assert len(blob) == codec.header_size(len(key), align) + len(payload)
    assert bytes(codec.decode(blob, key=key, ns_tag=NS)) == payload


@settings(max_examples=150, deadline=None)
@given(
    key=st.binary(min_size=1, max_size=40),
    payload=st.binary(min_size=1, max_size=2000),
    data=st.data(),
)
def test_any_bit_flip_is_detected(key: bytes, payload: bytes, data: st.DataObject) -> None:
    blob = bytearray(codec.encode(key, payload, ns_tag=NS))
    bit = data.draw(st.integers(0, len(blob) * 8 - 1))
    blob[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(CorruptBlockError):
        codec.decode(blob, key=key, ns_tag=NS)


@settings(max_examples=100, deadline=None)
@given(payload=st.binary(min_size=1, max_size=2000), data=st.data())
def test_truncated_or_extended_is_detected(payload: bytes, data: st.DataObject) -> None:
    blob = codec.encode(b"k", payload, ns_tag=NS, align=64)
    cut = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(CorruptBlockError):
        codec.decode(blob[:cut], key=b"k", ns_tag=NS)
    with pytest.raises(CorruptBlockError):
        codec.decode(blob + b"\0", key=b"k", ns_tag=NS)


def test_foreign_key_and_namespace_are_detected() -> None:
    blob = codec.encode(b"key-1", b"x" * 100, ns_tag=NS)
    with pytest.raises(CorruptBlockError) as exc:
        codec.decode(blob, key=b"key-2", ns_tag=NS)
    assert exc.value.reason == "key"
    with pytest.raises(CorruptBlockError) as exc:
        codec.decode(blob, key=b"key-1", ns_tag=codec.namespace_tag("model-b"))
    assert exc.value.reason == "namespace"


def test_swapped_payload_with_valid_header_is_detected() -> None:
    a = codec.encode(b"a", b"1" * 64, ns_tag=NS)
    b = codec.encode(b"b", b"2" * 64, ns_tag=NS)
    head_a = codec.header_size(1)
    forged = a[:head_a] + b[head_a:]
    with pytest.raises(CorruptBlockError) as exc:
        codec.decode(forged, key=b"a", ns_tag=NS)
    assert exc.value.reason == "checksum"
    # verify=False skips only the payload pass: the header is still checked.
    assert bytes(codec.decode(forged, key=b"a", ns_tag=NS, verify=False)) == b"2" * 64


@pytest.mark.parametrize("blob", [b"", b"KVTB", b"\0" * 100, b"random garbage" * 10])
def test_garbage_is_rejected(blob: bytes) -> None:
    with pytest.raises(CorruptBlockError):
        codec.decode(blob, key=b"k", ns_tag=NS)


@settings(max_examples=100, deadline=None)
@given(
    key=st.binary(min_size=0, max_size=300),
    payload=st.binary(max_size=5000),
    ns=st.integers(0, 2**64 - 1),
    align=st.sampled_from([1, 8, 64, 4096]),
)
def test_header_maker_writes_the_same_header_as_encode_header(
    key: bytes, payload: bytes, ns: int, align: int
) -> None:
    maker = codec.HeaderMaker(ns, len(payload), align)
    for _ in range(2):  # the second call reuses the padding of this key length
        made = maker(key, memoryview(payload))
        assert made == codec.encode_header(
            key, len(payload), codec.payload_checksum(key, ns, payload), ns, align
        )
        assert bytes(codec.decode(made + payload, key=key, ns_tag=ns)) == payload
