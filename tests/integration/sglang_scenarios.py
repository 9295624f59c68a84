"""SGLang-side scenarios, run by tests/integration/test_sglang.py with the SGLang venv's python.

Usage: ``python sglang_scenarios.py SCENARIO EXTRA_CONFIG_JSON [ARGS...]``; prints one JSON line.

Each scenario builds kvtier's backend the way SGLang 0.5.23 does: SGLang's own argument parser
reads ``--hicache-storage-backend-extra-config``, SGLang's ``parse_storage_backend_extra_config``
turns it into the extra config, SGLang's ``StorageBackendFactory.create_backend("dynamic", ...)``
builds the class, and the controller's calls follow (``register_mem_pool_host``,
``on_host_pools_registered``, ``batch_exists``, ``batch_set_v1``/``batch_get_v1`` with host
indices of SGLang's own ``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost`` on CPU).

Faked: nothing of SGLang's storage path. Not run: the GPU side (device <-> host copies) and the
scheduler. ``engine_shims/torchvision`` stands in for torchvision only at import time: SGLang's
model-config package imports it, and its only wheel for torch 2.13 is linked against CUDA.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_shims"))

import torch
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage import StorageBackendFactory

LAYERS, HEADS, DIM, PAGE, TOKENS = 2, 2, 64, 4, 256


def host_pool(
    layout: str = "page_first",
    *,
    tokens: int = TOKENS,
    layers: int = LAYERS,
    heads: int = HEADS,
    dim: int = DIM,
    page: int = PAGE,
) -> Any:
    """SGLang's MHA host pool on CPU (the "device" buffers are CPU tensors: no GPU here)."""
    k = tuple(torch.zeros(tokens, heads, dim, dtype=torch.float16) for _ in range(layers))
    v = tuple(torch.zeros(tokens, heads, dim, dtype=torch.float16) for _ in range(layers))

    def ptrs(ts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
        page_size=page, head_num=heads, head_dim=dim, v_head_dim=dim, dtype=torch.float16,
        device=torch.device("cpu"),
    )  # fmt: skip
    return MHATokenToKVPoolHost(
        info, 2.0, 0, page, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=tokens, start_layer=0, end_layer=layers - 1,
    )  # fmt: skip


