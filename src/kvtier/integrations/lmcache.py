"""kvtier as an LMCache L2 adapter (LMCache 0.5.6, multi-process mode, ``--l2-adapter`` ``plugin``).

LMCache's plug-in factory imports :class:`KvtierL2Adapter` from the ``--l2-adapter`` JSON
(``{"type": "plugin", "module_path": "kvtier.integrations.lmcache", "class_name":
"KvtierL2Adapter", "adapter_params": {...}}``), finds :class:`KvtierL2AdapterConfig` by its name
(``class_name + "Config"``, or ``config_class_name``), builds it with ``from_dict(adapter_params)``
and calls ``KvtierL2Adapter(config, l1_memory_desc=...)``. ``adapter_params``:

* ``tier`` (required): one kvtier ``secondary_tiers`` entry (``{"type": "fs", "root_dir": ...}``,
  ``{"type": "redis", "url": "redis://127.0.0.1:6379/0"}``, an out-of-tree tier by ``module_path``
  under ``plugins``).
* ``tenant``: a salt mixed into every key next to LMCache's own ``cache_salt`` (default ``""``).
* ``deadline``: seconds an existence check may wait for a tier that does not know yet (default 5).

The task model mapped onto kvtier's jobs:

* Each ``submit_*`` returns a task id at once; the work is a kvtier job (store, load) or an
  existence check on a worker thread. When it finishes, the result is recorded and the task's own
  eventfd (three distinct eventfds: store, lookup-and-lock, load) is signalled exactly once per task.
* Zero copy: LMCache's L1 arena (``l1_memory_desc``) is viewed as rows of one object's size
  starting at every ``align_bytes`` boundary (LMCache's allocator starts every object on one), so
  the tier reads and writes each object in place. Without an arena (or for an object outside it),
  the object is staged through a buffer the adapter owns (one copy).
* Lookup-and-lock answers a bitmap of the keys the tier holds and counts a lock per hit key; the
  tier is told the keys were just used (its eviction keeps them longest) and so are LMCache's
  listeners (``_notify_keys_accessed``). ``submit_unlock`` only drops counts (it cannot fail).
  A key evicted despite a lock loads as a miss (bit 0), which LMCache handles.
* Capacity: kvtier tiers bound themselves (``max_bytes``), so ``max_capacity_bytes`` is 0 (LMCache's
  global L2 eviction off); ``_notify_keys_stored`` fires once per newly stored key with its size,
  ``_notify_keys_deleted`` when a key this adapter stored turns out gone (a miss on lookup or load)
  or is deleted with :meth:`KvtierL2Adapter.delete` (which forgets it: kvtier tiers evict on their
  own and have no delete).
* Failures are results, never exceptions: a failed store is ``L2StoreResult(False, 0)``, a failed
  load or lookup a zero bit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase

from kvtier.errors import ConfigError
from kvtier.integrations.buffer_tier import BufferTier, check_deadline
from kvtier.keys import BlockKey, KeyNamespace, make_namespace

__all__ = ["KvtierL2Adapter", "KvtierL2AdapterConfig"]

logger = logging.getLogger(__name__)

_WHERE = "--l2-adapter.adapter_params"
_STAGED_ROWS = 64


class KvtierL2AdapterConfig(L2AdapterConfigBase):  # type: ignore[misc]
    """``adapter_params`` of the kvtier plug-in (see the module doc)."""

    def __init__(self, tier: Mapping[str, Any], tenant: str = "", deadline: float = 5.0, plugins: Any = None):
        self.tier = dict(tier)
        self.tenant = tenant
        self.deadline = deadline
        self.plugins = plugins

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KvtierL2AdapterConfig:
        tier = d.get("tier")
        if not isinstance(tier, Mapping) or "type" not in tier:
            raise ConfigError(
                f"{_WHERE}.tier", 'expected a kvtier tier entry such as {"type": "fs", "root_dir": "/mnt/kv"}'
            )
        tenant = d.get("tenant", "")
        if not isinstance(tenant, str):
            raise ConfigError(f"{_WHERE}.tenant", f"expected a string, got {tenant!r}")
        unknown = sorted(set(d) - {"tier", "tenant", "deadline", "plugins"})
        if unknown:
            raise ConfigError(
                f"{_WHERE}.{unknown[0]}", "unknown key (known: tier, tenant, deadline, plugins)"
            )
        plugins = d.get("plugins")
        if plugins is not None and not isinstance(plugins, Mapping):
            raise ConfigError(f"{_WHERE}.plugins", f"expected an object, got {plugins!r}")
        return cls(tier, tenant, check_deadline(f"{_WHERE}.deadline", d.get("deadline", 5.0)), plugins)

    @classmethod
    def help(cls) -> str:
        return (
            "kvtier L2 adapter fields: tier (a kvtier tier entry, required), tenant (str), "
            "deadline (seconds, default 5), plugins (kvtier's module_path trust boundary)"
        )


@dataclass(slots=True)
class _Group:
    """Objects of one size, all in LMCache's L1 arena or all staged: one tier job."""

    size: int
    in_arena: bool
    items: list[tuple[Any, Any, int]]  # (LMCache key, memory object, row)
    bkeys: list[BlockKey]


