"""Trace reader (Mooncake + generic JSONL, gzip, errors) and Belady/OPT."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from kvtier.sim.opt import infinite_hit_ratio, next_use, opt_hit_ratio, opt_hits
from kvtier.sim.trace import TraceError, flatten, iter_trace, read_trace, unique_blocks

TRACE = Path("/work/shared/traces/conversation_trace.jsonl")
if not TRACE.is_file():
    TRACE = Path(__file__).parents[2] / "src" / "kvtier" / "data" / "conversation_trace.jsonl.gz"


def _write(path: Path, lines: list[str], gz: bool = False) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_mooncake_and_generic_lines_gzip_transparent(tmp_path: Path) -> None:
    lines = [
        json.dumps({"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}),
        "",
        json.dumps({"timestamp": 2.5, "blocks": [0, 7, 8], "tenant": "acme"}),
    ]
    for gz, name in ((False, "t.jsonl"), (True, "t.data")):  # gzip detected by magic, not name
        reqs = read_trace(_write(tmp_path / name, lines, gz))
        assert [r.blocks for r in reqs] == [(0, 1), (0, 7, 8)]
        assert reqs[0].input_length == 1000 and reqs[0].tenant is None
        assert reqs[1].tenant == "acme" and reqs[1].timestamp_ms == 2.5 and reqs[1].input_length is None
        assert flatten(reqs).tolist() == [0, 1, 0, 7, 8]
        assert unique_blocks(reqs) == 4
    assert len(list(iter_trace(tmp_path / "t.jsonl", limit=1))) == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"timestamp": 1}', "Mooncake lacks 'hash_ids'; generic lacks 'blocks'"),
        ('{"timestamp": "x", "blocks": []}', "timestamp"),
        ('{"timestamp": 1, "blocks": [1, -2]}', "block ids"),
        ('{"timestamp": 1, "hash_ids": "abc"}', "list of integers"),
        ('{"timestamp": 1, "blocks": [1], "tenant": 3}', "tenant"),
        ('{"timestamp": 1, "hash_ids": [1], "input_length": -1}', "input_length"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = _write(tmp_path / "bad.jsonl", ['{"timestamp": 0, "hash_ids": [1]}', line])
    with pytest.raises(TraceError, match=message) as info:
        read_trace(path)
    text = str(info.value)
    assert text.startswith(f"{path}:2: ") and "\n" not in text


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not found"):
        read_trace(tmp_path / "nope.jsonl")


def test_next_use() -> None:
    assert next_use([5, 1, 5, 5, 2, 1]).tolist() == [2, 5, 3, 6, 6, 6]
    assert next_use([]).tolist() == []


def _brute_opt(seq: list[int], cap: int) -> int:
    cache: set[int] = set()
    hits = 0
    for i, x in enumerate(seq):
        if x in cache:
            hits += 1
            continue
        if len(cache) >= cap:

            def nxt(y: int, i: int = i) -> int:
                rest = seq[i + 1 :]
                return rest.index(y) if y in rest else len(seq)

            cache.remove(max(sorted(cache), key=nxt))
        cache.add(x)
    return hits


def test_opt_matches_brute_force() -> None:
    rng = np.random.default_rng(1)
    for _ in range(30):
        seq = rng.integers(0, 12, size=80).tolist()
        for cap in (1, 3, 6):
            assert opt_hits(seq, cap) == _brute_opt(seq, cap)


def test_opt_reference_numbers_on_conversation_trace() -> None:
    flat = flatten(read_trace(TRACE))
    assert flat.size == 288_500 and unique_blocks(flat) == 182_790
    assert round(opt_hit_ratio(flat, 1827) * 100, 2) == 24.63
    assert round(infinite_hit_ratio(flat) * 100, 2) == 36.64
    with pytest.raises(ValueError, match="capacity"):
        opt_hits(flat, 0)
