"""``kvtier.integrations.buffer_tier``: the tier-over-an-engine-buffer runner both engine adapters
use, on real tiers (``example``, ``fs``) and out-of-tree ones loaded by ``module_path``
(``buffer_tier_probe.py``). Runs without SGLang or LMCache."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.integrations.buffer_tier import BufferTier
from kvtier.keys import BlockKey, make_namespace

ROW = 4096
NS = make_namespace("test", block_size=1)


def keys(n: int, tag: str = "k") -> list[BlockKey]:
    return [NS.wrap_engine_hash(f"{tag}{i}".encode()) for i in range(n)]


def runner(tier: dict[str, object], rows: np.ndarray, deadline: float = 5.0) -> BufferTier:
    return BufferTier(tier, rows=rows.data, namespace=NS.root.hex(), deadline=deadline)


def test_fs_round_trip_is_byte_exact_and_in_place(tmp_path: Path) -> None:
    buf = np.random.default_rng(1).integers(0, 256, (16, ROW), dtype=np.uint8)
    want = buf[:4].copy()
    bt = runner({"type": "fs", "root_dir": str(tmp_path)}, buf)
    ks = keys(4)
    assert bt.run(ks, [0, 1, 2, 3], load=False) == frozenset(ks)
    assert bt.exists([*ks, *keys(1, "other")]) == [True] * 4 + [False]
    assert bt.run(ks, [8, 9, 10, 11], load=True) == frozenset(ks)
    assert np.array_equal(buf[8:12], want)  # written into the caller's own rows
    s = bt.stats()
    assert s["stored_blocks"] == 4 and s["loaded_blocks"] == 4 and s["bytes_read"] == 4 * ROW
    bt.close()


def test_exists_stop_at_miss_answers_false_after_the_first_miss() -> None:
    buf = np.zeros((8, ROW), dtype=np.uint8)
    bt = runner({"type": "example"}, buf)
    ks = keys(4)
    bt.run([ks[0], ks[2]], [0, 1], load=False)
    assert bt.exists(ks, stop_at_miss=True) == [True, False, False, False]
    assert bt.exists(ks) == [True, False, True, False]
    bt.close()


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.lists(st.integers(0, 7), min_size=0, max_size=6, unique=True)),
        max_size=12,
    )
)
def test_every_job_completes_exactly_once(ops: list[tuple[bool, list[int]]]) -> None:
    buf = np.random.default_rng(2).integers(0, 256, (8, ROW), dtype=np.uint8)
    bt = runner({"type": "example"}, buf)
    ks = keys(8)
    calls: dict[int, int] = {}
    lock = threading.Lock()
    for n, (load, idx) in enumerate(ops):

        def done(ok: frozenset[BlockKey], n: int = n, idx: list[int] = idx) -> None:
            assert ok <= {ks[i] for i in idx}
            with lock:
                calls[n] = calls.get(n, 0) + 1

        bt.submit([ks[i] for i in idx], idx, load=load, done=done)
    end = time.monotonic() + 10
    while len(calls) < len(ops) and time.monotonic() < end:
        time.sleep(0.001)
    bt.close()
    assert calls == {n: 1 for n in range(len(ops))}


def test_a_job_past_the_deadline_is_drained_then_reported_failed_once() -> None:
    buf = np.zeros((4, ROW), dtype=np.uint8)
    bt = runner({"type": "HeldTier", "module_path": "buffer_tier_probe"}, buf, deadline=0.2)
    t0 = time.monotonic()
    # The held tier reports the job successful only when drained: the caller gets it then, once.
    assert bt.run(keys(2), [0, 1], load=True) == frozenset(keys(2))
    assert time.monotonic() - t0 < 2
    assert bt.stats()["timed_out_jobs"] == 1
    assert bt.exists(keys(1)) == [False]  # RETRY until the deadline: a miss
    bt.close()


def test_a_broken_plugin_tier_means_failures_never_exceptions() -> None:
    buf = np.zeros((4, ROW), dtype=np.uint8)
    bt = runner({"type": "FaultyTier", "module_path": "buffer_tier_probe"}, buf, deadline=0.5)
    got: list[frozenset[BlockKey]] = []
    bt.submit(keys(2), [0, 1], load=False, done=got.append)
    assert got == [frozenset()]
    assert bt.run(keys(2), [0, 1], load=True) == frozenset()
    assert bt.exists(keys(2)) == [False, False]
    assert bt.stats()["failed_blocks"] == 4
    bt.close()
    bt.close()  # idempotent


def test_close_reports_pending_jobs_as_failed_once() -> None:
    buf = np.zeros((4, ROW), dtype=np.uint8)
    bt = runner({"type": "HeldTier", "module_path": "buffer_tier_probe"}, buf)
    got: list[frozenset[BlockKey]] = []
    bt.submit(keys(2), [0, 1], load=False, done=got.append)
    bt.close()  # the held tier's shutdown drains: the job is reported through the poller, once
    assert len(got) == 1
    after: list[frozenset[BlockKey]] = []
    bt.submit(keys(1), [2], load=False, done=after.append)
    assert after == [frozenset()]  # submitted after close: failed at once
