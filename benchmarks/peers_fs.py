"""The peers of ``bench_fs_peers.py``: vLLM's fs tier, LMCache's disk backend and raw file I/O.

Each class moves blocks between rows of the benchmark's shared buffer and its own directory, with
``store(keys, slots)`` and ``load(keys, slots)`` that return once every block is done (raising if
one failed), ``root`` (the directory whose page cache a cold load evicts) and ``close()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

_O_DIRECT = getattr(os, "O_DIRECT", 0)


def evict_page_cache(root: str) -> None:
    """Drop every page of the files under ``root`` from the page cache (not timed).

    ``os.sync()`` first: ``POSIX_FADV_DONTNEED`` drops clean pages only, so dirty ones are written
    back before. Files written with ``O_DIRECT`` have no cached pages; this costs them nothing.
    """
    os.sync()
    for d, _, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(d, f), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def vllm_reason() -> str | None:
    """Why vLLM's fs tier cannot run here (``None`` when it can)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager  # noqa: F401
    except Exception as exc:  # an import error or a broken install: report it, skip the peer
        return (
            f"vllm fs tier not importable ({type(exc).__name__}: {exc}); pip install --no-deps vllm==0.33.0"
        )
    return None


def lmcache_reason() -> str | None:
    """Why LMCache's local disk backend cannot run here (``None`` when it can)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend  # noqa: F401
    except Exception as exc:
        return (
            f"lmcache not importable ({type(exc).__name__}: {exc}); "
            "pip install --no-deps lmcache==0.5.6 numba llvmlite aiofile caio"
        )
    return None


class RawFiles:
    """One file per block: create + one write + close; open + one readv + close (the limit)."""

    name = "raw"

    def __init__(self, root: str, rows: np.ndarray, threads: int, direct: bool) -> None:
        self.root = root
        self.rows = rows
        self.direct = direct
        self.pool = ThreadPoolExecutor(threads)

    def _path(self, key: bytes) -> str:
        return os.path.join(self.root, key.hex())

    def store(self, keys: list[bytes], slots: list[int]) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (_O_DIRECT if self.direct else 0)

        def one(i: int) -> None:
            fd = os.open(self._path(keys[i]), flags, 0o600)
            try:
                os.write(fd, self.rows[slots[i]].data)
            finally:
                os.close(fd)

        list(self.pool.map(one, range(len(keys))))

    def load(self, keys: list[bytes], slots: list[int]) -> None:
        flags = os.O_RDONLY | (_O_DIRECT if self.direct else 0)

        def one(i: int) -> None:
            fd = os.open(self._path(keys[i]), flags)
            try:
                os.readv(fd, [self.rows[slots[i]].data])
            finally:
                os.close(fd)

        list(self.pool.map(one, range(len(keys))))

    def close(self) -> None:
        self.pool.shutdown()


def _open_dir(path: str) -> int:
    os.makedirs(path, exist_ok=True)
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


class SafeRawFiles:
    """Bare loops that do only what a verified tier cannot skip: the ceilings of kvtier's design.

    * ``temp_dirs=0`` (``sum_raw``): exactly the raw loop (one file per block in one directory,
      ``O_CREAT|O_EXCL``, one write, close; open, one ``readv``, close) plus xxh3-64 of each block
      before its write and after its read (checked against the stored sum, kept in memory: there
      is no header), with the C function kvtier's writer and reader call, GIL released. Its ratio
      to raw is the cost of checking the bytes, and nothing else.
    * ``temp_dirs=n`` (``safe_raw``): the same checksums, each block written to a temp file in one
      of ``n`` temp directories and renamed into one of 256 leaf directories (all made before the
      timed part and reached through descriptors), so no reader ever sees half a block: what an
      atomically publishing tier (kvtier, vLLM) adds.
    """

    def __init__(self, root: str, rows: np.ndarray, threads: int, direct: bool, *, temp_dirs: int) -> None:
        import ctypes

        from kvtier.tiers.fs.ccall import xxh3_address

        addr = xxh3_address()
        if addr is None:
            raise RuntimeError("sum_raw / safe_raw need xxhash's XXH3_64bits_withSeed")
        proto = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64)
        self._xxh3 = proto(addr)  # a foreign call: the GIL is released while it hashes
        self.name = "safe_raw" if temp_dirs else "sum_raw"
        self.root = root
        self.rows = rows
        self.direct = direct
        self.pool = ThreadPoolExecutor(threads)
        self._sums: dict[bytes, int] = {}
        self._fds: list[int] = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
        self._tmp = [_open_dir(os.path.join(root, "tmp", str(i))) for i in range(temp_dirs)]
        self._leaves = [
            _open_dir(os.path.join(root, f"{i >> 4:x}", f"{i & 15:x}"))
            for i in range(256 if temp_dirs else 0)
        ]
        self._fds += self._tmp + self._leaves

    def _where(self, key: bytes) -> tuple[int, str]:
        return (self._leaves[key[0]] if self._leaves else self._fds[0]), key.hex()

    def store(self, keys: list[bytes], slots: list[int]) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (_O_DIRECT if self.direct else 0)
        nbytes = self.rows.shape[1]

        def one(i: int) -> None:
            row = self.rows[slots[i]]
            self._sums[keys[i]] = self._xxh3(row.ctypes.data, nbytes, 0)
            leaf, name = self._where(keys[i])
            where, tmp = (self._tmp[i % len(self._tmp)], f"{i}.tmp") if self._tmp else (leaf, name)
            fd = os.open(tmp, flags, 0o600, dir_fd=where)
            try:
                os.write(fd, row.data)
            finally:
                os.close(fd)
            if self._tmp:
                os.rename(tmp, name, src_dir_fd=where, dst_dir_fd=leaf)

        list(self.pool.map(one, range(len(keys))))

    def load(self, keys: list[bytes], slots: list[int]) -> None:
        flags = os.O_RDONLY | (_O_DIRECT if self.direct else 0)
        nbytes = self.rows.shape[1]

        def one(i: int) -> None:
            row = self.rows[slots[i]]
            leaf, name = self._where(keys[i])
            fd = os.open(name, flags, dir_fd=leaf)
            try:
                os.readv(fd, [row.data])
            finally:
                os.close(fd)
            if self._xxh3(row.ctypes.data, nbytes, 0) != self._sums[keys[i]]:
                raise RuntimeError(f"{self.name}: block {keys[i].hex()} fails its checksum")

        list(self.pool.map(one, range(len(keys))))

    def close(self) -> None:
        self.pool.shutdown()
        for fd in self._fds:
            os.close(fd)


class VllmFs:
    """vLLM 0.33's ``FileSystemTierManager`` through its ``SecondaryTierManager`` API."""

    name = "vllm"

    def __init__(
        self, root: str, view: memoryview, block_bytes: int, threads: int, direct: bool, job_blocks: int
    ) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from vllm.v1.kv_offload import config as c
            from vllm.v1.kv_offload.base import ReqContext, make_offload_key
            from vllm.v1.kv_offload.tiering.base import TransferJob
            from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager
            from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
        cfg = c.OffloadingConfig(
            groups=(c.OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
            worker_kv_bytes_per_block=block_bytes, enable_kv_cache_events=False,
            extra_config={"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": view.nbytes,
                          "secondary_tiers": []},
            engine_id=f"bench-{os.getpid()}",
            model=c.OffloadingModelConfig(name="bench/model", dtype="float16"),
            cache=c.OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
            parallel=c.OffloadingParallelConfig(
                rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                is_parallelism_agnostic=False,
            ),
        )  # fmt: skip
        self.root = root
        self.job_blocks = job_blocks
        half = max(1, threads // 2)  # read- and write-priority groups: `threads` in all
        self.tier = FileSystemTierManager(
            TieringOffloadingSpec(cfg),
            view,
            "fs",
            root,
            n_read_threads=half,
            n_write_threads=threads - half or 1,
        )
        if not direct:
            self.tier._use_o_direct = False  # no option exists; the benchmark's --buffered run
        self._job = TransferJob
        self._key = make_offload_key
        self._ctx = ReqContext(req_id="bench")
        self._ids = 0

    def _run(self, keys: list[bytes], slots: list[int], load: bool) -> None:
        submit = self.tier.submit_load if load else self.tier.submit_store
        n = 0
        for lo in range(0, len(keys), self.job_blocks):
            self._ids += 1
            ks = [self._key(k, 0) for k in keys[lo : lo + self.job_blocks]]
            chunks = np.asarray(slots[lo : lo + self.job_blocks], dtype=np.int64)
            submit(
                self._job(
                    job_id=self._ids, keys=ks, chunk_ids=chunks, is_promotion=load, req_context=self._ctx
                )
            )
            n += 1
        bad = 0
        while n:
            self.tier.drain_jobs()
            for r in self.tier.get_finished_jobs():
                n -= 1
                bad += not r.success
        if bad:
            raise RuntimeError(f"vllm: {bad} job(s) failed")

    def store(self, keys: list[bytes], slots: list[int]) -> None:
        self._run(keys, slots, False)

    def load(self, keys: list[bytes], slots: list[int]) -> None:
        self._run(keys, slots, True)

    def close(self) -> None:
        self.tier.shutdown()


class LMCacheDisk:
    """LMCache 0.5.6's ``LocalDiskBackend`` (its own event loop thread and disk worker pool).

    Its blocks live in LMCache memory objects: stores write from objects filled from the shared
    rows once (not timed, as the other systems' primary rows are filled before a store), loads are
    ``batched_get_blocking`` (its concurrent read pool); the bytes are checked by copying the loaded
    objects into the destination rows after the timed part. Its allocator is a page-aligned pool,
    so ``O_DIRECT`` (``use_odirect``) works as in a pinned-memory deployment.
    """

    name = "lmcache"

    def __init__(self, root: str, rows: np.ndarray, block_bytes: int, threads: int, direct: bool) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import logging

            import torch
            from lmcache.utils import CacheEngineKey
            from lmcache.v1.config import LMCacheEngineConfig
            from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
            from lmcache.v1.memory_management import MemoryFormat
            from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
            from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

            logging.getLogger("lmcache").setLevel(logging.ERROR)
            for h in logging.getLogger("lmcache").handlers:
                h.setLevel(logging.ERROR)
        self.root = root
        self.rows = rows
        self.block_bytes = block_bytes
        self._torch, self._key_cls, self._fmt = torch, CacheEngineKey, MemoryFormat.KV_2LTD
        n = rows.shape[0]
        self._pool_mem = mmap.mmap(-1, (2 * n + 4) * block_bytes)
        pool = torch.frombuffer(self._pool_mem, dtype=torch.uint8)
        cfg = LMCacheEngineConfig.from_defaults(
            chunk_size=256, local_disk=root, max_local_disk_size=64.0, local_cpu=False,
            extra_config={"use_odirect": direct, "disk_io_threads": threads},
        )  # fmt: skip
        self.cpu = LocalCPUBackend(cfg, memory_allocator=TensorMemoryAllocator(pool, align_bytes=4096))
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._loop_thread.start()
        self.backend = LocalDiskBackend(cfg, self.loop, self.cpu)
        self._src: dict[int, Any] = {}

    def _obj(self, slot: int) -> Any:
        obj = self._src.get(slot)
        if obj is None:
            obj = self.cpu.allocate(self._torch.Size([self.block_bytes]), self._torch.uint8, self._fmt)
            self._src[slot] = obj
        obj.tensor.numpy()[:] = self.rows[slot]
        return obj

    def _keys(self, keys: list[bytes]) -> list[Any]:
        return [self._key_cls("bench", 1, 0, int.from_bytes(k[:8], "big"), self._torch.uint8) for k in keys]

    def prepare_store(self, slots: list[int]) -> None:
        """Fill LMCache's source objects from the rows (outside the timed part)."""
        self._objs = [self._obj(s) for s in slots]

    def store(self, keys: list[bytes], slots: list[int]) -> None:
        objs = getattr(self, "_objs", None) or [self._obj(s) for s in slots]
        self._objs = []
        done = threading.Semaphore(0)
        for k, obj in zip(self._keys(keys), objs, strict=True):
            self.backend.submit_put_task(k, obj, on_complete_callback=lambda _k: done.release())
        for _ in keys:
            if not done.acquire(timeout=60):
                raise RuntimeError("lmcache: a put did not complete within 60 s")

    def load(self, keys: list[bytes], slots: list[int]) -> None:
        got = self.backend.batched_get_blocking(self._keys(keys))
        self._loaded = list(zip(got, slots, strict=True))
        if any(g is None for g in got):
            raise RuntimeError("lmcache: a block was not loaded")

    def after_load(self) -> None:
        """Copy the loaded objects into their rows and free them (outside the timed part)."""
        for obj, slot in getattr(self, "_loaded", []):
            self.rows[slot] = obj.tensor.numpy()
            obj.ref_count_down()
        self._loaded = []

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.backend.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(5)


if __name__ == "__main__":
    sys.exit("run bench_fs_peers.py")
