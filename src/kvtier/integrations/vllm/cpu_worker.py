"""vLLM's ``OffloadingWorker`` contract on vLLM's CPU backend: host-memory copies, vLLM's descriptors.

vLLM's own offloading worker (``vllm/v1/kv_offload/cpu/gpu_worker.py``) asserts CUDA/XPU tensors and
copies with ``swap_blocks_batch``, a CUDA op the CPU build does not register; its spec refuses the CPU
platform outright (``cpu/spec.py``, ``get_worker``). On the CPU backend the KV cache already lives in
host memory, so a transfer is a set of ``memmove`` calls between two host buffers. This worker makes
exactly the copies vLLM's worker would make:

* the offload region's per-tensor views come from vLLM's ``SharedOffloadRegion.create_next_worker_view``
  (the same row layout the scheduler side and every secondary tier see);
* the byte addresses of each copy come from vLLM's ``compute_sub_block_ptrs`` (sub-blocks of a chunk,
  the skip of a chunk's first sub-blocks), driven by the ``GPULoadStoreSpec``'s ``group_sizes`` and
  ``block_indices`` and the ``CanonicalKVCacheRef`` page sizes exactly as vLLM's handler walks them;
* results are vLLM's ``TransferResult`` (bytes moved, seconds taken), reported on the next
  ``get_finished``.

Copies run synchronously inside ``submit_store`` / ``submit_load``. That is correct on the CPU backend:
vLLM's connector submits a step's stores at the start of the *next* step (``start_kv_transfers``),
after the forward that wrote those blocks returned, and a request waiting on a load is not scheduled
until the load is reported; there is no device stream to order against. ``ctypes.memmove`` releases
the GIL, so a copy never stalls another Python thread of the engine.

The canonical (parallelism-agnostic) layout is refused: its per-fragment copy plans are vLLM private
helpers, and no CPU deployment needs it.

Importing this module imports vLLM and torch.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import GPULoadStoreSpec, OffloadingWorker, TransferResult
from vllm.v1.kv_offload.cpu.gpu_worker import compute_sub_block_ptrs

__all__ = ["HostCopyWorker", "Direction"]

log = logging.getLogger("kvtier.integrations.vllm")

_memmove = ctypes.memmove


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Direction:
    """One copy direction: source and destination tensors and their blocks-per-chunk granularity.

    ``to_region`` (a store): vLLM's KV cache (one block per row) -> the offload region (``blocks_per_chunk``
    sub-blocks per row). A load is the reverse. Mirrors the pairing of vLLM's
    ``SingleDirectionOffloadingHandler`` so the descriptor walk is the same.
    """

    def __init__(
        self,
        kv_tensors: Sequence[Any],
        region_tensors: Sequence[Any],
        blocks_per_chunk: int,
        group_refs: Sequence[Sequence[Any]],
        *,
        to_region: bool,
    ) -> None:
        self.src = list(kv_tensors if to_region else region_tensors)
        self.dst = list(region_tensors if to_region else kv_tensors)
        self.src_per_chunk = 1 if to_region else blocks_per_chunk
        self.dst_per_chunk = blocks_per_chunk if to_region else 1
        self.group_refs = [list(g) for g in group_refs]
        self.to_region = to_region

    def descriptors(
        self, src_blocks: np.ndarray, dst_blocks: np.ndarray, kv_spec: GPULoadStoreSpec
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(src addresses, dst addresses, sizes)`` of every copy one transfer makes.

        Raises ``ValueError`` when the spec's blocks do not add up (vLLM's worker asserts the same).
        """
        group_sizes = list(kv_spec.group_sizes)
        block_indices = list(kv_spec.block_indices)
        if len(group_sizes) != len(self.group_refs) or len(block_indices) != len(group_sizes):
            raise ValueError(
                f"transfer names {len(group_sizes)} KV cache groups, the worker has {len(self.group_refs)}"
            )
        total = sum(size * len(refs) for size, refs in zip(group_sizes, self.group_refs, strict=True))
        src_ptrs = np.empty(total, dtype=np.uint64)
        dst_ptrs = np.empty(total, dtype=np.uint64)
        sizes = np.empty(total, dtype=np.int64)
        # Source and destination walk the same groups with the same arithmetic, each with its own
        # blocks per chunk: (blocks, blocks per chunk, addresses out, tensors by index).
        sides = (
            (src_blocks, self.src_per_chunk, src_ptrs, self.src),
            (dst_blocks, self.dst_per_chunk, dst_ptrs, self.dst),
        )
        offs = [0, 0]
        op = 0
        for size, first, refs in zip(group_sizes, block_indices, self.group_refs, strict=True):
            if size == 0:
                continue
            skips = [first % per for _b, per, _p, _t in sides]
            ends = [
                off + _cdiv(size + skip, side[1]) for off, skip, side in zip(offs, skips, sides, strict=True)
            ]
            if any(end > len(side[0]) for end, side in zip(ends, sides, strict=True)):
                raise ValueError("transfer spec has fewer blocks than its group sizes need")
            for ref in refs:
                end = op + size
                for (blocks, per, ptrs, tensors), off, stop, skip in zip(
                    sides, offs, ends, skips, strict=True
                ):
                    compute_sub_block_ptrs(
                        blocks[off:stop], per, ptrs[op:end], tensors[ref.tensor_idx], skip_count=skip
                    )
                sizes[op:end] = ref.page_size_bytes
                op = end
            offs = ends
        if offs != [len(src_blocks), len(dst_blocks)]:
            raise ValueError("transfer spec has more blocks than its group sizes use")
        return src_ptrs[:op], dst_ptrs[:op], sizes[:op]

    def run(self, src_spec: Any, dst_spec: Any) -> int:
        """Make every copy of one transfer; the number of bytes copied."""
        kv_spec = src_spec if self.to_region else dst_spec
        src, dst, sizes = self.descriptors(
            np.asarray(src_spec.block_ids), np.asarray(dst_spec.block_ids), kv_spec
        )
        for s, d, n in zip(src.tolist(), dst.tolist(), sizes.tolist(), strict=True):
            _memmove(d, s, n)
        return int(sizes.sum())


