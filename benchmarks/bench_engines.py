"""Store/load through kvtier's SGLang and LMCache adapters next to the same kvtier tier called
directly, same bytes, same run: the adapters should add no copy and little bookkeeping.

* **sglang**: ``KvtierHiCacheStorage`` built by SGLang's ``StorageBackendFactory`` from the
  command-line JSON, over SGLang's own ``page_first`` MHA host pool (8 layers x 8 heads x 128 dims,
  16-token pages: two 256 KiB rows per page), ``batch_set_v1`` then ``batch_get_v1`` of
  ``--pages`` pages into other host pages.
* **lmcache**: ``KvtierL2Adapter`` built by LMCache's plug-in factory from the ``--l2-adapter``
  JSON over an L1 arena (``l1_memory_desc``), store and load tasks of ``--pages`` 512 KiB objects
  waited for on their eventfds.

The reference (:class:`DirectTier`) is the strongest fair one: the same tier type with the same
options (hence the same durability -- no fsync -- the same 4 I/O threads and 4-block batches, the
same ``O_DIRECT`` choice), built by ``kvtier.plugins.create_tier`` over *the very rows the
adapter's tier reads and writes* (zero copy on both sides), handed the same keys and rows as one
job (the adapter's batching) and polled every 0.5 ms until reported (the adapter's poller). Only
the adapter's own work differs: key scoping, host-index / arena-offset to row mapping, the
engine's result types and the wake-up of the waiting thread.

Fairness, and why earlier versions reported adapter / reference ratios of ~2 (SGLang store) and
~1.4 (LMCache store): the reference tier was built fresh right before its timed jobs, so its
start-up work -- the tree scan and then the background ``mkdir`` of the fs tier's 272 shard
directories (``precreate_dirs``, ~0.1-0.7 ms each) -- ran inside its timed store, while the
adapter's tier had been built earlier and had (mostly) finished it (the old ``settle`` waited for
the scan only, and only on the adapter's side). Measured on this host: one 128 x 256 KiB store
job right after ``create_tier`` took a median 148 ms against 89 ms for the same job once
``tree_ready`` was set (12 alternating runs each, fs tier on the root disk); with both sides
settled the old benchmark's SGLang store ratios fell from 0.95-1.33 to 0.95-1.0.

Now both tiers are built, settled (scan *and* ``tree_ready``) and warmed up with one uncounted
full-size trial before any timing, both stay alive for the whole round (the same background
threads on both sides), and a reference job that does not move every block fails the run (a
dropped store would look fast). Each side loads into its own destination and the bytes are
checked (untimed) after every trial: checking and clearing one shared destination between the
two loads made the second load of every pair slower (a ratio that flipped with the order).

Noise: on the shared 2-core machine speed swings within seconds (other jobs), so each trial runs
both sides back to back (stores, then loads, the order alternating per trial), two consecutive
trials (one in each order) make one sample -- the reference's summed seconds over the adapter's, so
running second costs both sides the same -- and ``ratios`` maps ``<engine>_<op>`` to the median
over ``--repeat`` x ``--trials`` / 2 samples (``benchstats``' paired ratio; higher is better, 1.0 =
no overhead, the spread comes with it); every round uses fresh directories, a fresh adapter and a
fresh reference (no "already stored" shortcut: every trial stores new keys).

Medium: both fs tiers live under ``--root``, by default ``/dev/shm`` (a tmpfs; the system temp
dir where there is none). The question is what the adapter adds, and on a memory-backed root the
tier's own work is smallest, so any adapter cost counts most. On this shared machine the root
disk also swings 2-3x with the other jobs' I/O (one trial's store of 32 MiB took 30 to 100 ms, and
removing a round's files alone took 5 s): with ``--root /tmp`` the store ratios of four runs were
0.87-1.58 (SGLang) and 0.98-1.45 (LMCache) from noise alone -- 24 stores per side and position
gave the adapter's and the reference's medians within 5% of each other (54.8 / 52.1 ms running
first, 46.8 / 44.7 ms second, LMCache). ``--root DIR`` measures another medium.

What remains is the adapter's own work, measured (SGLang, 64 pages on ``/dev/shm``, medians of
30 calls): 0.3 ms before the job is submitted (host indices to rows, key scoping), then the same
time inside the tier as the reference's job (16.1 vs 16.3 ms per load, 18.5 vs 18.4 ms per store),
then 0.3-0.5 ms until the poller reports it to the waiting thread, against ~0.2 ms of the
reference's own polling: about 2-3% of a transfer, hence load ratios of ~0.95-0.98.

Each engine runs in its own venv (``KVTIER_TEST_SGLANG_PYTHON`` / ``KVTIER_TEST_LMCACHE_PYTHON``,
built by ``.ci/run``; an engine without one is listed under ``missing``).

``python benchmarks/bench_engines.py [--json] [--pages N] [--repeat R] [--trials T] [--root DIR]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchstats import paired_ratio  # benchmarks/benchstats.py, next to this script

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "tests" / "integration"
#: Memory-backed when the host has it (see the module doc, "Medium").
DEFAULT_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def settle(tier: Any) -> None:
    """Wait until a fresh tier's start-up work is over -- the fs tier's scan of its tree *and* the
    background creation of its 272 shard directories that follows (``tree_ready``) -- so neither
    side of a comparison pays it inside the timed part."""
    end = time.monotonic() + 10
    while tier.get_stats().get("scan_done", 1) != 1 and time.monotonic() < end:
        time.sleep(0.005)
    ready = getattr(tier, "tree_ready", None)
    if ready is not None:
        ready.wait(max(end - time.monotonic(), 0.0))


@dataclass(slots=True)
class Side:
    """One way of moving a trial's blocks: ``store(trial)`` / ``load(trial)`` return seconds."""

    store: Callable[[int], float]
    load: Callable[[int], float]


