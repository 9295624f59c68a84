"""kvtier's whole engine as vLLM's offloading spec: ``spec_name`` + ``spec_module_path``.

Supported on vLLM 0.32, 0.33 and 0.34 (:mod:`.compat`; any other vLLM is refused when vLLM's
factory builds the spec). On 0.32, which never calls ``on_reset_flushed``, the chunks fenced at a
``reset_cache`` are released when a transfer prepared after the reset completes.

vLLM's ``OffloadingSpecFactory`` loads it with no registration and no patch::

    "kv_connector": "OffloadingConnector",
    "kv_connector_extra_config": {
        "spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.integrations.vllm_spec",
        "cpu_bytes_to_use": 10737418240,
        "kvtier": {"eviction_policy": "s3fifo", "write_policy": "write_back",
                   "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/nvme/kv", "max_bytes": "200GiB"}]}}

``kvtier`` is kvtier's own config (a mapping, or the path of a JSON/YAML kvtier config file), read by
:func:`kvtier.config.load_config`: eviction policy, write policy, secondary tiers, cost model,
promotion share, ``cache_salt``, ``metrics_port`` ... The primary tier's size and shape come from
vLLM (see :func:`engine_config`), so ``cpu_bytes_to_use``, ``block_bytes``, ``primary_backing``,
``shm_name`` and ``model`` are refused there, and so are vLLM's own primary-tier and tiering keys at
the top of ``kv_connector_extra_config`` (they would configure nothing here).

Where each half runs (vLLM 0.33 source; ``docs/vllm.md`` has the lines):
    * **Workers** (one process per GPU) keep vLLM's code: ``get_worker``/``create_worker`` are
      ``TieringOffloadingSpec``'s, which map the shared region ``/dev/shm/vllm_offload_<engine_id>``
      and copy GPU blocks to and from its chunks with vLLM's ``CPUOffloadingWorker``.
    * **Scheduler** (the engine-core process): :meth:`KvtierOffloadingSpec.get_manager` maps the same
      region (as ``TieringOffloadingSpec`` does for its own primary tier) and runs a kvtier
      :class:`~kvtier.engine.Engine` on it with the ``external`` backing: kvtier slot ``i`` is vLLM's
      CPU chunk ``i``, so the ``CPULoadStoreSpec`` chunk ids the manager returns are kvtier slot ids,
      and kvtier's secondary tiers read and write the very bytes the workers copy.

Importing this module imports vLLM (the ``vllm`` install).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Any, cast

from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtier.config import load_config
from kvtier.config.vllm import spec_block, vllm_namespace
from kvtier.engine import Engine, EngineEvent, LoadHandle, StoreHandle
from kvtier.errors import ConfigError
from kvtier.integrations.vllm import compat
from kvtier.integrations.vllm.hints import PinHint, pin_hint
from kvtier.integrations.vllm.logonce import log_once
from kvtier.integrations.vllm.teardown import collect_cycles
from kvtier.keys import BlockKey, LookupCode
from kvtier.plugins import create_policy

__all__ = ["KvtierOffloadingManager", "KvtierOffloadingSpec", "engine_config"]

log = logging.getLogger("kvtier.integrations.vllm_spec")

_LOOKUP = {
    int(LookupCode.MISS): LookupResult.MISS,
    int(LookupCode.HIT): LookupResult.HIT,
    int(LookupCode.HIT_PENDING): LookupResult.HIT_PENDING,
    int(LookupCode.RETRY): LookupResult.RETRY,
}


def engine_config(offloading_config: Any, *, num_chunks: int, kv_bytes_per_chunk: int) -> dict[str, Any]:
    """The kvtier config of the engine behind one vLLM ``OffloadingConfig``.

    The user's ``kvtier`` block plus what vLLM decides: ``num_chunks`` slots of
    ``kv_bytes_per_chunk`` bytes (vLLM's rounded-up chunk, every worker's page side by side), a
    ``model`` that carries :func:`~kvtier.config.vllm.vllm_namespace`'s fingerprint (model, dtype, KV
    groups, chunk size, parallel layout), so a layout change never reuses old blocks, and, with a
    ``cost_model``, ``tokens_per_block`` = tokens of one chunk unless given. Raises a one-line
    :class:`~kvtier.errors.ConfigError` naming the key for anything that would configure nothing.
    """
    cfg = spec_block(offloading_config.extra_config)
    ns = vllm_namespace(offloading_config, row_bytes=kv_bytes_per_chunk)
    cfg["model"] = f"{offloading_config.model.name}#vllm-{ns.fingerprint.hex()}"
    cfg["cpu_bytes_to_use"] = num_chunks * kv_bytes_per_chunk
    cfg["block_bytes"] = kv_bytes_per_chunk
    if isinstance(cfg.get("cost_model"), Mapping):
        cost = dict(cfg["cost_model"])
        cost.setdefault("tokens_per_block", ns.block_size)
        cfg["cost_model"] = cost
    return cfg


class KvtierOffloadingSpec(TieringOffloadingSpec):  # type: ignore[misc,unused-ignore]
    """vLLM's tiering spec with kvtier's engine as the scheduler-side manager.

    Inherits, unchanged, vLLM's sizing (``cpu_bytes_to_use`` -> ``num_chunks`` chunks of
    ``kv_bytes_per_chunk`` bytes) and the worker side (``get_worker``); replaces ``get_manager``.
    """

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        # get_stats reports nothing to vLLM; kvtier's counters go to its own exporter (metrics_port).
        return {}

    @classmethod
    def config_info_keys(cls, extra_config: dict[str, Any]) -> tuple[str, ...]:
        return ()

    def __init__(self, config: Any) -> None:
        compat.require_supported_vllm()
        super().__init__(config)
        # Checked here, in every process, so a bad config fails at start rather than at first use.
        self.kvtier_config = engine_config(
            config, num_chunks=self.num_chunks, kv_bytes_per_chunk=self.kv_bytes_per_chunk
        )
        # The policy name is resolved (plug-in registry) here too: a typo fails at start as well.
        create_policy(load_config(self.kvtier_config), max(1, self.num_chunks))

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            # The workers created the region before the scheduler exists (vLLM builds the KV caches,
            # then the scheduler); rank=None maps the whole region, as TieringOffloadingSpec does.
            region = SharedOffloadRegion(
                engine_id=self._engine_id,
                num_chunks=self.num_chunks,
                rank=None,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
            try:
                engine = Engine(self.kvtier_config, primary_buffer=region.create_kv_memoryview())
            except BaseException:
                region.cleanup()
                raise
            self._scheduler_mmap = region
            self._manager = KvtierOffloadingManager(
                engine, region, enable_events=self.kv_events_config.enable_kv_cache_events
            )
            log.info(
                "kvtier: KvtierOffloadingSpec: %d chunks of %d bytes, policy %s, %s, %d secondary tier(s)",
                self.num_chunks,
                self.kv_bytes_per_chunk,
                engine.config.eviction_policy,
                engine.config.write_policy,
                len(engine.tiers),
            )
        manager: OffloadingManager = self._manager
        return manager


class KvtierOffloadingManager(OffloadingManager):  # type: ignore[misc,unused-ignore]
    """vLLM's scheduler-side ``OffloadingManager`` contract, answered by a kvtier :class:`Engine`.

    vLLM 0.33's ``OffloadingConnectorScheduler`` calls it from the scheduler thread only (this
    manager starts no thread, so ``lock`` stays vLLM's no-op default; the engine has its own lock).
    Every call is non-blocking except ``shutdown``. The engine's write policy, eviction policy,
    admission (promotion share, cost gate) and secondary tiers apply as they do anywhere else.

    vLLM names the blocks of a finished transfer by its key set (``complete_store(keys)``,
    ``complete_load(keys)``), the engine by handle: the manager keeps the open handles by key set.
    """

    def __init__(self, engine: Engine, region: Any = None, *, enable_events: bool = False) -> None:
        self.engine = engine
        self._region = region
        self._enable_events = enable_events
        self._stores: dict[frozenset[bytes], list[StoreHandle]] = {}
        self._loads: dict[frozenset[bytes], list[LoadHandle]] = {}
        # Handles of jobs vLLM dropped at reset_cache: their slots stay reserved until the workers
        # stop touching them (on_reset_flushed).
        self._fenced: list[StoreHandle | LoadHandle] = []
        # A HIT stays loadable until the step ends: vLLM asks chunk by chunk and pins a request's
        # hits (prepare_load) only after its last lookup, so a promotion started by a later chunk's
        # lookup must not evict an earlier chunk it was just told is a HIT.
        self._step_pins: list[LoadHandle] = []
        # A waiting request keeps what it was told is there until it is admitted: vLLM rescans a
        # deferred request's prefix each step and pins its hits only at admission (prepare_load), so
        # without this hold another request's promotion or store evicts blocks promoted for it (the
        # tier loads them again, or the request is admitted without them and recomputes: the
        # "missed hit", docs/vllm.md). Keys: req_id -> block -> its pin; awaited: block whose
        # promotion a request is waiting for -> those requests (pinned the step it lands).
        self._held: dict[str, dict[bytes, LoadHandle]] = {}
        self._awaited: dict[bytes, set[str]] = {}
        self._landed: list[EngineEvent] = []
        self._log: list[EngineEvent] = []
        self._closed = False
        #: Requests whose ``kv_hints`` held a malformed ``kvtier.pin`` action (ignored, logged once).
        self.bad_hints = 0
        # vLLM asks one chunk at a time and ends each step with on_schedule_end (which polls): the
        # step's promotions from one tier go out there as one load job (vLLM's tiering manager
        # batches the same way), not one job per chunk.
        engine.coalesce_promotions = True
        engine.subscribe(self._log.append)
        engine.subscribe(self._note_landed)

    # -- requests, lookups -------------------------------------------------------------------
    def on_new_request(self, req_context: Any) -> RequestOffloadingContext:
        """Read the request's ``kv_hints`` once: a ``kvtier.pin`` action (:mod:`.hints`) is kept
        on the context (``ReqContext.set_state``, vLLM's per-request scratch space), so the blocks
        the request hits or stores are pinned for its TTL. A malformed hint is logged and ignored."""
        hints = getattr(req_context, "kv_hints", None)
        if hints is not None and hasattr(req_context, "set_state"):
            try:
                hint = pin_hint(hints, self.engine.timed_pins.max_ttl_s)
            except ConfigError as exc:
                self.bad_hints += 1
                log_once(f"kv_hints:{exc.key_path}", "kvtier: kv_hints ignored: %s", exc)
            else:
                if hint is not None:
                    req_context.set_state(hint)
        return RequestOffloadingContext()

    def _pin(self, keys: list[BlockKey], req_context: Any) -> None:
        """Pin ``keys`` for the request's ``kvtier.pin`` TTL, if it gave one."""
        get_state = getattr(req_context, "get_state", None)
        hint = get_state(PinHint) if get_state is not None else None
        if hint is not None and keys:
            self.engine.pin_for(keys, hint.ttl_s)

    def lookup(self, key: OffloadKey, req_context: Any) -> LookupResult:
        """HIT (readable now), HIT_PENDING (being written or promoted), RETRY or MISS.

        vLLM asks one chunk at a time; a chunk found in a secondary tier gets its promotion here
        (its slot reserved, the load staged: the step's promotions from one tier are handed over as
        one job at ``on_schedule_end``) unless admission refuses it (budget, cost gate), and answers
        HIT_PENDING: vLLM then asks again on a later step. A HIT is pinned for the request until it is
        admitted (its ``prepare_load`` or first ``prepare_store``) or finishes, and a block it waits
        for is pinned for it the step its promotion lands; without a request id, until the step ends.
        """
        answer = _LOOKUP[self.engine.lookup([BlockKey(key)]).codes[0]]
        self._hold_promoted()
        req_id = getattr(req_context, "req_id", None)
        if req_id is None:
            if answer is LookupResult.HIT:
                self._step_pins.append(self.engine.prepare_load([BlockKey(key)]))
            return answer
        if answer is LookupResult.HIT:
            held = self._held.setdefault(req_id, {})
            if bytes(key) not in held:
                held[bytes(key)] = self.engine.prepare_load([BlockKey(key)])
            self._pin([BlockKey(key)], req_context)
        elif answer is LookupResult.HIT_PENDING:
            self._awaited.setdefault(bytes(key), set()).add(req_id)
        return answer

    def _note_landed(self, event: EngineEvent) -> None:
        # Called from inside the engine: only note it; the pins are taken outside (_hold_promoted).
        if event.kind == "promoted" and self._awaited:
            self._landed.append(event)

    def _hold_promoted(self) -> None:
        """Pin each block that landed since the last call for the requests waiting for it."""
        landed, self._landed = self._landed, []
        for e in landed:
            for key in e.keys:
                for req_id in self._awaited.pop(bytes(key), ()):
                    held = self._held.setdefault(req_id, {})
                    if bytes(key) not in held:
                        held[bytes(key)] = self.engine.prepare_load([BlockKey(key)])

    def _release_request(self, req_id: str | None) -> None:
        """The request was admitted or finished: its lookup holds go (its loads pin what it uses)."""
        if req_id is None:
            return
        for handle in self._held.pop(req_id, {}).values():
            self.engine.complete_load(handle)
        if self._awaited:
            for key in [k for k, reqs in self._awaited.items() if req_id in reqs]:
                self._awaited[key].discard(req_id)
                if not self._awaited[key]:
                    del self._awaited[key]

    def _release_all_requests(self) -> None:
        for req_id in list(self._held):
            self._release_request(req_id)
        self._awaited.clear()

    def on_request_finished(self, req_context: Any) -> None:
        self._release_request(getattr(req_context, "req_id", None))

    def get_load_source(self, key: OffloadKey, req_context: Any) -> CacheHitSource:
        # Only blocks already in the primary (host) tier are ever loaded to the GPU.
        return CacheHitSource.HOST

    # -- loads -------------------------------------------------------------------------------
    def prepare_load(self, keys: Collection[OffloadKey], req_context: Any) -> CPULoadStoreSpec:
        handle = self.engine.prepare_load(_ours(keys))
        self._loads.setdefault(frozenset(handle.keys), []).append(handle)
        # The load pins what the request uses: its lookup holds can go now.
        self._release_request(getattr(req_context, "req_id", None))
        return CPULoadStoreSpec(handle.slots)

    def touch(self, keys: Collection[OffloadKey], req_context: Any) -> None:
        # vLLM 0.33's scheduler never calls touch (lookup is its only recency signal, and the
        # engine's lookup already touches every primary hit in the policy).
        return

    def complete_load(self, keys: Collection[OffloadKey], req_context: Any) -> None:
        handle = _pop(self._loads, keys)
        if handle is not None:
            self.engine.complete_load(handle)
            self._after_reset_progress()

    # -- stores ------------------------------------------------------------------------------
    def prepare_store(self, keys: Collection[OffloadKey], req_context: Any) -> PrepareStoreOutput | None:
        """Reserve a slot (vLLM chunk) for every key not yet in the primary tier.

        Evicts through the engine's policy (write-back victims are flushed to the tiers first).
        Returns ``None`` (vLLM retries later) when keys needed a slot and none got one; keys that
        did not fit in a partial reservation are left out of ``keys_to_store`` (counted in the
        engine's ``dropped_stores``).
        """
        # A request that stores was admitted: what it held while waiting is evictable again.
        self._release_request(getattr(req_context, "req_id", None))
        mark = len(self._log)
        handle = self.engine.prepare_store(_ours(keys))
        new = self._log[mark:]
        if not handle.keys and any(e.kind == "dropped" for e in new):
            self.engine.complete_store(handle, success=False)
            return None
        evicted = [k for e in new if e.kind == "evicted" and e.tier is None for k in e.keys]
        if not self._enable_events:
            del self._log[:]  # vLLM drains take_events only when it publishes KV events
        if handle.keys:
            self._stores.setdefault(frozenset(handle.keys), []).append(handle)
        else:
            self.engine.complete_store(handle)  # nothing reserved: close the empty handle
        # vLLM pairs the i-th chunk id with the i-th GPU block it gathers, in the order of the keys
        # it offered (scheduler.py 1850-2056): hand the accepted keys back in that order.
        order = sorted(range(len(handle.keys)), key=handle.positions.__getitem__)
        return PrepareStoreOutput(
            keys_to_store=_theirs([handle.keys[i] for i in order]),
            store_spec=CPULoadStoreSpec([int(handle.slots[i]) for i in order]),
            evicted_keys=_theirs(evicted),
        )

    def complete_store(self, keys: Collection[OffloadKey], req_context: Any, success: bool = True) -> None:
        """The workers copied the blocks into their chunks: READY, then the write policy runs."""
        handle = _pop(self._stores, keys)
        if handle is not None:
            self.engine.complete_store(handle, success)
            if success:
                self._pin(handle.keys, req_context)
            self._after_reset_progress()

    # -- steps, events -----------------------------------------------------------------------
    def on_schedule_end(self, context: Any) -> None:
        """Release the step's lookup pins; collect finished tier jobs (promotions become readable,
        stored blocks unpin)."""
        self._release_step_pins()
        self.engine.poll()
        self._hold_promoted()
        if not self._enable_events:
            del self._log[:]

    def _release_step_pins(self) -> None:
        pins, self._step_pins = self._step_pins, []
        for handle in pins:
            self.engine.complete_load(handle)

    def has_pending_work(self) -> bool:
        """True while a tier job is in flight, so vLLM keeps stepping (and polling) when idle."""
        self.engine.poll()
        self._hold_promoted()
        return self.engine.inflight_jobs > 0

    def take_events(self) -> Iterable[OffloadingEvent]:
        """The primary tier's block events (stored / removed), when vLLM publishes KV events."""
        events, self._log[:] = list(self._log), []
        if not self._enable_events:
            return
        for e in events:
            if e.tier is not None and e.kind != "promoted":
                continue  # a secondary tier's own state: not this (CPU) medium's
            if e.kind in ("stored", "promoted"):
                yield OffloadingEvent(keys=_theirs(e.keys), medium=Medium.CPU, removed=False)
            elif e.kind in ("evicted", "reset"):
                yield OffloadingEvent(keys=_theirs(e.keys), medium=Medium.CPU, removed=True)

    # -- reset, shutdown ---------------------------------------------------------------------
    def reset_cache(self) -> None:
        """Drop every block; blocks of transfers in flight go once the workers are done with them.

        vLLM never completes the jobs in flight at a reset (they are stale to it), but its workers
        may still copy into their chunks until ``on_reset_flushed``, so those slots stay reserved.
        """
        self._release_step_pins()  # reset_cache never runs inside a step (scheduler.py 2401-2407)
        self._release_all_requests()
        self._landed.clear()
        for book in (self._stores, self._loads):
            for handles in book.values():
                self._fenced.extend(handles)
            book.clear()
        self.engine.reset()

    def _after_reset_progress(self) -> None:
        """vLLM 0.32: release the slots fenced at a reset once a later transfer has completed.

        0.32 never calls ``on_reset_flushed``: its ``reset_cache`` has the workers wait for the
        dropped jobs at the start of the next step (``jobs_to_flush``, ``offloading/worker.py``
        236-244) and discards their completions. Books are emptied at the reset, so any handle
        completed here was prepared after it; its workers ran the flush step first, so no dropped
        job still copies. Without traffic the slots stay reserved, which is safe.
        """
        if self._fenced and not compat.HAS_RESET_FLUSHED:
            self.on_reset_flushed()

    def on_reset_flushed(self) -> None:
        fenced, self._fenced = self._fenced, []
        for handle in fenced:
            if isinstance(handle, StoreHandle):
                self.engine.complete_store(handle, success=False)
            else:
                self.engine.complete_load(handle)
        if fenced:
            self.engine.reset()

    def shutdown(self) -> None:
        """Close the engine (write-back flush, drain, tiers shut down), then unmap the region."""
        if self._closed:
            return
        self._closed = True
        try:
            self.engine.close()
        except Exception:
            log.exception("kvtier: closing the engine failed")
        finally:
            self._stores.clear()
            self._loads.clear()
            self._fenced.clear()
            self._step_pins.clear()
            self._held.clear()
            self._awaited.clear()
            # The engine and its tiers hold numpy views of the region (in reference cycles); vLLM's
            # cleanup keeps a mapping that still has exports, so let them go first (frozen too).
            del self.engine
            collect_cycles()
            if self._region is not None:
                with contextlib.suppress(Exception):
                    self._region.cleanup()


def _ours(keys: Iterable[OffloadKey]) -> list[BlockKey]:
    """vLLM's keys (block hash + 4-byte group index) are kvtier keys as they are: bytes."""
    return cast(list[BlockKey], list(keys))


def _theirs(keys: Iterable[BlockKey]) -> list[OffloadKey]:
    return cast(list[OffloadKey], list(keys))


def _pop(book: dict[frozenset[bytes], list[Any]], keys: Collection[OffloadKey]) -> Any:
    """The oldest open handle for exactly ``keys`` (``None`` for a job vLLM no longer tracks)."""
    key_set = frozenset(keys)
    handles = book.get(key_set)
    if not handles:
        log.debug("kvtier: completion for %d keys with no open transfer (after a reset?)", len(key_set))
        return None
    handle = handles.pop(0)
    if not handles:
        del book[key_set]
    return handle
