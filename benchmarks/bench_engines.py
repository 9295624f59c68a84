"""Store/load through kvtier's SGLang and LMCache adapters next to the same kvtier tier called
directly, same bytes, same run: the adapters should add no copy and little bookkeeping.

* **sglang**: ``KvtierHiCacheStorage`` built by SGLang's ``StorageBackendFactory`` from the
  command-line JSON, over SGLang's own ``page_first`` MHA host pool (8 layers x 8 heads x 128 dims,
  16-token pages: two 256 KiB rows per page), ``batch_set_v1`` then ``batch_get_v1`` of
  ``--pages`` pages into other host pages. Reference: an fs tier built by
  ``kvtier.plugins.create_tier`` over the same rows, one store job and one load job of the same
  blocks, polled until reported.
* **lmcache**: ``KvtierL2Adapter`` built by LMCache's plug-in factory from the ``--l2-adapter``
  JSON over an L1 arena (``l1_memory_desc``), store and load tasks of ``--pages`` 512 KiB objects
  waited for on their eventfds. Reference: the same fs tier over the same arena rows.

Each engine runs in its own venv (``KVTIER_TEST_SGLANG_PYTHON`` / ``KVTIER_TEST_LMCACHE_PYTHON``,
built by ``.ci/run``; an engine without one is listed under ``missing``). Every round writes to a
fresh fs directory (no "already stored" shortcut) and the first round warms up uncounted; ``ratios``
maps ``<engine>_<op>`` to the median over rounds (who runs first alternates) of reference seconds /
adapter seconds (higher is better; 1.0 = no overhead).

``python benchmarks/bench_engines.py [--json] [--pages N] [--repeat R]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "tests" / "integration"


def settle(tier: Any) -> None:
    """Wait until a fresh tier's start-up work (the fs tier's scan of its tree) is over, so neither
    side of a comparison pays it inside the timed part."""
    end = time.monotonic() + 10
    while tier.get_stats().get("scan_done", 1) != 1 and time.monotonic() < end:
        time.sleep(0.005)


def direct(
    tier_cfg: dict[str, Any], rows: memoryview, keys: list[Any], src: list[int], dst: list[int]
) -> tuple[float, float]:
    """Seconds of one store job then one load job through the tier itself."""
    import numpy as np

    from kvtier.jobs import TransferJob
    from kvtier.plugins import create_tier
    from kvtier.tiers.base import TierContext

    shape = rows.shape or (0, 0)
    tier = create_tier(
        tier_cfg, primary_kv_view=rows, context=TierContext(name="direct", block_bytes=int(shape[1]))
    )

    def run(job: TransferJob, load: bool) -> float:
        t0 = time.perf_counter()
        (tier.submit_load if load else tier.submit_store)(job)
        while not any(r.job_id == job.job_id for r in tier.get_finished_jobs()):
            time.sleep(0.0005)
        return time.perf_counter() - t0

    from kvtier.keys import BlockKey

    try:
        # One untimed block first, as the adapter's side gets: worker threads, directories.
        run(TransferJob(9, [BlockKey(b"warm-up-block-00")], np.asarray(src[:1], dtype=np.int32)), False)
        s = run(TransferJob(1, keys, np.asarray(src, dtype=np.int32)), False)
        ld = run(TransferJob(2, keys, np.asarray(dst, dtype=np.int32), is_promotion=True), True)
    finally:
        tier.shutdown()
    return s, ld


def sglang_round(pages: int, tmp: str, direct_first: bool) -> dict[str, float]:
    sys.path.insert(0, str(SCENARIOS))
    import sglang_scenarios as sc  # the scenario helpers: SGLang's own pool and factory path
    import torch

    pool = sc.host_pool(tokens=pages * 2 * 16 + 64, layers=8, heads=8, dim=128, page=16)
    raw = json.dumps({
        "backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
        "class_name": "KvtierHiCacheStorage", "interface_v1": 1,
        "tier": {"type": "fs", "root_dir": f"{tmp}/a"},
    })  # fmt: skip
    b = sc.backend(raw, pool)
    keys = [f"{i:064x}" for i in range(pages)]
    src = pool.alloc(pages * 16)
    dst = pool.alloc(pages * 16)
    flat = pool.kv_buffer.view(torch.uint8).reshape(-1)
    flat[:] = torch.randint(0, 256, (flat.numel(),), dtype=torch.uint8)
    rows_view, src_rows, dst_rows = b.io.tier.primary_kv_view, b._rows(src, pages), b._rows(dst, pages)
    bkeys = b._block_keys(keys)
    ref = {"type": "fs", "root_dir": f"{tmp}/b"}
    if direct_first:
        ref_s, ref_l = direct(ref, rows_view, bkeys, src_rows, dst_rows)
    settle(b.io.tier)
    warm = pool.alloc(16)
    b.batch_set_v1(["ff" * 32], warm)  # one untimed page first, as the direct side gets
    t0 = time.perf_counter()
    ok_s = b.batch_set_v1(keys, src)
    t_store = time.perf_counter() - t0
    t0 = time.perf_counter()
    ok_l = b.batch_get_v1(keys, dst)
    t_load = time.perf_counter() - t0
    assert all(ok_s) and all(ok_l)
    b.close()
    if not direct_first:
        ref_s, ref_l = direct(ref, rows_view, bkeys, src_rows, dst_rows)
    return {"adapter_store": t_store, "adapter_load": t_load, "direct_store": ref_s, "direct_load": ref_l,
            "bytes": pages * 2 * b._row_bytes}  # fmt: skip


def lmcache_round(pages: int, tmp: str, direct_first: bool) -> dict[str, float]:
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
    arena = torch.randint(0, 256, (2 * pages * size + align,), dtype=torch.uint8)  # src, dst objects
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
    keys = [
        ObjectKey(chunk_hash=hashlib.sha256(str(i).encode()).digest(), model_name="m", kv_rank=0)
        for i in range(pages)
    ]
    src = [obj(i) for i in range(pages)]
    dst = [obj(pages + i) for i in range(pages)]

    adapter_tier = a._tier(size, True).tier  # the adapter's tier over the arena (built on first use)
    rows_view = adapter_tier.primary_kv_view
    bkeys = [a._block_key(k, size) for k in keys]
    src_rows = [i * size // align for i in range(pages)]
    dst_rows = [(pages + i) * size // align for i in range(pages)]
    ref = {"type": "fs", "root_dir": f"{tmp}/b"}
    if direct_first:
        ref_s, ref_l = direct(ref, rows_view, bkeys, src_rows, dst_rows)

    settle(adapter_tier)
    warm_key = ObjectKey(chunk_hash=b"warm-up", model_name="m", kv_rank=0)
    warm_task = a.submit_store_task([warm_key], [obj(2 * pages - 1)])  # untimed, as the direct side gets
    while warm_task not in a.pop_completed_store_tasks():
        time.sleep(0.001)

    def wait(fd: int, done: Any) -> None:
        while not done():
            select.select([fd], [], [], 1)
            _os.eventfd_read(fd)

    t0 = time.perf_counter()
    t = a.submit_store_task(keys, src)
    got: dict[int, Any] = {}
    wait(a.get_store_event_fd(), lambda: got.update(a.pop_completed_store_tasks()) or t in got)
    t_store = time.perf_counter() - t0
    t0 = time.perf_counter()
    lt = a.submit_load_task(keys, dst)
    box: list[Any] = []
    wait(a.get_load_event_fd(), lambda: box.append(a.query_load_result(lt)) or box[-1] is not None)
    t_load = time.perf_counter() - t0
    assert got[t].is_successful() and all(box[-1].test(i) for i in range(pages))
    a.close()
    if not direct_first:
        ref_s, ref_l = direct(ref, rows_view, bkeys, src_rows, dst_rows)
    return {"adapter_store": t_store, "adapter_load": t_load, "direct_store": ref_s, "direct_load": ref_l,
            "bytes": pages * size}  # fmt: skip


def worker(engine: str, pages: int, repeat: int) -> dict[str, Any]:
    """Run in the engine's venv: ``repeat`` counted rounds after one warm-up."""
    fn = sglang_round if engine == "sglang" else lmcache_round
    rounds = []
    for i in range(repeat + 1):
        with tempfile.TemporaryDirectory(prefix="kvtier-bench-engines-") as tmp:
            r = fn(pages, tmp, i % 2 == 1)  # alternate who runs first (page cache, CPU turbo)
        if i:
            rounds.append(r)
    out: dict[str, Any] = {"bytes": rounds[0]["bytes"]}
    for op in ("store", "load"):
        ratios = sorted(r[f"direct_{op}"] / r[f"adapter_{op}"] for r in rounds)
        out[f"ratio_{op}"] = round(statistics.median(ratios), 3)
        out[f"ratio_{op}_range"] = [round(ratios[0], 3), round(ratios[-1], 3)]
        for who in ("adapter", "direct"):
            med = statistics.median(r[f"{who}_{op}"] for r in rounds)
            out[f"{who}_{op}_mib_s"] = round(out["bytes"] / med / 2**20, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--pages", type=int, default=64, help="pages / objects per round (512 KiB each)")
    p.add_argument("--repeat", type=int, default=5, help="counted rounds")
    p.add_argument("--worker", choices=["sglang", "lmcache"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not 1 <= a.pages <= 4096 or not 1 <= a.repeat <= 100:
        p.error("--pages must be in [1, 4096] and --repeat in [1, 100]")
    if a.worker:
        print(json.dumps(worker(a.worker, a.pages, a.repeat)))
        return 0
    results: dict[str, Any] = {"pages": a.pages, "repeat": a.repeat, "missing": [], "ratios": {}}
    for engine in ("sglang", "lmcache"):
        py = os.environ.get(f"KVTIER_TEST_{engine.upper()}_PYTHON", "")
        if not py:
            results["missing"].append(f"{engine}: KVTIER_TEST_{engine.upper()}_PYTHON is not set")
            continue
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONWARNINGS="ignore")
        proc = subprocess.run(
            [py, __file__, "--worker", engine, "--pages", str(a.pages), "--repeat", str(a.repeat)],
            capture_output=True, text=True, env=env, timeout=900,
        )  # fmt: skip
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
                    f"{r[f'ratio_{op}_range']}"
                )
        for m in results["missing"]:
            print("missing:", m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
