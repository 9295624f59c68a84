"""Crash safety of the small-block path: a writer process SIGKILLed mid-write, many times, never
leaves a torn or wrong block served, and a restart recovers the index from the segments.

A long-lived observer tier shares the root with the writers (it follows their segments while they
live and after they die); after each kill a fresh tier (a restart) must find every block of the
last batch the writer reported stored, and every block anyone indexes must load byte for byte.
Half the rounds run with ``fsync`` on, which widens the window between a record's data and its
index record (each is synced), so kills land between the two.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import pytest

from kvtier.keys import BlockKey
from kvtier.tiers.fs import FsTier
from kvtier.tiers.fs.segment_index import SEG_DIR, decode_records, parse_name

BLOCK = 4096
SEG = 64 * 1024
ROUNDS = 16
MAX_ROUNDS = 64
OPTIONS = {"small_block_bytes": 65536, "segment_bytes": SEG}


def _check_all(tier: FsTier, primary: h.PrimaryBuffer) -> int:
    """Every indexed block loads with exactly the bytes stored under its key; returns the count."""
    keys = sorted(tier.indexed_keys())
    for i in range(0, len(keys), 16):
        chunk = [BlockKey(k) for k in keys[i : i + 16]]
        res = h.load(tier, primary, chunk)
        assert res.success, res
        for slot, k in enumerate(chunk):
            assert primary.block(slot).tobytes() == h.payload_of(k, BLOCK).tobytes()
    return len(keys)


def _unindexed_tails(seg_dir: str, token_prefix: str) -> int:
    """Segments of a dead writer holding data past their last index record, or a torn index tail:
    evidence that a kill landed mid-write."""
    n = 0
    for name in os.listdir(seg_dir):
        parsed = parse_name(name)
        if parsed is None or parsed[1] != "idx" or not parsed[0].token.startswith(token_prefix):
            continue
        raw = Path(seg_dir, name).read_bytes()
        recs, used = decode_records(raw)
        end = max((r.offset + r.length for r in recs if r.key), default=0)
        dat = os.path.join(seg_dir, parsed[0].dat)
        if used < len(raw) or (os.path.exists(dat) and os.path.getsize(dat) > end):
            n += 1
    return n


@pytest.mark.slow
def test_sigkill_mid_write_never_serves_torn_blocks_and_the_index_recovers(tmp_path: Path) -> None:
    rng = random.Random(11)
    root = tmp_path / "root"
    primary = h.aligned_primary(16, BLOCK)
    observer = h.make_tier(primary, root, **OPTIONS)
    seg_dir = os.path.join(observer.layout.ns_dir, SEG_DIR)
    max_bytes = 12 * SEG  # small: writers roll segments and compact (live blocks copied) often
    mid_write = 0
    try:
        # ROUNDS kills, and more (up to MAX_ROUNDS) until one lands between a record's data and its
        # index record: where the kill falls depends on the machine's speed and load.
        rnd = -1
        while (rnd := rnd + 1) < ROUNDS or (mid_write == 0 and rnd < MAX_ROUNDS):
            fsync = rnd % 2 == 1
            args = {"root": str(root), "block_bytes": BLOCK, "max_bytes": max_bytes, "batch": 8,
                    "prefix": f"r{rnd}", "out": str(tmp_path / f"out{rnd}.json"),
                    "options": {**OPTIONS, "fsync": fsync}}  # fmt: skip
            proc = subprocess.Popen(h.spawn_args("writer", args), stdout=subprocess.PIPE, text=True)
            done = 0
            try:
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == "ready"
                for _ in range(rng.randint(2, 10)):
                    done = int(proc.stdout.readline().split()[1])
                # Land anywhere inside the next batch (with fsync a chunk takes two ~4 ms syncs).
                time.sleep(rng.uniform(0.001, 0.008) if fsync else rng.uniform(0.0, 0.002))
                proc.send_signal(signal.SIGKILL)
            finally:
                proc.wait(timeout=30)
                if proc.stdout is not None:
                    proc.stdout.close()
            assert proc.returncode == -signal.SIGKILL
            mid_write += _unindexed_tails(seg_dir, str(proc.pid)) > 0
            # The observer, alive throughout, serves only whole, verified blocks.
            observer.refresh()
            _check_all(observer, primary)
            # A restart recovers the index from the segments: the last batch the writer reported
            # stored is there (newest blocks: not evicted), and everything indexed is intact.
            last = [h.key_of(f"r{rnd}-{j}") for j in range(done - 8, done)]
            again = h.make_tier(primary, root, max_bytes=max_bytes, **OPTIONS)
            try:
                assert set(last) <= again.indexed_keys(), f"round {rnd}: the last stored batch is lost"
                assert _check_all(again, primary) >= len(last)
                assert again.stats.corrupt == 0
                assert again.segments is not None and again.segments.usage_bytes() <= max_bytes
            finally:
                again.shutdown()
        assert observer.stats.corrupt == 0
    finally:
        observer.shutdown()
    print(f"kills that left data without an index record: {mid_write}/{rnd}")
    assert mid_write >= 1, "no kill landed between a record's data and its index record"