class DirectTier:
    """The reference: a tier of the same type and options as the adapter's, built by
    ``kvtier.plugins.create_tier`` over the very rows the adapter's tier uses, with the same block
    size, and handed the same keys and rows as one job per trial (the adapter's batching), polled
    until reported (what the adapter's poller does)."""

    def __init__(self, tier_cfg: dict[str, Any], rows: memoryview) -> None:
        from kvtier.plugins import create_tier
        from kvtier.tiers.base import TierContext

        shape = rows.shape or (0, 0)
        ctx = TierContext(name="direct", block_bytes=int(shape[1]))
        self.tier = create_tier(tier_cfg, primary_kv_view=rows, context=ctx)
        settle(self.tier)
        self._next = 1

    def run(self, keys: list[Any], rows: list[int], *, load: bool) -> float:
        import numpy as np

        from kvtier.jobs import TransferJob

        job = TransferJob(self._next, keys, np.asarray(rows, dtype=np.int32), is_promotion=load)
        self._next += 1
        tier = self.tier
        t0 = time.perf_counter()
        (tier.submit_load if load else tier.submit_store)(job)
        while not (done := [r for r in tier.get_finished_jobs() if r.job_id == job.job_id]):
            time.sleep(0.0005)
        took = time.perf_counter() - t0
        # A dropped or failed job would look fast: the reference must move every block.
        assert len(done[0].transferred(job.keys)) == len(job.keys), done[0]
        return took

    def close(self) -> None:
        self.tier.shutdown()


def paired(adapter: Side, direct: Side, trials: int, check: Callable[[], None]) -> list[dict[str, float]]:
    """``trials`` counted trials after one uncounted full-size warm-up trial. In each, both sides
    store, then both load, back to back (the order alternates per trial), so a burst of disk or
    CPU contention from other processes tends to hit both sides of one pair. Each side loads into
    its own destination; ``check`` then verifies (untimed) that both brought back the stored bytes
    and clears both destinations."""
    out = []
    for t in range(trials + 1):
        order = [("adapter", adapter), ("direct", direct)]
        if t % 2:
            order.reverse()
        times: dict[str, float] = {}
        for who, side in order:
            times[f"{who}_store"] = side.store(t)
        for who, side in reversed(order):
            times[f"{who}_load"] = side.load(t)
        check()
        if t:
            out.append(times)
    return out


