"""vLLM's own scheduler-side offloading stack on CPU, driven the way vLLM's scheduler drives it.

:class:`VllmStack` builds vLLM 0.33's ``TieringOffloadingSpec`` from an ``OffloadingConfig`` (the
normalized config vLLM derives from the model and ``--kv-transfer-config``) and takes its real
``TieringOffloadingManager``: vLLM's CPU primary tier over a ``/dev/shm`` region, vLLM's
``SecondaryTierFactory`` loading ``kvtier.integrations.vllm`` by ``module_path``, vLLM's manager
lock, cascades, promotions, back-pressure and metrics.

The one thing faked is what needs a GPU: the GPU->CPU copy of a stored block. Where vLLM's worker
would DMA a block into its primary chunk, :meth:`VllmStack.store` writes the bytes into that chunk
with numpy, between ``prepare_store`` and ``complete_store`` exactly as the worker's copy sits.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib
import os
import sys
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from needs import need

ADAPTER = {"type": "KvtierTier", "module_path": "kvtier.integrations.vllm"}
ROW_BYTES = 8192
TOKENS_PER_BLOCK = 16


_VLLM_MODULES = (
    "vllm.v1.kv_offload.tiering.factory",
    "vllm.v1.kv_offload.tiering.spec",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics",
)


def need_vllm() -> Any:
    """vLLM's tiering modules (skip locally without the ``vllm`` install, fail under CI=true).

    Imported with warnings silenced: importing vLLM triggers deprecation warnings inside torch and
    vLLM (not kvtier's), which the suite's ``filterwarnings = error`` would turn into errors.
    """
    for name in _VLLM_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(name)
        except ImportError as exc:
            # vLLM cannot be a kvtier extra (its dependencies pull CUDA torch): CI installs it
            # without dependencies, with the light packages its offload modules import.
            need(
                False, f"{name} is not importable ({exc}): pip install --no-deps -r .ci/vllm-requirements.txt"
            )
    return sys.modules[_VLLM_MODULES[0]]


def kvtier_entry(root: str | os.PathLike[str], **options: Any) -> dict[str, Any]:
    """One ``secondary_tiers`` entry loading kvtier's fs tier under ``root``."""
    return {**ADAPTER, "root_dir": str(root), **options}


def offloading_config(
    extra: Mapping[str, Any],
    *,
    model: str = "kvtier-test/model",
    dtype: str = "float16",
    tokens_per_block: int = TOKENS_PER_BLOCK,
    row_bytes: int = ROW_BYTES,
    tp_size: int = 1,
    engine_id: str | None = None,
    kv_events: bool = False,
) -> Any:
    """vLLM's ``OffloadingConfig`` for a one-group model whose chunk is ``row_bytes`` bytes
    (``kv_events``: vLLM publishes KV cache events, as with ``--kv-events-config``)."""
    from vllm.v1.kv_offload import config as c

    return c.OffloadingConfig(
        groups=(c.OffloadingGroupConfig(tokens_per_block=tokens_per_block, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=row_bytes // tp_size,
        enable_kv_cache_events=kv_events,
        extra_config=dict(extra),
        engine_id=engine_id or f"kvtier-test-{uuid.uuid4().hex[:12]}",
        model=c.OffloadingModelConfig(name=model, dtype=dtype),
        cache=c.OffloadingCacheConfig(tokens_per_hash=tokens_per_block, blocks_per_chunk=1),
        parallel=c.OffloadingParallelConfig(
            rank=0,
            world_size=tp_size,
            tp_size=tp_size,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


def extra_config(tiers: Sequence[Mapping[str, Any]], *, chunks: int = 16, **more: Any) -> dict[str, Any]:
    return {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": chunks * ROW_BYTES,
        "secondary_tiers": [dict(t) for t in tiers],
        **more,
    }


def offload_keys(n: int, *, salt: bytes = b"") -> list[bytes]:
    """``n`` vLLM offload keys: a 32-byte block hash + 4-byte big-endian group index 0."""
    from vllm.v1.kv_offload.base import make_offload_key

    return [make_offload_key(hashlib.sha256(salt + i.to_bytes(4, "big")).digest(), 0) for i in range(n)]


def payload(key: bytes, n: int = ROW_BYTES) -> np.ndarray:
    """Deterministic bytes for ``key`` (every key a different block)."""
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def assert_exact(out: Mapping[bytes, np.ndarray | None], keys: Sequence[bytes]) -> None:
    """Every key of ``keys`` was a HIT and its bytes are the ones stored under it."""
    for key in keys:
        got = out[key]
        assert got is not None, f"stored block {key.hex()[:16]} missed"
        assert np.array_equal(got, payload(key, got.size)), "loaded bytes differ from the stored block"


class VllmStack:
    """vLLM's real spec + tiering manager, and the scheduler's call sequence (see the module doc)."""

    def __init__(self, config: Any) -> None:
        from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

        self.config = config
        self.spec = TieringOffloadingSpec(config)
        self.manager = self.spec.get_manager()
        self._req = 0

    @property
    def tier(self) -> Any:
        return self.manager.secondary_tiers[0]

    def rows(self) -> np.ndarray:
        """The primary buffer as numpy rows (drop the array before :meth:`close`)."""
        # vLLM's view is of int8 (a torch int8 tensor); bytes are bytes, compare them as uint8.
        return np.asarray(self.manager.primary_tier.get_kv_memoryview()).view(np.uint8)

    def _ctx(self) -> Any:
        from vllm.v1.kv_offload.base import ReqContext

        self._req += 1
        return ReqContext(req_id=f"req-{self._req}")

    def step(self) -> None:
        from vllm.v1.kv_offload.base import ScheduleEndContext

        with self.manager.lock:
            self.manager.on_schedule_end(ScheduleEndContext((), ()))

    def settle(self, timeout: float = 30.0) -> None:
        """Step until the manager has no job in flight (what vLLM's idle steps do)."""
        deadline = time.monotonic() + timeout
        while True:
            self.step()
            with self.manager.lock:
                if not self.manager.has_pending_work():
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("vLLM's manager still has pending work")
            time.sleep(0.002)

    def store(self, keys: Sequence[bytes], *, wait: bool = True) -> list[bytes]:
        """One request stores ``keys``: prepare_store, the (faked) GPU copy, complete_store."""
        ctx = self._ctx()
        rows = self.rows()
        with self.manager.lock:
            self.manager.on_new_request(ctx)
            out = self.manager.prepare_store(list(keys), ctx)
            assert out is not None, "vLLM's primary tier refused the store"
            stored = list(out.keys_to_store)
            for key, chunk in zip(stored, out.store_spec.chunk_ids, strict=True):
                rows[int(chunk)] = payload(key, rows.shape[1])  # the GPU->CPU copy
            self.manager.complete_store(stored, ctx)
            self.manager.on_request_finished(ctx)
        del rows
        if wait:
            self.settle()
        return stored

    def load(self, keys: Sequence[bytes], timeout: float = 30.0) -> dict[bytes, np.ndarray | None]:
        """One request looks ``keys`` up until each is a HIT or a MISS; returns the bytes of each HIT
        (read from the primary chunk ``prepare_load`` names) and ``None`` for each MISS."""
        from vllm.v1.kv_offload.base import LookupResult, ScheduleEndContext

        ctx = self._ctx()
        with self.manager.lock:
            self.manager.on_new_request(ctx)
        answers: dict[bytes, Any] = {}
        deadline = time.monotonic() + timeout
        first = True
        while True:
            with self.manager.lock:
                for key in keys:
                    if answers.get(key) not in (LookupResult.HIT, LookupResult.MISS):
                        answers[key] = self.manager.lookup(key, ctx)
                new = (ctx.req_id,) if first else ()
                self.manager.on_schedule_end(ScheduleEndContext(new, ()))
            first = False
            if all(a in (LookupResult.HIT, LookupResult.MISS) for a in answers.values()):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"lookups still pending: {answers}")
            time.sleep(0.002)
        hits = [k for k in keys if answers[k] is LookupResult.HIT]
        out: dict[bytes, np.ndarray | None] = {k: None for k in keys}
        rows = self.rows()
        with self.manager.lock:
            if hits:
                spec = self.manager.prepare_load(hits, ctx)
                for key, chunk in zip(hits, spec.chunk_ids, strict=True):
                    out[key] = rows[int(chunk)].copy()  # the CPU->GPU copy
                self.manager.complete_load(hits, ctx)
            self.manager.on_request_finished(ctx)
        del rows
        return out

    def reset(self) -> None:
        """vLLM's reset_cache (sleep / weight update): drains tiers, empties the primary tier."""
        with self.manager.lock:
            self.manager.reset_cache()
            self.manager.on_reset_flushed()

    def wipe_primary(self) -> None:
        """Empty the primary tier and overwrite every chunk, so a load must really copy bytes."""
        self.reset()
        rows = self.rows()
        rows[:] = 0xA5
        del rows

    def close(self) -> None:
        self.manager.shutdown()
        # vLLM unlinks its region; a test that failed half-way may not get there.
        for path in glob.glob(f"/dev/shm/vllm_offload_{self.config.engine_id}*"):
            with contextlib.suppress(OSError):
                os.unlink(path)


@contextlib.contextmanager
def vllm_stack(
    root: Path | None = None, *, tiers: Sequence[Mapping[str, Any]] | None = None, **kw: Any
) -> Iterator[VllmStack]:
    """A :class:`VllmStack` with one kvtier fs tier under ``root`` (or the given tiers)."""
    chunks = kw.pop("chunks", 16)
    more = kw.pop("extra", {})
    tier_list = tiers if tiers is not None else [kvtier_entry(root or Path("/nonexistent"))]
    stack = VllmStack(offloading_config(extra_config(tier_list, chunks=chunks, **more), **kw))
    try:
        yield stack
    finally:
        stack.close()