def extra_config_from_command_line(raw: str) -> dict[str, Any]:
    """What SGLang makes of ``--hicache-storage-backend-extra-config RAW``; a JSON list is a whole
    ``sglang.launch_server`` argument list (a command line from the docs)."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = json.loads(raw) if raw.startswith("[") else [
        "--model-path", "m", "--enable-hierarchical-cache", "--hicache-storage-backend", "dynamic",
        "--hicache-storage-backend-extra-config", raw,
    ]  # fmt: skip
    args = parser.parse_args(argv)
    assert args.enable_hierarchical_cache and args.hicache_storage_backend == "dynamic"
    config, *_ = HybridCacheController.parse_storage_backend_extra_config(
        args.hicache_storage_backend_extra_config
    )
    return config


def backend(raw: str, pool: Any, *, tp_rank: int = 0, tp_size: int = 1, mla: bool = False) -> Any:
    cfg = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=True, is_page_first_layout=pool.layout == "page_first",
        model_name="Qwen/Qwen3-0.6B", extra_config=extra_config_from_command_line(raw),
    )  # fmt: skip
    b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    b.register_mem_pool_host(pool)
    b.on_host_pools_registered()
    return b


def pages(pool: Any, n: int, seed: int) -> tuple[list[str], torch.Tensor]:
    """``n`` pages of host memory filled with seeded random bytes, and their SGLang-style keys."""
    idx = pool.alloc(n * PAGE)
    g = torch.Generator().manual_seed(seed)
    flat = pool.kv_buffer.view(torch.uint8).reshape(-1)
    ptrs, sizes = pool.get_page_buffer_meta(idx)
    base = flat.data_ptr()
    for p, s in zip(ptrs, sizes, strict=True):
        off = p - base
        flat[off : off + s] = torch.randint(0, 256, (s,), dtype=torch.uint8, generator=g)
    return [f"{seed:08x}{i:056x}" for i in range(n)], idx


def page_bytes(pool: Any, idx: torch.Tensor) -> list[bytes]:
    flat = pool.kv_buffer.view(torch.uint8).reshape(-1)
    ptrs, sizes = pool.get_page_buffer_meta(idx)
    base = flat.data_ptr()
    return [bytes(flat[p - base : p - base + s].numpy()) for p, s in zip(ptrs, sizes, strict=True)]


def round_trip(raw: str, layout: str = "page_first") -> dict[str, Any]:
    """Store 6 pages, load them into other host pages: byte-exact; a longer key list hits 6."""
    pool = host_pool(layout)
    b = backend(raw, pool)
    keys, idx = pages(pool, 6, seed=1)
    want = page_bytes(pool, idx)
    stored = b.batch_set_v1(keys, idx)
    dst = pool.alloc(6 * PAGE)
    flat = pool.kv_buffer.view(torch.uint8).reshape(-1)
    ptrs, sizes = pool.get_page_buffer_meta(dst)
    for p, s in zip(ptrs, sizes, strict=True):  # the destination starts as garbage
        flat[p - flat.data_ptr() : p - flat.data_ptr() + s] = 7
    hit = b.batch_exists([*keys, "ff" * 32])
    loaded = b.batch_get_v1(keys, dst)
    got = page_bytes(pool, dst)
    stats = b.get_stats()
    out = {
        "stored": stored, "hit": hit, "loaded": loaded, "exact": got == want,
        "backup_pgs": sum(stats.backup_pgs), "prefetch_pgs": sum(stats.prefetch_pgs),
        "kvtier": b.kvtier_stats(), "parts": len(want) // 6,
    }  # fmt: skip
    b.close()
    return out


def leading_run(raw: str) -> dict[str, Any]:
    """Pages 0,1,3 stored: ``batch_exists`` answers 2 (a gap ends the run)."""
    pool = host_pool()
    b = backend(raw, pool)
    keys, idx = pages(pool, 4, seed=3)
    b.batch_set_v1(keys[:2], idx[: 2 * PAGE])
    b.batch_set_v1(keys[3:], idx[3 * PAGE :])
    out = {"run": b.batch_exists(keys), "first_missing": b.batch_exists(keys[2:])}
    b.close()
    return out


def writer(raw: str, seed: str) -> dict[str, Any]:
    """Store 5 pages (for another process) and print their bytes' digest."""
    import hashlib

    pool = host_pool()
    b = backend(raw, pool)
    keys, idx = pages(pool, 5, seed=int(seed))
    ok = b.batch_set_v1(keys, idx)
    b.close()
    return {"stored": ok, "digest": hashlib.sha256(b"".join(page_bytes(pool, idx))).hexdigest()}


def reader(raw: str, seed: str) -> dict[str, Any]:
    """Look up and load what :func:`writer` stored (same keys), in a fresh process."""
    import hashlib

    pool = host_pool()
    b = backend(raw, pool)
    keys = [f"{int(seed):08x}{i:056x}" for i in range(5)]
    hit = b.batch_exists(keys)
    dst = pool.alloc(5 * PAGE)
    loaded = b.batch_get_v1(keys, dst) if hit else []
    b.close()
    return {
        "hit": hit,
        "loaded": loaded,
        "digest": hashlib.sha256(b"".join(page_bytes(pool, dst))).hexdigest(),
    }