class KvtierL2Adapter(L2AdapterInterface):  # type: ignore[misc]
    """LMCache L2 adapter running one kvtier tier (see the module doc)."""

    def __init__(self, config: KvtierL2AdapterConfig | Mapping[str, Any], l1_memory_desc: Any = None) -> None:
        super().__init__(max_capacity_bytes=0)
        if not isinstance(config, KvtierL2AdapterConfig):
            config = KvtierL2AdapterConfig.from_dict(dict(config))
        self.config = config
        self._plugins = _plugins(config.plugins)
        self._arena = l1_memory_desc
        kinds = ("store", "lookup", "load")
        self._efd = {kind: os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for kind in kinds}
        #: Finished tasks not yet collected, per kind: task id -> result (signalled on ``_efd[kind]``).
        self._done: dict[str, dict[int, Any]] = {kind: {} for kind in kinds}
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        self._next_task = 1
        self._locks: dict[Any, int] = defaultdict(int)
        self._stored: dict[BlockKey, tuple[Any, int]] = {}  # notified as stored: ObjectKey, size
        self._tiers: dict[tuple[int, bool], BufferTier] = {}  # (object size, in arena) -> tier
        self._staging: dict[int, np.ndarray] = {}
        self._spaces: dict[str, KeyNamespace] = {}
        self._free_rows: dict[int, list[int]] = {}  # staging rows not in use, per object size
        self._checks = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvtier-l2-lookup")
        self._closed = False

    # -- eventfds ------------------------------------------------------------------------------
    def get_store_event_fd(self) -> int:
        return self._efd["store"]

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._efd["lookup"]

    def get_load_event_fd(self) -> int:
        return self._efd["load"]

    def _finish(self, kind: str, task: int, result: Any) -> None:
        """Record ``task``'s result and wake LMCache through the ``kind`` eventfd."""
        with self._lock:
            self._done[kind][task] = result
        with contextlib.suppress(OSError):  # closed while a late job reported
            os.eventfd_write(self._efd[kind], 1)

    def _take(self, kind: str, task: int) -> Any:
        """``task``'s result once it finished (then forgotten), else ``None``."""
        with self._lock:
            return self._done[kind].pop(task, None)

    # -- keys and rows -------------------------------------------------------------------------
    def _space(self, salt: str) -> KeyNamespace:
        ns = self._spaces.get(salt)
        if ns is None:
            # Tenant and LMCache's cache_salt both salt the chain root: two tenants never share.
            ns = make_namespace("lmcache", block_size=1, cache_salt=f"{self.config.tenant}\0{salt}")
            self._spaces[salt] = ns
        return ns

    def _block_key(self, key: Any, size: int) -> BlockKey:
        del size  # the tier serving one object size is its own namespace (see _tier)
        return self._space(key.cache_salt).wrap_engine_hash(_ident(key))

    def _block_keys(self, keys: Sequence[Any]) -> list[BlockKey]:
        """:meth:`_block_key` of each key; one batch per cache salt (every transfer wraps every
        key, and a task's keys nearly always share one salt)."""
        salts = {k.cache_salt for k in keys}
        if len(salts) != 1:
            return [self._block_key(k, 0) for k in keys]
        return self._space(salts.pop()).wrap_engine_hashes(_ident(k) for k in keys)

    def _tier(self, size: int, in_arena: bool) -> BufferTier:
        """The tier serving objects of ``size`` bytes (built on first use)."""
        with self._build_lock:  # the store and prefetch controllers may ask at once
            bt = self._tiers.get((size, in_arena))
            if bt is None:
                bt = self._build_tier(size, in_arena)
                self._tiers[(size, in_arena)] = bt
            return bt

    def _build_tier(self, size: int, in_arena: bool) -> BufferTier:
        if in_arena:
            arena = self._arena
            align = int(arena.align_bytes)
            n = (int(arena.size) - size) // align + 1
            # Row r starts at byte r * align_bytes and spans one object: overlapping rows, no copy.
            base = np.ndarray((int(arena.size),), dtype=np.uint8, buffer=_arena_buffer(arena))
            rows = np.lib.stride_tricks.as_strided(base, shape=(n, size), strides=(align, 1))
            view = rows.data
        else:
            staging = np.zeros((_STAGED_ROWS, size), dtype=np.uint8)
            self._staging[size] = staging
            self._free_rows[size] = list(range(_STAGED_ROWS))
            view = staging.data
        namespace = make_namespace(
            "lmcache", block_size=1, layout=f"object={size}", cache_salt=self.config.tenant
        )
        return BufferTier(
            self.config.tier, rows=view, namespace=namespace.fingerprint.hex(), deadline=self.config.deadline,
            name="lmcache", plugins=self._plugins,
        )  # fmt: skip

    def _row(self, obj: Any) -> int | None:
        """Arena row of ``obj``, or ``None`` when it is outside the arena (staged instead)."""
        arena = self._arena
        if arena is None:
            return None
        off = int(obj.data_ptr) - int(arena.ptr)
        align = int(arena.align_bytes)
        if off < 0 or off % align or off + obj.get_size() > int(arena.size):
            return None
        return off // align

    # -- store ---------------------------------------------------------------------------------
    def submit_store_task(self, keys: list[Any], objects: list[Any]) -> int:
        task = self._new_task()
        results: list[tuple[list[Any], list[int], bool]] = []  # per group: new keys, their sizes, all ok

        def stored(g: _Group, ok: frozenset[BlockKey]) -> None:
            new_keys, new_sizes = [], []
            with self._lock:
                for (k, _o, _r), b in zip(g.items, g.bkeys, strict=True):
                    if b in ok and b not in self._stored:
                        self._stored[b] = (k, g.size)
                        new_keys.append(k)
                        new_sizes.append(g.size)
            results.append((new_keys, new_sizes, len(ok) == len(g.bkeys)))

        def finish(started: bool) -> None:
            nk = [k for r in results for k in r[0]]
            ns = [s for r in results for s in r[1]]
            self._finish_store(task, started and all(r[2] for r in results), sum(ns), nk, ns)

        self._submit_groups(task, keys, objects, load=False, group_done=stored, finish=finish)
        return task

    def _finish_store(self, task: int, ok: bool, nbytes: int, keys: list[Any], sizes: list[int]) -> None:
        if keys:
            self._notify_keys_stored(keys, sizes)
        self._finish("store", task, L2StoreResult(ok, nbytes if ok else 0))

    def pop_completed_store_tasks(self) -> dict[int, Any]:
        with self._lock:
            done, self._done["store"] = self._done["store"], {}
        return done

    # -- lookup and lock -----------------------------------------------------------------------
    def submit_lookup_and_lock_task(self, keys: list[Any], group_layout_descs: Any = None) -> int:
        task = self._new_task()
        if self._closed:
            self._finish("lookup", task, Bitmap(len(keys)))
        else:
            self._checks.submit(self._lookup, task, list(keys), dict(group_layout_descs or {}))
        return task

    def _lookup(self, task: int, keys: list[Any], layouts: dict[int, Any]) -> None:
        bitmap = Bitmap(len(keys))
        gone: list[tuple[Any, int]] = []
        try:
            by_size: dict[int, list[tuple[int, BlockKey]]] = defaultdict(list)
            for i, key in enumerate(keys):
                for size in self._sizes_for(key, layouts):
                    by_size[size].append((i, self._block_key(key, size)))
            hit: set[int] = set()
            for size, items in by_size.items():
                bt = self._tier(size, self._arena is not None)
                answers = bt.exists([b for _i, b in items])
                for (i, b), held in zip(items, answers, strict=True):
                    if held:
                        hit.add(i)
                    else:
                        gone.extend(self._forget(b))
                bt.touch([b for (_i, b), h in zip(items, answers, strict=True) if h])
            with self._lock:
                for i in sorted(hit):
                    bitmap.set(i)
                    self._locks[keys[i]] += 1
        except Exception:
            logger.exception("kvtier L2: lookup task %d failed (answered as misses)", task)
        self._notify_gone(gone)
        found = [keys[i] for i in range(len(keys)) if bitmap.test(i)]
        if found:
            with contextlib.suppress(Exception):  # a listener's failure is not the lookup's
                self._notify_keys_accessed(found)
        self._finish("lookup", task, bitmap)

    def _sizes_for(self, key: Any, layouts: dict[int, Any]) -> list[int]:
        """Object sizes ``key`` may be stored under: its group's layout (LMCache passes it with
        every lookup) and every size this adapter has served."""
        sizes = {size for size, _arena in list(self._tiers)}
        desc = layouts.get(key.object_group_id)
        if desc is not None:
            with contextlib.suppress(Exception):
                sizes.add(
                    sum(
                        int(np.prod(tuple(sh))) * dt.itemsize
                        for sh, dt in zip(desc.shapes, desc.dtypes, strict=True)
                    )
                )
        return sorted(sizes)

    def query_lookup_and_lock_result(self, task_id: int) -> Any:
        return self._take("lookup", task_id)

    def submit_unlock(self, keys: list[Any]) -> None:
        with self._lock:
            for key in keys:
                n = self._locks.get(key, 0)
                if n <= 1:
                    self._locks.pop(key, None)
                else:
                    self._locks[key] = n - 1

    def locked_count(self, key: Any) -> int:
        """Locks ``key`` holds (lookups that found it minus unlocks)."""
        with self._lock:
            return self._locks.get(key, 0)

    # -- load ------------------------------------------------------------------------------------
    def submit_load_task(self, keys: list[Any], objects: list[Any]) -> int:
        task = self._new_task()
        bitmap = Bitmap(len(keys))
        lock = threading.Lock()
        index = {id(o): i for i, o in enumerate(objects)}

        def loaded(g: _Group, ok: frozenset[BlockKey]) -> None:
            gone: list[tuple[Any, int]] = []
            for (_k, o, r), b in zip(g.items, g.bkeys, strict=True):
                if b in ok:
                    if not g.in_arena:
                        dst = np.frombuffer(o.byte_array, dtype=np.uint8, count=g.size)
                        dst[:] = self._staging[g.size][r]
                    with lock:
                        bitmap.set(index[id(o)])
                else:
                    gone.extend(self._forget(b))
            self._notify_gone(gone)

        def finish(_started: bool) -> None:
            self._finish("load", task, bitmap)

        self._submit_groups(task, keys, objects, load=True, group_done=loaded, finish=finish)
        return task

    # -- transfers ---------------------------------------------------------------------------------
    def _submit_groups(
        self,
        task: int,
        keys: list[Any],
        objects: list[Any],
        *,
        load: bool,
        group_done: Callable[[_Group, frozenset[BlockKey]], None],
        finish: Callable[[bool], None],
    ) -> None:
        """One tier job per group of ``objects`` (by size and arena; staged objects are copied to
        their staging rows first for a store). ``group_done(group, keys transferred)`` runs as each
        job ends, before its staging rows are released; ``finish(True)`` once after the last (at
        once when there is nothing to move), ``finish(False)`` when the objects cannot be grouped."""
        what = "load" if load else "store"
        try:
            groups = self._group(keys, objects)
        except Exception:
            logger.exception("kvtier L2: %s task %d not started", what, task)
            finish(False)
            return
        if not groups:
            finish(True)
            return
        left = [len(groups)]
        lock = threading.Lock()
        for (size, in_arena), items in groups.items():
            bt = self._tier(size, in_arena)
            group = _Group(size, in_arena, items, self._block_keys([k for k, _o, _r in items]))
            rows = [r for _k, _o, r in items]
            if not load and not in_arena:
                for (_k, o, _r), r in zip(items, rows, strict=True):
                    self._staging[size][r, :] = np.frombuffer(o.byte_array, dtype=np.uint8, count=size)

            def done(ok: frozenset[BlockKey], g: _Group = group) -> None:
                group_done(g, ok)
                self._release(g.size, g.in_arena, g.items)
                with lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    finish(True)

            bt.submit(group.bkeys, rows, load=load, done=done)

    def query_load_result(self, task_id: int) -> Any:
        return self._take("load", task_id)

    # -- capacity, status, close ------------------------------------------------------------------
    def delete(self, keys: list[Any]) -> None:
        """Forget ``keys`` in LMCache's accounting (the tier evicts on its own; it has no delete)."""
        gone: list[tuple[Any, int]] = []
        with self._lock:
            for b, (k, size) in list(self._stored.items()):
                if k in keys:
                    del self._stored[b]
                    gone.append((k, size))
        self._notify_gone(gone)

    def _release(self, size: int, in_arena: bool, items: list[Any]) -> None:
        if not in_arena:
            with self._lock:
                self._free_rows[size].extend(r for _k, _o, r in items)

    def _forget(self, b: BlockKey) -> list[tuple[Any, int]]:
        with self._lock:
            entry = self._stored.pop(b, None)
        return [entry] if entry is not None else []

    def _notify_gone(self, gone: list[tuple[Any, int]]) -> None:
        if gone:
            self._notify_keys_deleted([k for k, _s in gone], [s for _k, s in gone])

    def report_status(self) -> dict[str, Any]:
        tiers = {
            f"{size}{'' if arena else ' staged'}": bt.stats() for (size, arena), bt in self._tiers.items()
        }
        failed = sum(int(s["tier"].get("failed_jobs", 0)) for s in tiers.values())
        with self._lock:
            return {
                "is_healthy": not self._closed,
                "type": "KvtierL2Adapter",
                "tier": self.config.tier.get("type"),
                "stored_keys": len(self._stored),
                "locked_keys": len(self._locks),
                "failed_jobs": failed,
                "tiers": tiers,
            }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._checks.shutdown(wait=True)
        for bt in list(self._tiers.values()):
            bt.close()
        for fd in self._efd.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- internals ---------------------------------------------------------------------------------
    def _new_task(self) -> int:
        with self._lock:
            task = self._next_task
            self._next_task += 1
            return task

    def _group(
        self, keys: Sequence[Any], objects: Sequence[Any]
    ) -> dict[tuple[int, bool], list[tuple[Any, Any, int]]]:
        """``(size, in arena) -> [(key, object, row)]``; staged objects get staging rows."""
        if len(keys) != len(objects):
            raise ValueError(f"{len(keys)} keys but {len(objects)} objects")
        groups: dict[tuple[int, bool], list[tuple[Any, Any, int]]] = defaultdict(list)
        pairs = [
            (key, obj, int(obj.get_size()), self._row(obj)) for key, obj in zip(keys, objects, strict=True)
        ]
        for size in {size for _k, _o, size, row in pairs if row is None}:
            self._tier(size, False)
        taken: list[tuple[int, int]] = []
        with self._lock:
            for key, obj, size, row in pairs:
                if row is None:
                    free = self._free_rows[size]
                    if not free:
                        for sz, r in taken:
                            self._free_rows[sz].append(r)
                        raise ValueError(
                            f"more than {_STAGED_ROWS} objects of {size} bytes outside the L1 arena in flight"
                        )
                    row = free.pop()
                    taken.append((size, row))
                    groups[(size, False)].append((key, obj, row))
                else:
                    groups[(size, True)].append((key, obj, row))
        return dict(groups)


def _ident(key: Any) -> bytes:
    """The bytes that name one LMCache ``ObjectKey`` within its cache salt."""
    return f"{key.model_name}@{key.kv_rank}@{key.object_group_id}@".encode() + bytes(key.chunk_hash)


def _arena_buffer(arena: Any) -> Any:
    """A writable buffer over LMCache's L1 arena (its base address and size)."""
    import ctypes

    return (ctypes.c_uint8 * int(arena.size)).from_address(int(arena.ptr))


def _plugins(raw: Any) -> Any:
    if raw is None:
        return None
    from kvtier.config import load_config

    return load_config({"plugins": dict(raw)}).plugins
