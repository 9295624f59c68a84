"""Malformed traces (issue 17): every bad line is a one-line ``TraceError`` naming the file and its
real line number, never an ``OverflowError``, a wrong line number, a silently accepted ``NaN``, or
a reader that swallows a whole 1 GB line.

Real files (plain and gzip); the fuzz test feeds Hypothesis-generated lines to the real reader.
"""

from __future__ import annotations

import gzip
import json
import resource
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.sim.trace import MAX_ID, MAX_LINE_BYTES, TraceError, flatten, read_trace

GOOD = json.dumps({"timestamp": 0, "hash_ids": [1, 2, 3]})


def _file(tmp_path: Path, lines: list[bytes], *, gz: bool = False, name: str = "t.jsonl") -> Path:
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize(
    "field", ["hash_ids", "blocks", "chat_id"], ids=["mooncake-id", "generic-id", "bailian-chat-id"]
)
def test_ids_outside_int64_are_refused_with_file_and_line(tmp_path: Path, gz: bool, field: str) -> None:
    """An id of 2**63 used to pass the reader and fail in ``flatten`` with a bare OverflowError."""
    row: dict[str, object] = {"timestamp": 0, "hash_ids": [1]}
    if field == "blocks":
        row = {"timestamp": 0, "blocks": [MAX_ID + 1]}
    elif field == "chat_id":
        row.update(chat_id=MAX_ID + 1, parent_chat_id=-1, turn=1)
    else:
        row["hash_ids"] = [1, MAX_ID + 1]
    path = _file(tmp_path, [GOOD.encode(), json.dumps(row).encode()], gz=gz)
    with pytest.raises(TraceError, match=rf"^{path}:2: .*2\*\*63-1"):
        read_trace(path)
    # The largest id is fine and fits the simulator's int64 arrays.
    ok = _file(tmp_path, [json.dumps({"timestamp": 0, "hash_ids": [MAX_ID]}).encode()], name="ok.jsonl")
    assert int(flatten(read_trace(ok))[0]) == MAX_ID


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_non_utf8_byte_on_line_2_is_reported_on_line_2(tmp_path: Path, gz: bool) -> None:
    """The text decoder read ahead, so the error was reported on line 1."""
    bad = b'{"timestamp": 0, "hash_ids": [1], "tenant": "\xff"}'
    path = _file(tmp_path, [GOOD.encode(), bad, GOOD.encode()], gz=gz)
    with pytest.raises(TraceError, match=rf"^{path}:2: not UTF-8"):
        read_trace(path)


@pytest.mark.parametrize("ts", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_timestamps_are_refused(tmp_path: Path, ts: str) -> None:
    """Python's json accepts NaN and Infinity; they were taken as arrival times."""
    path = _file(tmp_path, [GOOD.encode(), f'{{"timestamp": {ts}, "hash_ids": [1]}}'.encode()])
    with pytest.raises(TraceError, match=rf"^{path}:2: field 'timestamp' must be a finite"):
        read_trace(path)


def test_a_line_over_the_cap_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    """A 1 GB line cost 2.1 GB; now at most MAX_LINE_BYTES are read. The test line is 4x the cap
    (64 MiB): peak memory must stay well under what reading it whole would cost."""
    path = tmp_path / "long.jsonl"
    with path.open("wb") as f:
        f.write(GOOD.encode() + b"\n")
        f.write(b'{"timestamp": 0, "hash_ids": [' + b"1, " * (4 * MAX_LINE_BYTES // 3) + b"1]}\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with pytest.raises(TraceError, match=rf"^{path}:2: line longer than {MAX_LINE_BYTES} bytes"):
        read_trace(path)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < 3 * MAX_LINE_BYTES, grown
    # A line of exactly the cap (plus its newline) is read.
    exact = tmp_path / "exact.jsonl"
    head = b'{"timestamp": 0, "hash_ids": [1], "tenant": "'
    exact.write_bytes(head + b"a" * (MAX_LINE_BYTES - len(head) - 2) + b'"}\n')
    assert len(read_trace(exact)) == 1


def test_deep_nesting_in_a_line_is_a_trace_error(tmp_path: Path) -> None:
    path = _file(tmp_path, [GOOD.encode(), b"[" * 100_000 + b"]" * 100_000])
    with pytest.raises(TraceError, match=rf"^{path}:2: invalid JSON"):
        read_trace(path)


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
_values = st.recursive(
    _scalars,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=12,
)
_fields = st.sampled_from(
    [
        "timestamp",
        "hash_ids",
        "blocks",
        "tenant",
        "input_length",
        "output_length",
        "chat_id",
        "parent_chat_id",
        "turn",
        "type",
    ]
)
_objects = st.dictionaries(_fields, _values, max_size=8)
_lines = st.one_of(
    _objects.map(lambda o: json.dumps(o).encode()),
    st.binary(max_size=40),
    _objects.map(lambda o: json.dumps(o).encode()[:-1]),  # truncated
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_lines, min_size=1, max_size=5), gz=st.booleans())
def test_fuzzed_trace_lines_end_in_requests_or_a_trace_error(
    tmp_path: Path, lines: list[bytes], gz: bool
) -> None:
    """Whatever the lines hold, the reader returns requests (ids that flatten to int64, finite
    timestamps) or raises TraceError naming the file; never another exception."""
    path = _file(tmp_path, [ln.replace(b"\n", b" ") for ln in lines], gz=gz, name="fuzz.jsonl")
    try:
        requests = read_trace(path)
    except TraceError as exc:
        assert str(exc).startswith(f"{path}:") and "\n" not in str(exc)
        return
    for r in requests:
        assert r.timestamp_ms == r.timestamp_ms and abs(r.timestamp_ms) != float("inf")
    flatten(requests)