def sglang_round(pages: int, tmp: str, trials: int) -> tuple[list[dict[str, float]], int]:
    sys.path.insert(0, str(SCENARIOS))
    import numpy as np
    import sglang_scenarios as sc  # the scenario helpers: SGLang's own pool and factory path
    import torch

    pool = sc.host_pool(tokens=pages * 3 * 16 + 64, layers=8, heads=8, dim=128, page=16)
    raw = json.dumps({
        "backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
        "class_name": "KvtierHiCacheStorage", "interface_v1": 1,
        "tier": {"type": "fs", "root_dir": f"{tmp}/a"},
    })  # fmt: skip
    b = sc.backend(raw, pool)
    src = pool.alloc(pages * 16)
    dst = pool.alloc(pages * 16)  # the adapter's destination pages
    ref_dst = pool.alloc(pages * 16)  # the reference's
    flat = pool.kv_buffer.view(torch.uint8).reshape(-1)
    flat[:] = torch.randint(0, 256, (flat.numel(),), dtype=torch.uint8)
    rows_view, src_rows, dst_rows = b.io.tier.primary_kv_view, b._rows(src, pages), b._rows(dst, pages)
    ref_rows = b._rows(ref_dst, pages)
    rows = np.asarray(rows_view)
    settle(b.io.tier)
    ref = DirectTier({"type": "fs", "root_dir": f"{tmp}/b"}, rows_view)

    def keys(t: int) -> list[str]:
        return [f"{t:08x}{i:056x}" for i in range(pages)]

    def timed(fn: Callable[[], list[bool]]) -> float:
        t0 = time.perf_counter()
        ok = fn()
        took = time.perf_counter() - t0
        assert all(ok), ok
        return took

    def check() -> None:
        for got in (dst_rows, ref_rows):
            assert np.array_equal(rows[src_rows], rows[got]), "a load brought back other bytes"
            rows[got] = 0

    def adapter_store(t: int) -> float:
        ks = keys(t)
        return timed(lambda: b.batch_set_v1(ks, src))

    def adapter_load(t: int) -> float:
        ks = keys(t)
        return timed(lambda: b.batch_get_v1(ks, dst))

    adapter = Side(adapter_store, adapter_load)
    direct = Side(
        store=lambda t: ref.run(b._block_keys(keys(t)), src_rows, load=False),
        load=lambda t: ref.run(b._block_keys(keys(t)), ref_rows, load=True),
    )
    try:
        return paired(adapter, direct, trials, check), pages * 2 * b._row_bytes
    finally:
        b.close()
        ref.close()