class HostCopyWorker(OffloadingWorker):  # type: ignore[misc,unused-ignore]
    """vLLM's ``OffloadingWorker`` for the CPU backend (see the module doc).

    Owns the offload region it is given (vLLM's ``SharedOffloadRegion``, this worker's rank) and
    releases it at ``shutdown``, after dropping its own views, so vLLM's ``cleanup`` finds no export.
    """

    def __init__(
        self, kv_caches: Any, blocks_per_chunk: int, region: Any, *, canonical_layout: bool = False
    ) -> None:
        # vLLM derives page mappings for every layer it can, but its worker uses them only with
        # canonical_layout; without it, refs' mappings are ignored exactly as here.
        if canonical_layout:
            raise ValueError(
                "kvtier's CPU offloading worker copies vLLM's direct layout only; remove canonical_layout "
                "from kv_connector_extra_config"
            )
        self._region = region
        kv_tensors: list[Any] = []
        region_tensors: list[Any] = []
        for tensor in kv_caches.tensors:
            kv = tensor.tensor
            if kv.device.type != "cpu":
                raise ValueError(
                    f"kvtier's CPU offloading worker needs the KV cache in host memory, got {kv.device}; "
                    "on a GPU use vLLM's TieringOffloadingSpec"
                )
            page = int(tensor.page_size_bytes)
            kv_tensors.append(kv.view(-1, page) if kv.dim() != 2 else kv)
            region_tensors.append(region.create_next_worker_view(page * blocks_per_chunk))
        refs = kv_caches.group_data_refs
        self._store = Direction(kv_tensors, region_tensors, blocks_per_chunk, refs, to_region=True)
        self._load = Direction(kv_tensors, region_tensors, blocks_per_chunk, refs, to_region=False)
        self._done: list[TransferResult] = []
        log.info(
            "kvtier: CPU offloading worker: %d KV tensors, %d blocks per chunk, region %s",
            len(kv_tensors),
            blocks_per_chunk,
            getattr(region, "mmap_path", "?"),
        )

    def _transfer(self, direction: Direction, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        start = time.perf_counter()
        try:
            nbytes = direction.run(src_spec, dst_spec)
        except Exception:
            # vLLM's connector asserts every transfer succeeds; an error here is a bug worth a traceback.
            log.exception("kvtier: CPU offloading copy for job %s failed", job_id)
            self._done.append(TransferResult(job_id=job_id, success=False))
            return True
        self._done.append(
            TransferResult(
                job_id=job_id,
                success=True,
                transfer_size=nbytes,
                transfer_time=time.perf_counter() - start,
            )
        )
        return True

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        """KV cache -> offload region, now."""
        return self._transfer(self._store, job_id, src_spec, dst_spec)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False) -> bool:
        """Offload region -> KV cache, now (``expedited``, vLLM 0.33+: every copy here already is)."""
        return self._transfer(self._load, job_id, src_spec, dst_spec)

    def get_finished(self) -> list[TransferResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        # Every copy finished inside its submit call.
        return

    def shutdown(self) -> None:
        """Drop this worker's views of the region, then unmap it (vLLM's cleanup). Idempotent."""
        region, self._region = self._region, None
        for direction in (self._store, self._load):
            direction.src.clear()
            direction.dst.clear()
        if region is not None:
            if getattr(region, "_creator", False) and not os.path.exists(region.mmap_path):
                # The scheduler side unlinked the name already (cpu_spec.unlink_region_name); vLLM's
                # cleanup would log a warning with a traceback for the missing file.
                region._creator = False
            region.cleanup()
