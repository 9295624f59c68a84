"""The small-block path's on-disk index format: records round-trip, a truncated or damaged tail
yields exactly the records before it, and only names of the fixed segment shape parse."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.tiers.fs.segment_index import (
    SEAL,
    IndexRecord,
    SegmentName,
    decode_records,
    encode_record,
    idx_bytes,
    parse_name,
)

records = st.builds(
    IndexRecord,
    key=st.binary(min_size=1, max_size=120),
    offset=st.integers(0, (1 << 63) - 1),
    length=st.integers(0, 0xFFFFFFFF),
)
streams = st.lists(st.one_of(records, st.just(SEAL)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(recs=streams)
def test_records_round_trip(recs: list[IndexRecord]) -> None:
    data = b"".join(encode_record(r) for r in recs)
    assert sum(idx_bytes(len(r.key)) for r in recs) == len(data)
    assert decode_records(data) == (recs, len(data))


@settings(max_examples=200, deadline=None)
@given(recs=streams, data=st.data())
def test_a_truncated_tail_recovers_the_whole_records_before_it(
    recs: list[IndexRecord], data: st.DataObject
) -> None:
    blobs = [encode_record(r) for r in recs]
    whole = b"".join(blobs)
    cut = data.draw(st.integers(0, len(whole)))
    got, used = decode_records(whole[:cut])
    ends = [sum(len(b) for b in blobs[: i + 1]) for i in range(len(blobs))]
    complete = sum(1 for e in ends if e <= cut)
    assert got == recs[:complete]
    assert used == (ends[complete - 1] if complete else 0)
    # A reader that resumes from ``used`` once the rest arrived sees the remaining records.
    assert decode_records(whole[used:])[0] == recs[complete:]


@settings(max_examples=200, deadline=None)
@given(recs=st.lists(records, min_size=1, max_size=8), data=st.data())
def test_a_damaged_record_ends_what_is_trusted(recs: list[IndexRecord], data: st.DataObject) -> None:
    blobs = [encode_record(r) for r in recs]
    whole = bytearray(b"".join(blobs))
    bit = data.draw(st.integers(0, len(whole) * 8 - 1))
    whole[bit // 8] ^= 1 << (bit % 8)
    hit = next(i for i in range(len(blobs)) if sum(len(b) for b in blobs[: i + 1]) * 8 > bit)
    got, used = decode_records(whole)
    assert got == recs[:hit]  # nothing from the damaged record on is served
    assert used == sum(len(b) for b in blobs[:hit])


def test_out_of_range_records_are_refused() -> None:
    with pytest.raises(ValueError, match="out of range"):
        encode_record(IndexRecord(b"k", 0, 1 << 32))
    with pytest.raises(ValueError, match="out of range"):
        encode_record(IndexRecord(b"k" * 0x10000, 0, 1))


@settings(max_examples=100, deadline=None)
@given(seq=st.integers(0, 10**12 - 1), cap=st.integers(1, 10**15 - 1), pid=st.integers(0, 10**10 - 1))
def test_segment_names_round_trip(seq: int, cap: int, pid: int) -> None:
    name = SegmentName(seq, f"{pid}-0123abcd", cap)
    assert parse_name(name.dat) == (name, "dat")
    assert parse_name(name.idx) == (name, "idx")


@pytest.mark.parametrize(
    "bad",
    ["x.0.1.dat", "1-0123abcd.0.1.tmp", "1-0123abcd.0.0.dat", "1-0123ABCD.0.1.dat", "../1-0123abcd.0.1.dat",
     "1-0123abcd.0.1.dat/", "1-0123abcd..1.dat", ".1-0123abcd.0.1.idx", "1-0123abcd.0.1.idx.lnk"],
)  # fmt: skip
def test_foreign_names_do_not_parse(bad: str) -> None:
    assert parse_name(bad) is None
