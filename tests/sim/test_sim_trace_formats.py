"""Traces as users have them: gzipped Mooncake, Mooncake hashed at 16-token blocks, Qwen-Bailian
(``chat_id`` / ``parent_chat_id`` / ``turn``, seconds), and a message naming missing fields."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.sim.defaults import shipped_trace
from kvtier.sim.trace import TraceError, guess_block_tokens, read_trace


def _write(path: Path, rows: list[dict[str, object]], *, gz: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_gzipped_mooncake_reads_like_plain(tmp_path: Path) -> None:
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
            {"timestamp": 7, "input_length": 100, "output_length": 5, "hash_ids": [0]}]  # fmt: skip
    plain = read_trace(_write(tmp_path / "t.jsonl", rows))
    # No .gz suffix: gzip is recognised by content.
    packed = read_trace(_write(tmp_path / "t.bin", rows, gz=True))
    assert plain == packed and plain[0].blocks == (0, 1) and plain[1].timestamp_ms == 7.0


def test_qwen_bailian_fields_and_seconds(tmp_path: Path) -> None:
    rows = [
        {"chat_id": 3, "parent_chat_id": -1, "timestamp": 1.5, "input_length": 40, "output_length": 9,
         "type": "text", "turn": 1, "hash_ids": [10, 11, 12]},
        {"chat_id": 4, "parent_chat_id": 3, "timestamp": 61.114, "input_length": 50, "output_length": 2,
         "type": "search", "turn": 2, "hash_ids": [10, 11, 12, 13]},
    ]  # fmt: skip
    a, b = read_trace(_write(tmp_path / "qwen.jsonl", rows))
    assert (a.chat_id, a.parent_chat_id, a.turn, a.type, a.timestamp_ms) == (3, None, 1, "text", 1500.0)
    assert (b.parent_chat_id, b.turn, b.type, b.timestamp_ms) == (3, 2, "search", 61114.0)
    assert guess_block_tokens([a, b]) == 16
    bad = {**rows[0]}
    del bad["turn"]
    with pytest.raises(TraceError, match=r"qwen2.jsonl:1: Qwen-Bailian line \(has 'chat_id'\) lacks 'turn'"):
        read_trace(_write(tmp_path / "qwen2.jsonl", [bad]))


def test_unknown_line_names_missing_fields_per_format(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.jsonl", [{"ts": 1, "ids": [1]}])
    with pytest.raises(TraceError) as info:
        read_trace(path)
    msg = str(info.value)
    assert "x.jsonl:1: not a known trace line" in msg
    assert "Mooncake lacks 'timestamp', 'hash_ids'" in msg
    assert "generic lacks 'timestamp', 'blocks'" in msg
    assert "Qwen-Bailian lacks 'chat_id', 'parent_chat_id', 'turn', 'timestamp', 'hash_ids'" in msg
    with pytest.raises(TraceError, match="Mooncake lacks 'hash_ids'"):
        read_trace(_write(tmp_path / "y.jsonl", [{"timestamp": 1}]))


def rehash_at(requests: list, tokens: int) -> list[dict[str, object]]:  # type: ignore[type-arg]
    """The shipped trace as if hashed at ``tokens``-token blocks: each 512-token block becomes
    ``512 // tokens`` chained sub-blocks (the last block only as many as its tokens need)."""
    sub = 512 // tokens
    out = []
    for r in requests:
        ids: list[int] = []
        for j, b in enumerate(r.blocks):
            n = sub if j < len(r.blocks) - 1 else -(-(r.input_length - j * 512) // tokens)
            ids.extend(b * sub + k for k in range(n))
        out.append({"timestamp": r.timestamp_ms, "input_length": r.input_length, "hash_ids": ids})
    return out


def test_sixteen_token_blocks_are_recognised(tmp_path: Path) -> None:
    with shipped_trace() as p:
        reqs = read_trace(p, limit=300)
    assert guess_block_tokens(reqs) == 512
    small = read_trace(_write(tmp_path / "t16.jsonl.gz", rehash_at(reqs, 16), gz=True))
    assert guess_block_tokens(small) == 16
    assert sum(len(r.blocks) for r in small) > 20 * sum(len(r.blocks) for r in reqs)


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=30), st.sampled_from([16, 64, 512]))
def test_guess_finds_the_block_size_of_consistent_requests(lengths: list[int], tokens: int) -> None:
    from kvtier.sim.trace import TraceRequest

    reqs = [TraceRequest(0.0, tuple(range(-(-n // tokens))), input_length=n) for n in lengths]
    guess = guess_block_tokens(reqs)
    assert guess is not None
    # Every request agrees with the guess (short requests may fit several sizes; the smallest wins).
    assert all(-(-n // guess) == -(-n // tokens) for n in lengths)
    # The size the user gives is kept when it explains the trace as well as any other.
    assert guess_block_tokens(reqs, prefer=tokens) == tokens


def test_tiny_requests_do_not_contradict_the_given_block_size() -> None:
    from kvtier.sim.trace import TraceRequest

    tiny = [TraceRequest(0.0, (i,), input_length=10) for i in range(5)]  # fits every size
    assert guess_block_tokens(tiny) == 16
    assert guess_block_tokens(tiny, prefer=512) == 512