def down(raw: str) -> dict[str, Any]:
    """The tier's server is gone (the test killed it): every call answers a miss in time."""
    pool = host_pool()
    t0 = time.monotonic()
    b = backend(raw, pool)
    keys, idx = pages(pool, 3, seed=5)
    stored = b.batch_set_v1(keys, idx)
    hit = b.batch_exists(keys)
    loaded = b.batch_get_v1(keys, idx)
    out = {"stored": stored, "hit": hit, "loaded": loaded, "seconds": time.monotonic() - t0}
    b.close()
    return out


def ranks(raw: str, mla: str) -> dict[str, Any]:
    """Rank 0 stores; rank 1 of the same TP group sees the pages only for an MLA model."""
    is_mla = mla == "1"
    pool0, pool1 = host_pool(), host_pool()
    b0 = backend(raw, pool0, tp_rank=0, tp_size=2, mla=is_mla)
    keys, idx = pages(pool0, 3, seed=11)
    b0.batch_set_v1(keys, idx)
    # Built after the store: an fs tier learns of other writers' files when it scans at start.
    b1 = backend(raw, pool1, tp_rank=1, tp_size=2, mla=is_mla)
    out = {
        "rank0": b0.batch_exists(keys),
        "rank1": b1.batch_exists(keys),
        "rank1_writes": b1.batch_set_v1(keys, idx),
    }
    b0.close()
    b1.close()
    return out


def refuse_v2(raw: str) -> dict[str, Any]:
    pool = host_pool()
    b = backend(raw, pool)
    try:
        b.register_mem_host_pool_v2(pool, "mamba")
    except ValueError as exc:
        return {"refused": str(exc)}
    finally:
        b.close()
    return {"refused": None}


def legacy(raw: str) -> dict[str, Any]:
    """The non-v1 path (``batch_set``/``batch_get`` with flat pages) round-trips too."""
    pool = host_pool()
    b = backend(raw, pool)
    keys, idx = pages(pool, 2, seed=21)
    data = [pool.get_data_page(int(idx[i * PAGE]), flat=True).clone() for i in range(2)]
    ok = b.batch_set(keys, data)
    dst = [pool.get_dummy_flat_data_page() for _ in range(2)]
    got = b.batch_get(keys, dst)
    # Compared as bytes: random bytes include NaN patterns, which never equal themselves as floats.
    exact = all(
        g is not None and torch.equal(g.view(torch.uint8), d.view(torch.uint8))
        for g, d in zip(got, data, strict=True)
    )
    b.close()
    return {"stored": ok, "exact": exact}


def foreign_indices(raw: str) -> dict[str, Any]:
    """Host indices that are not pages of the registered pool (past its end, not page-aligned)
    move nothing and raise nothing; the pool's own pages still round-trip afterwards."""
    pool = host_pool()
    b = backend(raw, pool)
    keys, idx = pages(pool, 2, seed=31)
    past_end = torch.arange(pool.size, pool.size + 2 * PAGE, dtype=torch.int64)
    unaligned = idx + 1
    out: dict[str, Any] = {
        "past_end": [b.batch_set_v1(keys, past_end), b.batch_get_v1(keys, past_end)],
        "unaligned": [b.batch_set_v1(keys, unaligned), b.batch_get_v1(keys, unaligned)],
        "stored_before": b.kvtier_stats()["stored_blocks"],
        "hit_before": b.batch_exists(keys),
    }
    want = page_bytes(pool, idx)
    out["stored"] = b.batch_set_v1(keys, idx)
    dst = pool.alloc(2 * PAGE)
    out["loaded"] = b.batch_get_v1(keys, dst)
    out["exact"] = page_bytes(pool, dst) == want
    b.close()
    return out


SCENARIOS = {
    f.__name__: f
    for f in (round_trip, leading_run, writer, reader, down, ranks, refuse_v2, legacy, foreign_indices)
}

if __name__ == "__main__":
    name, raw, *rest = sys.argv[1:]
    rest = [r for r in rest if r]
    print(json.dumps(SCENARIOS[name](raw, *rest)), flush=True)  # type: ignore[operator]
