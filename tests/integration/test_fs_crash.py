"""Crash safety: a writer process SIGKILLed mid-batch, many times, never leaves a wrong byte or a
wrong byte count behind.

A long-lived observer tier shares the root_dir with the writers, so accounting must be exact both
*while another process keeps running* (journal recovery of the dead writer) and after a clean
restart (the alone-after-scan reconcile).
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import pytest

from kvtier.keys import BlockKey

BLOCK = 64 * 1024
ROUNDS = 12


@pytest.mark.slow
def test_sigkill_mid_batch_never_serves_wrong_bytes_and_keeps_exact_accounting(tmp_path: Path) -> None:
    rng = random.Random(5)
    root = tmp_path / "root"
    primary = h.aligned_primary(16, BLOCK)
    observer = h.make_tier(primary, root)
    ns_dir = observer.layout.ns_dir
    file_size = observer.layout.file_size(16)
    max_bytes = 40 * file_size  # small: the writers evict, so unlink journaling is exercised too
    killed_mid_batch = 0
    for rnd in range(ROUNDS):
        args = {"root": str(root), "block_bytes": BLOCK, "max_bytes": max_bytes, "batch": 8,
                "prefix": f"r{rnd}", "out": str(tmp_path / f"out{rnd}.json")}  # fmt: skip
        proc = subprocess.Popen(h.spawn_args("writer", args), stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            for _ in range(rng.randint(1, 4)):
                proc.stdout.readline()
            time.sleep(rng.uniform(0.0, 0.02))  # land anywhere inside the next batch
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        # Evidence the kill landed inside a batch: the dead writer still holds a reservation, an
        # intent, or a temp file.
        raw = observer.usage(recover=False)
        dead = [p for t, p in raw.procs.items() if t != observer.accounting.token]
        if any(p["reserved"] or p["intent"] for p in dead) or h.temp_files(ns_dir):
            killed_mid_batch += 1
        # While the observer stays alive: the dead writer's half-done section is undone, its
        # reservation dropped and its temp files removed; totals equal the bytes in the tree.
        st = observer.usage()
        assert set(st.procs) == {observer.accounting.token}
        assert st.reserved == 0
        blocks = h.block_files(ns_dir)
        assert st.published == sum(blocks.values()), f"round {rnd}"
        assert st.published <= max_bytes
        assert not h.temp_files(ns_dir), "temp files of the dead writer remain"
    observer.shutdown()
    print(f"kills inside a batch: {killed_mid_batch}/{ROUNDS}")
    assert killed_mid_batch >= ROUNDS // 4, f"only {killed_mid_batch} of {ROUNDS} kills landed mid-batch"

    # Clean restart: every indexed block loads with exactly the bytes stored under its key.
    tier = h.make_tier(primary, root, max_bytes=max_bytes)
    try:
        assert tier.wait_scan(30)
        keys = sorted(tier.indexed_keys())
        assert keys, "the writers stored nothing"
        on_disk = h.block_files(ns_dir)
        assert len(keys) == len(on_disk)
        for i in range(0, len(keys), 16):
            chunk = [BlockKey(k) for k in keys[i : i + 16]]
            res = h.load(tier, primary, chunk)
            assert res.success, res
            for slot, k in enumerate(chunk):
                assert primary.block(slot).tobytes() == h.payload_of(k, BLOCK).tobytes()
        assert tier.stats.corrupt == 0
        st = tier.usage()
        assert st.published == sum(h.block_files(ns_dir).values())
    finally:
        tier.shutdown()
