"""The fs tier over several roots (``root_dirs``): the tier contract, blocks spread over three roots
and found by a second process, a warm restart with a root added and one removed, per-root limits,
and exact per-root accounting after SIGKILLs mid-store. Real directories, files and processes."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import numpy as np
import pytest

from kvtier.errors import ConfigError
from kvtier.jobs import TransferJob
from kvtier.keys import LookupResult
from kvtier.testing import PrimaryBuffer, TierContractTests
from kvtier.testing.primary import wait_for_jobs
from kvtier.tiers.base import SecondaryTier, TierContext
from kvtier.tiers.fs import FsTier
from kvtier.tiers.fs.striped import StripedFsTier
from kvtier.transfer.workers import Priority

BLOCK = 64 * 1024


class TestStripedContract(TierContractTests):
    """The whole secondary-tier contract on a tier striped over three directories."""

    def make_tier(self, primary: PrimaryBuffer, workdir: Path) -> SecondaryTier:
        return FsTier(
            primary_kv_view=primary.view, context=primary.context("fs"),
            root_dirs=[str(workdir / "a"), str(workdir / "b"), {"path": str(workdir / "c")}],
            small_block_bytes=0,
        )  # fmt: skip


def _roots_of(tier: StripedFsTier) -> list[set[bytes]]:
    return [{bytes(k) for k in t.indexed_keys()} for t in tier.roots]


def test_blocks_spread_over_three_roots_and_a_second_process_finds_them(tmp_path: Path) -> None:
    roots = [tmp_path / n for n in ("a", "b", "c")]
    primary = h.aligned_primary(30, BLOCK)
    tier = h.make_striped(primary, roots)
    assert isinstance(tier, StripedFsTier)
    names = [f"spread-{i}" for i in range(90)]
    for i in range(0, 90, 30):
        assert h.store(tier, primary, [h.key_of(n) for n in names[i : i + 30]]).success
    per_root = [len(h.block_files(t.layout.ns_dir)) for t in tier.roots]
    assert sum(per_root) == 90
    # Rendezvous placement over equal roots: each gets a fair share (binomial(90, 1/3): 30 +- 4.5).
    # Placement by key hash, but a burst spills from a busy root to its second choice (by design),
    # so a loaded machine skews the split: every root still gets a share.
    assert all(5 <= n <= 60 for n in per_root), per_root
    stats = tier.get_stats()
    assert [stats[f"root{i}_index_blocks"] for i in range(3)] == per_root
    lat = tier.latency()  # per-root job-latency histograms: one entry per sub-job, cumulative buckets
    assert sum(h["count"] for h in lat.values()) >= 3 and all(h["count"] for h in lat.values())
    for h_ in lat.values():
        counts = [n for _, n in h_["buckets"]]
        assert counts == sorted(counts) and counts[-1] <= h_["count"] and h_["sum"] > 0
    tier.shutdown()
    out = tmp_path / "reader.json"
    args = {"roots": [str(r) for r in roots], "block_bytes": BLOCK, "names": names, "out": str(out)}
    subprocess.run(h.spawn_args("reader", args), check=True, timeout=120)
    got = json.loads(out.read_text())
    assert got["hits"] == [str(LookupResult.HIT)] * 90
    assert got["good"] == names  # every block, with the bytes stored, from the right root


def test_a_burst_spills_from_a_busy_root_and_every_block_is_found(tmp_path: Path) -> None:
    """One-block store jobs whose root has a round of work queued beyond the runner-up's go to the
    runner-up (and are found there); jobs submitted one at a time go to their placement root."""
    primary = h.aligned_primary(24, BLOCK)
    tier = h.make_striped(primary, [tmp_path / "a", tmp_path / "b"], threads=2)
    try:
        both = [0, 1]
        to_a = [
            k
            for k in (h.key_of(f"burst-{i}") for i in range(200))
            if tier.placement.choose(bytes(k), both) == 0
        ]
        calm, burst = to_a[:4], to_a[4:24]
        for k in calm:  # one at a time: nothing queued, pure placement
            assert h.store(tier, primary, [k]).success
        assert {bytes(k) for k in calm} <= {bytes(k) for k in tier.roots[0].indexed_keys()}
        gate = threading.Event()
        for _ in range(2):  # root a's two workers are held: its jobs queue up
            tier.roots[0].run_on_worker(Priority.STORE, gate.wait)
        ids = []
        for slot, k in enumerate(burst):
            primary.block(slot)[:] = h.payload_of(k, BLOCK)
            ids.append(90_000 + slot)
            tier.submit_store(TransferJob(ids[-1], [k], np.array([slot], dtype=np.int32)))
        # Root a took its threads' worth (2) before b's share began; b took most of the rest.
        assert tier._queued[0] <= tier._queued[1] + 2 + 1 and tier._queued[1] >= 8, tier._queued
        gate.set()
        assert all(r.success for r in wait_for_jobs(tier, ids, timeout=60).values())
        on_b = {bytes(k) for k in tier.roots[1].indexed_keys()}
        assert 8 <= len(on_b & {bytes(k) for k in burst}) < len(burst)
        assert tier._queued == [0, 0]
        res = h.load(tier, primary, burst)
        assert res.success
        for slot, k in enumerate(burst):
            assert (primary.block(slot) == h.payload_of(k, BLOCK)).all()
    finally:
        tier.shutdown()


def test_restart_with_a_root_added_and_one_removed_keeps_the_others_blocks(tmp_path: Path) -> None:
    a, b, c, d = (tmp_path / n for n in "abcd")
    primary = h.aligned_primary(30, BLOCK)
    tier = h.make_striped(primary, [a, b, c])
    names = [f"restart-{i}" for i in range(120)]
    for i in range(0, 120, 30):
        assert h.store(tier, primary, [h.key_of(n) for n in names[i : i + 30]]).success
    before = _roots_of(tier)
    tier.shutdown()
    kept = before[1] | before[2]  # the blocks of b and c, which stay
    tier = h.make_striped(primary, [b, c, d])  # a removed, d added
    try:
        assert tier.wait_scan(30)
        keys = [h.key_of(n) for n in names]
        held = [k for k in keys if bytes(k) in kept]
        assert len(held) == len(kept) and held
        assert all(r is LookupResult.HIT for r in tier.lookup_many(held))
        for i in range(0, len(held), 30):
            batch = held[i : i + 30]
            res = h.load(tier, primary, batch)
            assert res.success
            for slot, k in enumerate(batch):
                assert (primary.block(slot) == h.payload_of(k, BLOCK)).all()
        # Nothing of b or c moved: they hold exactly what they held (no rehash storm).
        assert _roots_of(tier)[:2] == [before[1], before[2]]
        # The removed root's blocks are misses; storing them again places them by the new roots.
        gone = [k for k in keys if bytes(k) in before[0]]
        assert all(r is LookupResult.MISS for r in tier.lookup_many(gone))
    finally:
        tier.shutdown()


def test_per_root_max_bytes_and_shares_of_the_total(tmp_path: Path) -> None:
    primary = h.aligned_primary(8, BLOCK)
    file_size = 4096 + BLOCK
    tier = FsTier(
        primary_kv_view=primary.view,
        context=TierContext(name="fs", block_bytes=BLOCK, namespace=h.NAMESPACE),
        root_dirs=[{"path": str(tmp_path / "small"), "max_bytes": 4 * file_size}, str(tmp_path / "big")],
        max_bytes=30 * file_size, small_block_bytes=0, precreate_dirs=False,
    )  # fmt: skip
    try:
        assert isinstance(tier, StripedFsTier)
        assert [s.max_bytes for s in tier.specs] == [4 * file_size, 26 * file_size]
        for i in range(0, 64, 8):
            h.store(tier, primary, [h.key_of(f"cap-{j}") for j in range(i, i + 8)])
        for t, limit in zip(tier.roots, (4 * file_size, 26 * file_size), strict=True):
            on_disk = sum(h.block_files(t.layout.ns_dir).values())
            assert on_disk <= limit
            assert t.usage().published == on_disk
        # The small root got its weight's share of the placements (4/30), then evicted its own.
        assert tier.get_stats()["root0_index_blocks"] <= 4
    finally:
        tier.shutdown()


@pytest.mark.parametrize(
    ("roots", "total", "match"),
    [
        ([], None, "non-empty list"),
        ("one", None, "non-empty list"),
        (["{d}/x", "{d}/x/"], None, "same directory"),
        ([{"path": "{d}/x", "max_bytes": "2MiB"}, "{d}/y"], "1MiB", "add up to"),
        ([{"max_bytes": "1MiB"}], None, "missing path"),
        ([{"path": "{d}/x", "size": 3}], None, "unknown key"),
    ],
)
def test_bad_root_dirs_are_one_line_errors(tmp_path: Path, roots: object, total: object, match: str) -> None:
    if isinstance(roots, list):
        roots = [
            {k: (v.format(d=tmp_path) if isinstance(v, str) else v) for k, v in r.items()}
            if isinstance(r, dict)
            else r.format(d=tmp_path)
            for r in roots
        ]
    primary = h.aligned_primary(2, BLOCK)
    ctx = TierContext(name="fs", block_bytes=BLOCK, namespace=h.NAMESPACE)
    with pytest.raises(ConfigError, match=match) as err:
        FsTier(primary_kv_view=primary.view, context=ctx, root_dirs=roots, max_bytes=total)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=match):
        FsTier.check_options(ctx, {"root_dirs": roots, "max_bytes": total})
    assert not (tmp_path / "x").exists()  # nothing written on a bad config


def test_root_dir_and_root_dirs_together_are_refused_and_a_health_option_stripes_one_root(
    tmp_path: Path,
) -> None:
    primary = h.aligned_primary(2, BLOCK)
    ctx = TierContext(name="fs", block_bytes=BLOCK, namespace=h.NAMESPACE)
    with pytest.raises(ConfigError, match="not both"):
        FsTier(primary_kv_view=primary.view, context=ctx, root_dir=str(tmp_path), root_dirs=[str(tmp_path)])
    # One root with a health option: striped over that root (deadlines, fencing on one disk).
    one = FsTier(primary_kv_view=primary.view, context=ctx, root_dir=str(tmp_path / "one"), io_timeout=1.0)
    try:
        assert isinstance(one, StripedFsTier) and [s.path for s in one.specs] == [str(tmp_path / "one")]
        assert one.io_timeout == 1.0
    finally:
        one.shutdown()
    FsTier.check_options(ctx, {"root_dir": str(tmp_path / "one"), "fence_errors": 2})
    with pytest.raises(ConfigError, match="root_dir: missing"):
        FsTier.check_options(ctx, {"io_timeout": 1.0})
    with pytest.raises(ConfigError, match="io_timeout"):
        FsTier.check_options(ctx, {"root_dirs": [str(tmp_path)], "io_timeout": -1})


@pytest.mark.slow
def test_sigkill_mid_store_on_a_striped_tier_leaves_every_roots_accounting_exact(tmp_path: Path) -> None:
    roots = [str(tmp_path / n) for n in ("a", "b", "c")]
    primary = h.aligned_primary(8, BLOCK)
    observer = h.make_striped(primary, roots)
    file_size = observer.roots[0].layout.file_size(16)
    mid_batch = 0
    for rnd in range(8):
        args = {"root": roots, "block_bytes": BLOCK, "max_bytes": 60 * file_size, "batch": 8,
                "prefix": f"k{rnd}", "out": str(tmp_path / f"out{rnd}.json")}  # fmt: skip
        proc = subprocess.Popen(h.spawn_args("writer", args), stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            for _ in range(1 + rnd % 3):
                proc.stdout.readline()
            time.sleep(0.002 * rnd)  # land at different points of the next batch
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        for t in observer.roots:  # evidence the kill landed inside a store: a reservation, an intent, a temp
            raw = t.usage(recover=False)
            dead = [p for tok, p in raw.procs.items() if tok != t.accounting.token]
            if any(p["reserved"] or p["intent"] for p in dead) or h.temp_files(t.layout.ns_dir):
                mid_batch += 1
                break
        # With the observer alive, each root's totals equal that root's bytes in its tree (the dead
        # writer's half-done section undone, its reservation and temp files dropped).
        for t, st in zip(observer.roots, observer.usage(), strict=True):
            assert st.reserved == 0
            assert st.published == sum(h.block_files(t.layout.ns_dir).values())
            assert not h.temp_files(t.layout.ns_dir)
    assert mid_batch >= 1, "no kill landed inside a store"
    observer.refresh()
    keys = list(observer.indexed_keys())[:8]
    res = h.load(observer, primary, keys)
    for slot, k in enumerate(res.transferred(keys)):
        assert (primary.block(keys.index(k)) == h.payload_of(k, BLOCK)).all(), slot
    observer.shutdown()


def test_the_fs_type_builds_a_striped_tier_from_a_config_and_keeps_its_option_checks(tmp_path: Path) -> None:
    from kvtier.plugins.factories import create_tier

    primary = h.aligned_primary(4, BLOCK)
    ctx = TierContext(name="fs", block_bytes=BLOCK, namespace=h.NAMESPACE)
    FsTier.check_options(ctx, {"root_dir": str(tmp_path / "one")})  # the one-root form, defaults applied
    with pytest.raises(ConfigError, match="bogus"):  # unknown keys are still refused by name
        create_tier(
            {"type": "fs", "root_dir": str(tmp_path), "bogus": 1}, primary_kv_view=primary.view, context=ctx
        )
    cfg = {"type": "fs", "root_dirs": [str(tmp_path / "x"), str(tmp_path / "y")], "max_bytes": "8MiB",
           "io_timeout": 2.0, "small_block_bytes": 0}  # fmt: skip
    tier = create_tier(cfg, primary_kv_view=primary.view, context=ctx)
    try:
        assert isinstance(tier, StripedFsTier)
        shares = [s.max_bytes or 0 for s in tier.specs]
        assert sum(shares) == 8 << 20 and abs(shares[0] - shares[1]) < 8 << 14  # same disk: ~equal
        assert tier.config_info()["io_timeout"] == 2.0
        assert h.store(tier, primary, [h.key_of("cfg")]).success  # type: ignore[arg-type]
    finally:
        tier.shutdown()