def lmcache_round(pages: int, tmp: str, trials: int) -> tuple[list[dict[str, float]], int]:
    import argparse as ap
    import hashlib
    import os as _os
    import select

    import torch
    from lmcache.v1.distributed.api import ObjectKey
    from lmcache.v1.distributed.internal_api import L1MemoryDesc
    from lmcache.v1.distributed.l2_adapters import create_l2_adapter
    from lmcache.v1.distributed.l2_adapters.config import (
        add_l2_adapters_args,
        parse_args_to_l2_adapters_config,
    )
    from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

    size, align = 512 * 1024, 4096
    # src objects, the adapter's destination objects, the reference's destination rows
    arena = torch.randint(0, 256, (3 * pages * size + align,), dtype=torch.uint8)
    desc = L1MemoryDesc(ptr=arena.data_ptr(), size=arena.numel(), align_bytes=align)

    def obj(i: int) -> Any:
        t = arena[i * size : (i + 1) * size]
        meta = MemoryObjMetadata(shape=t.shape, dtype=torch.uint8, address=0, phy_size=size, ref_count=1)
        return TensorMemoryObj(raw_data=t, metadata=meta, parent_allocator=None)

    raw = json.dumps({
        "type": "plugin", "module_path": "kvtier.integrations.lmcache", "class_name": "KvtierL2Adapter",
        "adapter_params": {"tier": {"type": "fs", "root_dir": f"{tmp}/a"}},
    })  # fmt: skip
    parser = ap.ArgumentParser()
    add_l2_adapters_args(parser)
    a = create_l2_adapter(
        parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", raw])).adapters[0], desc
    )
    src = [obj(i) for i in range(pages)]
    dst = [obj(pages + i) for i in range(pages)]
    adapter_tier = a._tier(size, True).tier  # the adapter's tier over the arena (built on first use)
    settle(adapter_tier)
    src_rows = [i * size // align for i in range(pages)]
    ref_rows = [(2 * pages + i) * size // align for i in range(pages)]
    ref = DirectTier({"type": "fs", "root_dir": f"{tmp}/b"}, adapter_tier.primary_kv_view)

    def keys(t: int) -> list[Any]:
        return [
            ObjectKey(chunk_hash=hashlib.sha256(f"{t}-{i}".encode()).digest(), model_name="m", kv_rank=0)
            for i in range(pages)
        ]

    def wait(fd: int, done: Callable[[], bool]) -> None:
        while not done():
            select.select([fd], [], [], 1)
            with contextlib.suppress(BlockingIOError):  # the 1 s select timed out
                _os.eventfd_read(fd)

    def store(t: int) -> float:
        ks = keys(t)
        got: dict[int, Any] = {}
        t0 = time.perf_counter()
        task = a.submit_store_task(ks, src)
        wait(a.get_store_event_fd(), lambda: bool(got.update(a.pop_completed_store_tasks())) or task in got)
        took = time.perf_counter() - t0
        assert got[task].is_successful()
        return took

    def load(t: int) -> float:
        ks = keys(t)
        box: list[Any] = []
        t0 = time.perf_counter()
        task = a.submit_load_task(ks, dst)
        wait(
            a.get_load_event_fd(), lambda: bool(box.append(a.query_load_result(task))) or box[-1] is not None
        )
        took = time.perf_counter() - t0
        assert all(box[-1].test(i) for i in range(pages))
        return took

    half = pages * size

    def check() -> None:
        for got in (arena[half : 2 * half], arena[2 * half : 3 * half]):
            assert torch.equal(arena[:half], got), "a load brought back other bytes"
            got.zero_()

    direct = Side(
        store=lambda t: ref.run(a._block_keys(keys(t)), src_rows, load=False),
        load=lambda t: ref.run(a._block_keys(keys(t)), ref_rows, load=True),
    )
    try:
        return paired(Side(store, load), direct, trials, check), half
    finally:
        a.close()
        ref.close()


def worker(engine: str, pages: int, repeat: int, trials: int, root: str) -> dict[str, Any]:
    """Run in the engine's venv: ``repeat`` rounds (fresh directories, adapter and reference) of
    ``trials`` (even) counted trials each. Two consecutive trials ran in opposite orders; their
    times are summed into one sample, so whatever running second costs (or saves) falls on both
    sides equally."""
    fn = sglang_round if engine == "sglang" else lmcache_round
    pairs: list[dict[str, float]] = []
    nbytes = 0
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="kvtier-bench-engines-", dir=root) as tmp:
            got, nbytes = fn(pages, tmp, trials)
        pairs.extend({k: a[k] + b[k] for k in a} for a, b in zip(got[::2], got[1::2], strict=True))
    nbytes *= 2  # each sample moved the bytes twice
    out: dict[str, Any] = {"bytes": nbytes, "samples": len(pairs)}
    for op in ("store", "load"):
        ratio, spread = paired_ratio([p[f"direct_{op}"] for p in pairs], [p[f"adapter_{op}"] for p in pairs])
        out[f"ratio_{op}"] = round(ratio, 3)
        out[f"ratio_{op}_spread"] = spread
        for who in ("adapter", "direct"):
            med = statistics.median(p[f"{who}_{op}"] for p in pairs)
            out[f"{who}_{op}_mib_s"] = round(nbytes / med / 2**20, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--pages", type=int, default=64, help="pages / objects per trial (512 KiB each)")
    p.add_argument("--repeat", type=int, default=4, help="rounds (fresh directories and adapter)")
    p.add_argument("--trials", type=int, default=8, help="counted trials per round (even)")
    p.add_argument(
        "--root", default=DEFAULT_ROOT, help=f"directory both fs tiers live under (default {DEFAULT_ROOT})"
    )
    p.add_argument("--worker", choices=["sglang", "lmcache"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not 1 <= a.pages <= 4096 or not 1 <= a.repeat <= 100 or not 2 <= a.trials <= 100 or a.trials % 2:
        p.error("--pages must be in [1, 4096], --repeat in [1, 100], --trials even in [2, 100]")
    if not os.path.isdir(a.root):
        p.error(f"--root {a.root}: not a directory; give an existing one (e.g. /dev/shm)")
    if a.worker:
        print(json.dumps(worker(a.worker, a.pages, a.repeat, a.trials, a.root)))
        return 0
    results: dict[str, Any] = {
        "pages": a.pages, "repeat": a.repeat, "trials": a.trials, "root": a.root,
        "missing": [], "ratios": {},
    }  # fmt: skip
    for engine in ("sglang", "lmcache"):
        py = os.environ.get(f"KVTIER_TEST_{engine.upper()}_PYTHON", "")
        if not py:
            results["missing"].append(f"{engine}: KVTIER_TEST_{engine.upper()}_PYTHON is not set")
            continue
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONWARNINGS="ignore")
        cmd = [py, __file__, "--worker", engine, "--pages", str(a.pages), "--repeat", str(a.repeat),
               "--trials", str(a.trials), "--root", a.root]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode or not lines:
            results["missing"].append(f"{engine}: worker failed: {proc.stderr.strip()[-300:]}")
            continue
        r = json.loads(lines[-1])
        results[engine] = r
        results["ratios"][f"{engine}_store"] = r["ratio_store"]
        results["ratios"][f"{engine}_load"] = r["ratio_load"]
    if a.json:
        print(json.dumps(results))
    else:
        for engine in ("sglang", "lmcache"):
            r = results.get(engine)
            if r is None:
                continue
            for op in ("store", "load"):
                print(
                    f"{engine:8} {op:5} adapter {r[f'adapter_{op}_mib_s']:9.1f} MiB/s   direct tier "
                    f"{r[f'direct_{op}_mib_s']:9.1f} MiB/s   ratio {r[f'ratio_{op}']:.3f} "
                    f"(min/q1/q3/max {'/'.join(str(v) for v in r[f'ratio_{op}_spread'].values())})"
                )
        for m in results["missing"]:
            print("missing:", m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
