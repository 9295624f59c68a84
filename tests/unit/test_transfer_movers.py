"""KV movers: every layout engines use, numpy and torch, byte-exact through eviction and promotion.

The round trip is the issue's done-when: KV tensors stored into the primary tier, evicted from it to
the ``example`` tier (write-through copies them there), promoted back and loaded into *other* blocks
of a zeroed cache equal the originals. Torch tensors are CPU tensors: no GPU on this host, so the
CUDA-stream path of :mod:`kvtier.transfer.movers` is not exercised (it is guarded by
``torch.cuda.is_available()``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from needs import need_module

from kvtier.engine import Engine
from kvtier.errors import MisuseError
from kvtier.keys import BlockKey, LookupResult
from kvtier.transfer.movers import KVLayout, copy_rows_in, copy_rows_out

NB = 16  # blocks in the engine's KV cache
LAYERS = 3


def keys(n: int, tag: str = "") -> list[BlockKey]:
    return [BlockKey(f"{tag}blk{i:04d}".encode()) for i in range(n)]


def rng_fill(a: np.ndarray, seed: int) -> np.ndarray:
    a.reshape(-1).view(np.uint8)[:] = np.random.default_rng(seed).integers(0, 256, a.nbytes, dtype=np.uint8)
    return a


def np_layouts() -> dict[str, Callable[[], tuple[list[np.ndarray], Any]]]:
    shape = (NB, 4, 2, 8)  # (blocks, block_size, heads, head_dim)

    def separate() -> tuple[list[np.ndarray], Any]:
        return [np.zeros(shape, np.float16) for _ in range(2 * LAYERS)], 0

    def stacked() -> tuple[list[np.ndarray], Any]:
        return [np.zeros((NB, 2, *shape[1:]), np.float32) for _ in range(LAYERS)], 0

    def kv_first() -> tuple[list[np.ndarray], Any]:
        return [np.zeros((2, *shape), np.float16) for _ in range(LAYERS)], 1

    def cross_layer() -> tuple[list[np.ndarray], Any]:
        return [np.zeros((NB, LAYERS, 2, *shape[1:]), np.float16)], 0

    return {"separate": separate, "stacked": stacked, "kv_first": kv_first, "cross_layer": cross_layer}


def roundtrip(make: Callable[[], tuple[list[Any], Any]], fill: Callable[[Any, int], Any]) -> None:
    src_tensors, dim = make()
    for i, t in enumerate(src_tensors):
        fill(t, i)
    src = KVLayout(src_tensors, dim)
    n = 6
    cfg = {
        "cpu_bytes_to_use": 4 * (-(-src.block_bytes // 4096) * 4096),  # 4 slots: forces eviction
        "block_bytes": src.block_bytes,
        "secondary_tiers": [{"type": "example"}],
    }
    ks = keys(n)
    src_ids = [3, 0, 7, 12, 5, 9]
    with Engine(cfg) as e:
        assert e.store_kv(ks[:3], src, src_ids[:3]) == 3
        e.poll()
        assert e.store_kv(ks[3:], src, src_ids[3:]) == 3
        e.drain()
        # keys 0 and 1 were evicted from the 4 slots; the example tier has them (write-through).
        assert e.lookup(ks).results[:2] == [LookupResult.MISS] * 2  # 4 hits pinned: no room now
        assert e.lookup(ks[:2]).results == [LookupResult.HIT_PENDING] * 2
        e.drain()
        back = [ks[0], ks[1], ks[4], ks[5]]
        assert e.lookup(back).results == [LookupResult.HIT] * 4
        assert e.stats()["promotions"] == 2
        dst_tensors, _ = make()
        dst = KVLayout(dst_tensors, dim)
        dst_ids = [1, 2, 4, 6]
        assert e.load_kv(back, dst, dst_ids) == 4
        used = [src_ids[0], src_ids[1], src_ids[4], src_ids[5]]
        for s_t, d_t in zip(src.tensors, dst.tensors, strict=True):
            s_np, d_np = as_bytes(s_t), as_bytes(d_t)
            for si, di in zip(used, dst_ids, strict=True):
                sel = (slice(None),) * dim + (si,)
                dsel = (slice(None),) * dim + (di,)
                assert s_np[sel].tobytes() == d_np[dsel].tobytes()  # bitwise, NaN patterns included
            untouched = [b for b in range(NB) if b not in dst_ids]
            assert not np.any(np.take(d_np, untouched, axis=dim))


def as_bytes(t: Any) -> np.ndarray:
    """Same shape, one uint8 per element byte in a trailing axis (numpy or torch, no float compare)."""
    if isinstance(t, np.ndarray):
        return t.view(np.uint8).reshape(*t.shape, -1)
    import torch

    return t.view(torch.uint8).numpy().reshape(*t.shape, -1)


@pytest.mark.parametrize("name", list(np_layouts()))
def test_numpy_layouts_roundtrip_through_example_tier(name: str) -> None:
    roundtrip(np_layouts()[name], lambda t, i: rng_fill(t, i))


@pytest.mark.parametrize("name", ["separate", "kv_first", "cross_layer"])
def test_torch_layouts_roundtrip_bitwise(name: str) -> None:
    torch = need_module("torch", "torch")
    shape = (NB, 4, 2, 8)

    def make() -> tuple[list[Any], Any]:
        if name == "separate":
            return [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(2 * LAYERS)], 0
        if name == "kv_first":
            return [torch.zeros((2, *shape), dtype=torch.float16) for _ in range(LAYERS)], 1
        return [torch.zeros((NB, LAYERS, 2, *shape[1:]), dtype=torch.bfloat16)], 0

    def fill(t: Any, i: int) -> None:
        g = torch.Generator().manual_seed(i)
        n = t.numel() * t.element_size()
        t.view(-1).view(torch.uint8).copy_(torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8))

    roundtrip(make, fill)


def test_layout_geometry_and_checks() -> None:
    layers = [np.zeros((2, NB, 4, 8), np.float16) for _ in range(2)]
    lay = KVLayout.per_layer(layers, kv_first=True)
    assert lay.num_blocks == NB
    assert lay.segments == [(0, 2, 64), (128, 2, 64)]
    assert lay.block_bytes == 256
    cross = KVLayout.cross_layer(np.zeros((NB, 3, 2, 4), np.int8))
    assert cross.block_bytes == 24
    with pytest.raises(MisuseError, match="blocks"):
        KVLayout([np.zeros((4, 2)), np.zeros((5, 2))])
    with pytest.raises(MisuseError, match="contiguous"):
        KVLayout([np.zeros((4, 4))[:, ::2]])
    with pytest.raises(MisuseError, match="out of range"):
        lay.check([NB], 256)
    with pytest.raises(MisuseError, match="slots hold"):
        lay.check([0], 100)


def test_large_batches_use_two_threads_and_stay_exact() -> None:
    # 16 blocks x 256 KiB = 4 MiB: above the parallel threshold.
    block = 256 << 10
    data = np.random.default_rng(1).integers(0, 256, (16, block), dtype=np.uint8)
    rows = np.zeros((32, block), np.uint8)
    slots = np.array([31 - 2 * i for i in range(16)], np.int32)
    assert copy_rows_in(rows, slots, data, list(range(16)), block, 16) == 16 * block
    out = np.zeros_like(data)
    copy_rows_out(rows, slots, out, range(16), block)
    assert np.array_equal(out, data)
    # Per-block buffers (bytes) work too, and a wrong size is refused.
    bufs = [bytes(r) for r in data[:2]]
    copy_rows_in(rows, slots[:2], bufs, [0, 1], block, 2)
    with pytest.raises(MisuseError, match="bytes"):
        copy_rows_in(rows, slots[:1], [b"short"], [0], block, 1)


def test_async_store_and_load_jobs_with_partial_success() -> None:
    kv = [rng_fill(np.zeros((NB, 64), np.uint8), 5)]
    lay = KVLayout(kv)
    with Engine({"cpu_bytes_to_use": 8 * 4096, "block_bytes": 64}) as e:
        ks = keys(4, "a")
        sid = e.submit_store_kv(ks[:3], lay, [0, 1, 2])
        assert sid is not None
        e.drain()
        dst = KVLayout([np.zeros((NB, 64), np.uint8)])
        lid = e.submit_load_kv(ks, dst, [4, 5, 6, 7])  # the 4th key was never stored
        deadline = time.monotonic() + 10
        results: dict[int, Any] = {}
        while len(results) < 2 and time.monotonic() < deadline:
            results.update({r.job_id: r for r in e.poll_transfers()})
            time.sleep(0.01)
        assert results[sid].success
        assert not results[lid].success and results[lid].successful_keys == frozenset(ks[:3])
        assert np.array_equal(dst.tensors[0][4:7], kv[0][0:3])


def test_async_store_reports_only_the_keys_that_found_a_slot() -> None:
    # Two slots, three keys in one job: the third has no slot (the others are being written), so
    # the job must not claim it was stored.
    kv = [rng_fill(np.zeros((NB, 64), np.uint8), 9)]
    with Engine({"cpu_bytes_to_use": 2 * 4096, "block_bytes": 64}) as e:
        ks = keys(3, "s")
        sid = e.submit_store_kv(ks, KVLayout(kv), [0, 1, 2])
        assert sid is not None
        deadline = time.monotonic() + 10
        results: dict[int, Any] = {}
        while sid not in results and time.monotonic() < deadline:
            results.update({r.job_id: r for r in e.poll_transfers()})
            time.sleep(0.01)
        res = results[sid]
        assert not res.success
        stored = res.successful_keys
        assert stored is not None and len(stored) == 2
        report = e.lookup(ks)
        hits = {k for k, r in zip(ks, report.results, strict=True) if r is LookupResult.HIT}
        assert hits == set(stored)
