"""kvtier as SGLang HiCache's L3 storage (SGLang 0.5.23, ``--hicache-storage-backend dynamic``).

SGLang's ``StorageBackendFactory`` imports :class:`KvtierHiCacheStorage` from the
``--hicache-storage-backend-extra-config`` JSON (``backend_name``, ``module_path``,
``class_name``) and calls ``KvtierHiCacheStorage(storage_config, kwargs)``; the cache controller
then calls :meth:`register_mem_pool_host` with its host KV pool. Keys of the extra config read
here (every other key is SGLang's or ignored):

* ``tier`` (required): one kvtier ``secondary_tiers`` entry, e.g. ``{"type": "fs", "root_dir":
  "/mnt/nvme/kv"}`` or ``{"type": "redis", "host": "127.0.0.1", "port": 6379}``; out-of-tree tiers
  load by ``module_path`` under ``plugins`` (``{"allowed_modules": [...]}``).
* ``tenant``: a cache salt; two tenants never see each other's blocks (default ``""``).
* ``deadline``: seconds an existence check or a transfer may take before it counts as a miss
  (default 5).
* ``interface_v1: 1``: SGLang's zero-copy path (``batch_get_v1``/``batch_set_v1``), the one this
  backend is built for; without it SGLang calls the legacy tensor API, which copies a page once.

Zero copy: the host pool's buffer is viewed as rows of the size ``get_page_buffer_meta`` reports
(one K and one V row per page for an MHA ``page_first`` pool, one row for MLA, one per layer and
K/V for ``layer_first``); each row is one kvtier block, read and written in place by the tier.

Keys: SGLang's page hash, scoped by a kvtier namespace of model name, pool layout, dtype, row size,
pipeline/context-parallel shard and -- for non-MLA models -- the TP rank (MLA KV is the same on every
TP rank, so ranks share it and only SGLang's storage writer stores it), plus the tenant salt.

Failures are misses: no data-path method raises; a down tier makes ``batch_exists`` answer 0 within
``deadline``. The v2 (hybrid pool) methods are refused when SGLang registers a hybrid pool
(:meth:`register_mem_host_pool_v2` raises once, with the reason, which fails the attach).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from kvtier.errors import ConfigError
from kvtier.integrations.buffer_tier import BufferTier, check_deadline
from kvtier.keys import BlockKey, KeyNamespace, make_namespace

__all__ = ["KvtierHiCacheStorage", "V2_REFUSAL"]

logger = logging.getLogger(__name__)

V2_REFUSAL = (
    "kvtier's SGLang backend serves the v1 KV pool only: hybrid (Mamba/SWA/DSA) pools need the v2 "
    "interface, which it does not implement; use it with full-attention models"
)
_OWN_KEYS = ("tier", "tenant", "deadline", "plugins")


class KvtierHiCacheStorage(HiCacheStorage):  # type: ignore[misc]
    """SGLang ``HiCacheStorage`` running one kvtier tier (see the module doc).

    Args:
        storage_config: SGLang's ``HiCacheStorageConfig`` (ranks, MLA flag, model, extra config).
        kwargs: the dict SGLang's factory passes positionally (unused).
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Mapping[str, Any] | None = None) -> None:
        extra = dict(storage_config.extra_config or {})
        tier = extra.get("tier")
        if not isinstance(tier, Mapping) or "type" not in tier:
            raise ConfigError(
                "hicache-storage-backend-extra-config.tier",
                'expected a kvtier tier entry such as {"type": "fs", "root_dir": "/mnt/kv"}',
            )
        tenant = extra.get("tenant", "")
        if not isinstance(tenant, str):
            raise ConfigError(
                "hicache-storage-backend-extra-config.tenant", f"expected a string, got {tenant!r}"
            )
        self.deadline = check_deadline(
            "hicache-storage-backend-extra-config.deadline", extra.get("deadline", 5.0)
        )
        self.tier_config = dict(tier)
        self.tenant = tenant
        self.storage_config = storage_config
        self._plugins = _plugins(extra.get("plugins"))
        self.io: BufferTier | None = None
        self.namespace: KeyNamespace | None = None
        self._base = 0
        self._row_bytes = 0
        self._rows_per_page = 0
        self._last_ok = True

    # -- set-up ------------------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Build the tier over the host pool's buffer (SGLang calls this once per attach)."""
        super().register_mem_pool_host(mem_pool_host)
        buf = getattr(mem_pool_host, "kv_buffer", None)
        if buf is None:
            raise ValueError(V2_REFUSAL)
        page = int(mem_pool_host.page_size)
        probe = mem_pool_host.alloc(page) if hasattr(mem_pool_host, "alloc") else None
        try:
            idx = probe if probe is not None else _first_page(page)
            ptrs, sizes = mem_pool_host.get_page_buffer_meta(idx)
        finally:
            if probe is not None:
                mem_pool_host.free(probe)
        row = int(sizes[0])
        if any(int(s) != row for s in sizes):
            raise ValueError(f"host pool layout {mem_pool_host.layout!r} has unequal page parts {set(sizes)}")
        if not buf.is_contiguous() or buf.device.type != "cpu":
            raise ValueError(
                f"host pool buffer must be one contiguous CPU tensor, got {buf.device} {buf.stride()}"
            )
        flat = buf.reshape(-1).view(_torch_uint8())  # a view of the pool's own memory (contiguous)
        nbytes = flat.numel()
        if nbytes % row:
            raise ValueError(f"host pool buffer of {nbytes} bytes is not a whole number of {row}-byte rows")
        self._base = int(flat.data_ptr())
        self._row_bytes = row
        self._rows_per_page = len(ptrs)
        rows = memoryview(flat.numpy()).cast("B", (nbytes // row, row))
        cfg = self.storage_config
        layout = (
            f"sglang|{mem_pool_host.layout}|{mem_pool_host.dtype}|row={row}|parts={len(ptrs)}"
            f"|pp={cfg.pp_rank}/{cfg.pp_size}|cp={cfg.attn_cp_rank}/{cfg.attn_cp_size}"
            f"|dcp={cfg.dcp_rank}/{cfg.dcp_size}"
        )
        if not cfg.is_mla_model:
            layout += f"|tp={cfg.tp_rank}/{cfg.tp_size}"
        self.namespace = make_namespace(
            cfg.model_name or "",
            block_size=page,
            dtype=str(mem_pool_host.dtype),
            layout=layout,
            cache_salt=self.tenant,
        )
        self.io = BufferTier(
            self.tier_config,
            rows=rows,
            namespace=self.namespace.root.hex(),
            deadline=self.deadline,
            name="sglang",
            plugins=self._plugins,
        )

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        raise ValueError(f"{V2_REFUSAL} (pool {host_pool_name!s})")

    # -- keys and rows -------------------------------------------------------------------------
    def _block_keys(self, keys: Sequence[str]) -> list[BlockKey]:
        assert self.namespace is not None
        n = self._rows_per_page
        return self.namespace.wrap_engine_hashes(f"{k}#{part}".encode() for k in keys for part in range(n))

    def _rows(self, host_indices: Any, n_keys: int) -> npt.NDArray[np.int64] | None:
        """Row of each page part SGLang names (``None`` when one is outside the registered pool);
        vectorized: this runs on every transfer."""
        assert self.io is not None
        ptrs, _sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if len(ptrs) != n_keys * self._rows_per_page:
            return None
        off = np.asarray(ptrs, dtype=np.int64) - self._base
        rows, rem = np.divmod(off, self._row_bytes)
        if off.size and (off.min() < 0 or rem.any() or rows.max() >= self.io.num_rows):
            return None
        return rows

    def _page_results(
        self, keys: Sequence[str], bkeys: list[BlockKey], ok: frozenset[BlockKey]
    ) -> list[bool]:
        if len(ok) == len(bkeys):  # the usual case: every row moved (ok holds only bkeys' keys)
            return [True] * len(keys)
        n = self._rows_per_page
        return [all(b in ok for b in bkeys[i * n : (i + 1) * n]) for i in range(len(keys))]

    # -- the v1 (zero-copy) interface ---------------------------------------------------------
    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """Length of the leading run of pages whose every row the tier holds."""
        if self.io is None or not keys:
            return 0
        try:
            bkeys = self._block_keys(keys)
            held = self.io.exists(bkeys, stop_at_miss=True)
        except Exception:
            logger.exception("kvtier: existence check failed (answered as misses)")
            return 0
        n = self._rows_per_page
        for i in range(len(keys)):
            if not all(held[i * n : (i + 1) * n]):
                return i
        return len(keys)

    def batch_get_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        return self._transfer(keys, host_indices, load=True)

    def batch_set_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        if not self.storage_config.is_storage_writer:
            return [True] * len(keys)  # another rank stores the shared (MLA) pages
        return self._transfer(keys, host_indices, load=False)

    def _transfer(self, keys: list[str], host_indices: Any, *, load: bool) -> list[bool]:
        if self.io is None or not keys:
            return [False] * len(keys)
        try:
            rows = self._rows(host_indices, len(keys))
            if rows is None:
                logger.warning(
                    "kvtier: host indices outside the registered pool; %d pages not moved", len(keys)
                )
                return [False] * len(keys)
            bkeys = self._block_keys(keys)
            ok = self.io.run(bkeys, rows, load=load)
            return self._page_results(keys, bkeys, ok)
        except Exception:
            logger.exception("kvtier: %s failed (answered as misses)", "load" if load else "store")
            return [False] * len(keys)

    # -- the legacy tensor interface (one copy per page) ---------------------------------------
    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        got = self.batch_get([key], [target_location])
        return got[0] if isinstance(got, list) else None

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> Any:
        """Load each page into a free page of the host pool, then copy it into the flat tensor."""
        out: list[Any] = [None] * len(keys)
        if self.io is None or target_locations is None:
            return out
        for i, (key, dst) in enumerate(zip(keys, target_locations, strict=False)):
            idx = self._scratch_page()
            if idx is None:
                break
            try:
                if self._transfer([key], idx, load=True)[0]:
                    page = self.mem_pool_host.get_data_page(idx[0], flat=True)
                    dst.copy_(page.reshape(dst.shape).to(dst.dtype))
                    out[i] = dst
            except Exception:
                logger.exception("kvtier: legacy get of %s failed", key)
            finally:
                self.mem_pool_host.free(idx)
        return out

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return bool(self.batch_set([key], [value]))

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        """Copy each flat page into a free page of the host pool, then store it."""
        if self.io is None or values is None:
            return False
        if not self.storage_config.is_storage_writer:
            return True
        for key, value in zip(keys, values, strict=False):
            idx = self._scratch_page()
            if idx is None:
                return False
            try:
                self.mem_pool_host.set_from_flat_data_page(int(idx[0]), value)
                if not self._transfer([key], idx, load=False)[0]:
                    return False
            except Exception:
                logger.exception("kvtier: legacy set of %s failed", key)
                return False
            finally:
                self.mem_pool_host.free(idx)
        return True

    def _scratch_page(self) -> Any:
        try:
            return self.mem_pool_host.alloc(int(self.mem_pool_host.page_size))
        except Exception:
            return None

    # -- the rest ------------------------------------------------------------------------------
    def clear(self) -> None:
        """Not supported: kvtier tiers may be shared; drop blocks with the tier's own tools."""
        logger.warning("kvtier: clear() leaves the tier as it is (it may be shared)")

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics``: pages moved per call and bandwidth (GB/s) since the last call."""
        from sglang.srt.observability.metrics_collector import StorageMetrics

        m = StorageMetrics()
        if self.io is None:
            return m
        stores, loads = self.io.take_timings()
        per_page = max(self._rows_per_page, 1)
        for blocks, seconds in stores:
            m.backup_pgs.append(blocks // per_page)
            m.backup_bandwidth.append(blocks * self._row_bytes / max(seconds, 1e-9) / 1e9)
        for blocks, seconds in loads:
            m.prefetch_pgs.append(blocks // per_page)
            m.prefetch_bandwidth.append(blocks * self._row_bytes / max(seconds, 1e-9) / 1e9)
        return m

    def kvtier_stats(self) -> dict[str, Any]:
        """The adapter's and the tier's counters (blocks, bytes, failed and timed-out jobs)."""
        return self.io.stats() if self.io is not None else {}

    def close(self) -> None:
        if self.io is not None:
            self.io.close()


def _plugins(raw: Any) -> Any:
    if raw is None:
        return None
    from kvtier.config import load_config

    if not isinstance(raw, Mapping):
        raise ConfigError("hicache-storage-backend-extra-config.plugins", f"expected an object, got {raw!r}")
    return load_config({"plugins": dict(raw)}).plugins


def _first_page(page: int) -> Any:
    import torch

    return torch.arange(page, dtype=torch.int64)


def _torch_uint8() -> Any:
    import torch

    return torch.uint8
