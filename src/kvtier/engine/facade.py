"""The tiering engine: the one object an inference engine talks to.

:class:`Engine` orchestrates the :class:`~kvtier.primary.PrimaryTier` (slots, states, pins), its
:class:`~kvtier.policies.base.CachePolicy` and the ordered secondary tiers. Everything slow is a job;
no method blocks except :meth:`Engine.drain` and :meth:`Engine.close`. All state changes happen under
one lock, taken once per call (batched calls, no per-key objects), so the simulate path costs about
a microsecond per block.

The facade owns the API, the lock, the counters and the open handles; the work is done by
components that never hold it (each module's docstring says what it owns)::

    Engine ─┬─ PrimaryTier            slots, states, pins, the eviction policy   (kvtier.primary)
            ├─ TenantScope            tenant-scoped internal keys                (engine.tenants)
            ├─ EventLog               event queue, subscribers                   (engine.events)
            ├─ Residency              which blocks the tiers hold                (engine.residency)
            ├─ JobBook                tier jobs: submit, finish once, drain      (engine.jobs)
            ├─ Latency                per-tier operation latency histograms      (engine.latency)
            ├─ TierWrites             per-tier write policies, slot reservation  (engine.writes)
            ├─ Admission              promotion share, cost gate                 (engine.admission)
            ├─ Serving                residency checks and pins for peers        (engine.serving)
            └─ KVMover                byte copies, the transfer pool             (engine.movers)

and are built once by :mod:`kvtier.engine.build` (policy, tiers, cost model, metrics). The job book,
the write policies, admission, the mover and the stats snapshot share one
:class:`~kvtier.engine.parts.Parts` (primary tier, tiers, counters, lock, clock, ``emit``...).

Guarantees (tested by ``tests/unit/test_engine_*``):
    * a WRITING slot is never readable; a pinned slot is never evicted; the primary tier never holds
      more than ``num_slots`` blocks;
    * every job submitted to a tier is finished exactly once (``poll``), and its slots are released;
    * ``drain`` returns when no tier I/O touches the primary buffer; ``reset`` keeps pinned blocks;
    * tier failures (exceptions, failed jobs) become misses and counters, never exceptions to the
      caller; only misuse of the API raises (:class:`~kvtier.errors.MisuseError`);
    * keys of a request with a ``tenant`` are scoped to that tenant, so tenant B never hits tenant A's
      blocks (see ``docs/engine.md``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from kvtier.config import KvtierConfig, load_config
from kvtier.engine.admission import Admission
from kvtier.engine.build import (
    build_cost_model,
    build_tiers,
    config_namespace,
    new_counters,
    resolve_policy,
    start_metrics,
    stop_metrics,
)
from kvtier.engine.events import EventLog
from kvtier.engine.handles import HandleBook
from kvtier.engine.jobs import JobBook
from kvtier.engine.latency import Latency
from kvtier.engine.movers import KVMover
from kvtier.engine.parts import Parts
from kvtier.engine.preflight import preflight
from kvtier.engine.residency import Residency
from kvtier.engine.serving import Serving
from kvtier.engine.snapshot import engine_stats
from kvtier.engine.tenants import TenantScope
from kvtier.engine.timedpins import TimedPins
from kvtier.engine.types import EngineEvent, LoadHandle, LookupReport, RequestContext, StoreHandle
from kvtier.engine.writes import TierWrites, write_policies
from kvtier.errors import MisuseError
from kvtier.keys import BlockInfo, BlockKey, LookupCode, check_keys
from kvtier.policies.base import CachePolicy
from kvtier.primary import PrimaryTier, SlotState
from kvtier.tiers.base import SecondaryTier
from kvtier.transfer.pool import JobIds

if TYPE_CHECKING:
    from kvtier.metrics import MetricsExporter

__all__ = ["Engine"]

# Plain ints derived once from the enums: the per-key loops compare exact ints (CPython specialises
# those) and store them into the ``codes`` bytearray.
_MISS, _HIT, _PENDING = int(LookupCode.MISS), int(LookupCode.HIT), int(LookupCode.HIT_PENDING)
_READY, _FLUSHING = int(SlotState.READY), int(SlotState.FLUSHING)
_LEADING_HIT = bytes([_HIT])
_CLOSED = "engine is closed; create a new Engine"

P = ParamSpec("P")
R = TypeVar("R")


def _mover_call(method: Callable[Concatenate[KVMover, P], R]) -> Callable[Concatenate[Engine, P], R]:
    """``Engine.<name>``: the engine's :class:`KVMover` method of that name (signature and docstring
    included), so each byte-moving call is declared once, in :mod:`kvtier.engine.movers`."""

    def call(engine: Engine, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(engine._mover, *args, **kwargs)

    functools.update_wrapper(call, method)
    call.__qualname__ = f"Engine.{method.__name__}"
    return call


class Engine:
    """Look up, store and load KV blocks across the primary tier and the secondary tiers.

    Args:
        config: a :class:`KvtierConfig`, a mapping, a JSON string or a config file path.
        clock: monotonic seconds (virtual in simulation); stamped on jobs and events.
        policy: overrides the configured policy (capacity must equal ``num_slots``).
        tiers: overrides the configured secondary tiers: instances, or factories called with
            :attr:`primary_kv_view` (an instance built on another view of the same shape is attached
            to this engine's buffer).
        primary_buffer: caller-owned memory used as the buffer (backing ``external``, kept mapped).

    Construction goes through the configured spec (``spec_name``), resolved by the plug-in
    registry. With ``primary_backing: none`` (simulation) no buffer exists and configured secondary
    tiers are not built: slots, states, pins and eviction work as in real mode, bytes never move.

    Attributes:
        counters: the engine's counters by name (read them through :meth:`stats`).
        jobs: the :class:`~kvtier.engine.jobs.JobBook`; ``admission``, ``writes``, ``serving``,
            ``latency``: the promotion, write-policy, peer-serving and latency components.
    """

    def __init__(
        self,
        config: KvtierConfig | Mapping[str, Any] | str | None = None,
        *,
        clock: Callable[[], float] | None = None,
        policy: CachePolicy | None = None,
        tiers: Sequence[SecondaryTier | Callable[[memoryview], SecondaryTier]] | None = None,
        primary_buffer: Any = None,
    ) -> None:
        cfg = load_config(config)
        preflight(cfg, tiers_given=tiers is not None)  # whole-config checks before anything is built
        self.config = cfg
        clock = clock or time.monotonic
        self.namespace = config_namespace(cfg)
        spec, policy, num_slots = resolve_policy(cfg, policy, tiers is not None)
        self.primary = PrimaryTier(
            num_slots, cfg.block_bytes, policy, backing=cfg.primary_backing, shm_name=cfg.shm_name,
            external=primary_buffer, row_pad=cfg.primary_row_pad,
        )  # fmt: skip
        self.policy = policy
        self.num_slots = num_slots
        self.block_bytes = cfg.block_bytes
        self.row_stride = self.primary.row_stride
        self.primary_kv_view: memoryview = self.primary.primary_kv_view
        try:
            self.tiers: list[SecondaryTier] = build_tiers(
                cfg, self.primary, spec, tiers, namespace=self.namespace, clock=clock
            )
            cost = build_cost_model(cfg, self.tiers)  # shuts the tiers down when it raises
        except BaseException:
            self.primary.close()
            raise
        self.primary.track_tiers = bool(self.tiers)
        self.timed_pins = TimedPins(self.primary, cfg.pin_share, cfg.pin_max_ttl_s, clock)  # pin_for
        self._lock = threading.Lock()
        self._closed = False
        self._handles = HandleBook()
        self.counters: dict[str, int] = new_counters()
        self._events = EventLog(clock, self._lock)
        self._emit = self._events.emit
        self._scope = TenantScope(cfg.model, cfg.cache_salt).scope
        self.latency = Latency([t.name for t in self.tiers])
        self._parts = parts = Parts(
            self.primary, self.tiers, self.counters, self._lock, clock, self._emit, Residency(self.primary),
            self.latency, JobIds(), cfg.max_inflight_jobs,
        )  # fmt: skip
        self.jobs = JobBook(parts)
        self.writes = TierWrites(
            parts, write_policies(cfg.write_policy, len(self.tiers), cfg.write_after_hits), self.jobs
        )
        self._reserve = self.timed_pins.expiring(self.writes.reserve)
        self.admission = Admission(parts, self.jobs, self._reserve, cfg.promotion_share, cost)
        self._mover = KVMover(
            parts, check_open=self._check_open, scope=self._scope, prepare_store=self.prepare_store,
            complete_store=self.complete_store, pin_leading=self._pin_leading,
            complete_load=self.complete_load,
        )  # fmt: skip
        #: The Prometheus exporter started for ``metrics_port`` (``None`` when not configured/failed).
        self.metrics_exporter: MetricsExporter | None = start_metrics(self, cfg)
        self.serving = Serving(self.primary, self._lock, self._check_open, self._handles.issue)
        self.serving.start(self)

    # -- helpers -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise MisuseError(_CLOSED)

    def _internal_keys(
        self, op: str, keys: Sequence[BlockKey], request: RequestContext | None
    ) -> list[BlockKey]:
        """``keys`` checked (a :class:`MisuseError` names ``op``), as the engine stores them."""
        check_keys(op, keys)
        # Inlined fast path (no tenant, a list): lookups and stores run this once per request.
        if (request is None or request.tenant is None) and type(keys) is list:
            return keys
        return self._scope(keys, request)

    # -- lookup ------------------------------------------------------------------------------
    def lookup(self, keys: Sequence[BlockKey], request: RequestContext | None = None) -> LookupReport:
        """Where each key is: HIT (primary, readable now), HIT_PENDING, RETRY or MISS.

        Every key is evaluated. Primary hits touch the policy in key order. A key found in a
        secondary tier reserves a primary slot and is promoted by one batched job per (tier, call);
        when no slot or no promotion budget is available it is answered MISS.
        """
        ikeys = self._internal_keys("lookup", keys, request)
        with self._lock:
            if self._closed:
                raise MisuseError(_CLOSED)
            codes, npend = self._lookup_locked(ikeys, request)
        if self._events.outbox:
            self._events.dispatch()
        return LookupReport(len(codes) - len(codes.lstrip(_LEADING_HIT)), None, npend, codes)

    def _lookup_locked(self, ikeys: list[BlockKey], request: RequestContext | None) -> tuple[bytes, int]:
        """The body of :meth:`lookup` (lock held): per-key codes and the number pending."""
        t0 = time.perf_counter()
        n = len(ikeys)
        pr = self.primary
        slots = list(map(pr.index.get, ikeys, repeat(-1, n)))
        codes = bytearray(n)
        nretry = npend = 0
        touch: list[BlockKey] = []
        if n and max(slots) >= 0:
            states = pr.states
            rescue: list[BlockKey] = []
            # One pass in Python: requests are tens of keys, where numpy's per-call cost dominates.
            for i, s in enumerate(slots):
                if s >= 0:
                    st = states[s]
                    if st == _READY:
                        codes[i] = _HIT
                        touch.append(ikeys[i])
                    elif st == _FLUSHING:
                        codes[i] = _HIT
                        rescue.append(ikeys[i])
                    else:
                        codes[i] = _PENDING
            if rescue:
                # A write-back victim hit again is READY (most recent) again: not freed when its flush ends.
                pr.rescue(rescue)
            if touch:
                pr.policy.touch_many(touch)
            npend = codes.count(_PENDING)
        nhits = codes.count(_HIT)
        if self.tiers and nhits + npend < n:
            nretry, promoted = self.admission.lookup_tiers(ikeys, slots, codes, request)
            npend += promoted
        if touch and self.writes.hits_to_copy:
            # After this call's tier lookups and promotions, never before (why: TierWrites.hit).
            self.writes.hit(touch, request)
        c = self.counters
        c["lookup_calls"] += 1
        c["lookups"] += n
        c["hits"] += nhits
        c["pending"] += npend
        c["retries"] += nretry
        c["misses"] += n - nhits - npend - nretry
        self.latency.lookup.observe(time.perf_counter() - t0)
        return bytes(codes), npend

    def access(
        self,
        keys: Sequence[BlockKey],
        request: RequestContext | None = None,
        infos: Sequence[BlockInfo | None] | None = None,
    ) -> LookupReport:
        """:meth:`lookup`, then store every key answered MISS as if its bytes were written at once.

        Exactly ``lookup(keys)`` + ``complete_store(prepare_store(misses))`` (same results, counters,
        events and policy calls) in one call and one lock acquisition: the simulator's per-request
        step. No bytes move, so it is meant for ``primary_backing: none`` (with a real buffer the
        stored slots would hold stale bytes).
        """
        ikeys = self._internal_keys("access", keys, request)
        with self._lock:
            if self._closed:
                raise MisuseError(_CLOSED)
            codes, npend = self._lookup_locked(ikeys, request)
            nmiss = codes.count(_MISS)
            if nmiss:
                if nmiss == len(codes):
                    miss_keys: list[BlockKey] = ikeys
                    miss_infos = infos
                else:
                    idx = [i for i, x in enumerate(codes) if x == _MISS]
                    miss_keys = [ikeys[i] for i in idx]
                    miss_infos = [infos[i] for i in idx] if infos is not None else None
                _, internal, slots, accepted_infos = self._prepare_locked(miss_keys, request, miss_infos)
                if slots:
                    self._commit_locked(internal, slots, accepted_infos, request)
        if self._events.outbox:
            self._events.dispatch()
        return LookupReport(len(codes) - len(codes.lstrip(_LEADING_HIT)), None, npend, codes)

    def pin_for(self, keys: Sequence[BlockKey], ttl_s: float, request: RequestContext | None = None) -> int:
        """Keep the READY blocks of ``keys`` in the primary tier ``ttl_s`` seconds (engine clock); how
        many hold such a pin now. Bounds, errors: :class:`~kvtier.engine.timedpins.TimedPins`."""
        ikeys = self._internal_keys("pin_for", keys, request)
        with self._lock:
            self._check_open()
            return self.timed_pins.pin(ikeys, ttl_s)

    # -- store -------------------------------------------------------------------------------
    def prepare_store(
        self,
        keys: Sequence[BlockKey],
        request: RequestContext | None = None,
        infos: Sequence[BlockInfo | None] | None = None,
    ) -> StoreHandle:
        """Reserve WRITING slots for the keys not resident yet (evicting as the policy says).

        Keys that find no slot (every other slot pinned or being written) are dropped and counted.
        Write the bytes into ``primary_kv_view[slot_ids[i]]``, then call :meth:`complete_store`.
        Keys must be non-empty ``bytes`` of at most ``MAX_KEY_BYTES`` (else ``MisuseError``).
        """
        ikeys = self._internal_keys("prepare_store", keys, request)
        with self._lock:
            if self._closed:
                raise MisuseError(_CLOSED)
            positions, internal, slots, accepted_infos = self._prepare_locked(ikeys, request, infos)
            user = internal if ikeys is keys else [keys[p] for p in positions]
            handle = StoreHandle(user, slots, positions, request, internal, accepted_infos)
            self._handles.issue(handle)
        if self._events.outbox:
            self._events.dispatch()
        return handle

    def _prepare_locked(
        self,
        ikeys: list[BlockKey],
        request: RequestContext | None,
        infos: Sequence[BlockInfo | None] | None,
    ) -> tuple[list[int], list[BlockKey], list[int], Sequence[BlockInfo | None] | None]:
        """The body of :meth:`prepare_store` (lock held): positions, accepted keys, slots, infos."""
        positions, slots, dropped = self._reserve(ikeys)
        if len(positions) == len(ikeys):  # every key accepted, in order (the usual case): C-level copies
            internal = ikeys[:]
            accepted: Sequence[BlockInfo | None] | None = None if infos is None else list(infos)
        else:
            internal = [ikeys[p] for p in positions]
            accepted = None if infos is None else [infos[p] for p in positions]
        if accepted is None and request is not None and request.tenant is not None:
            accepted = [BlockInfo(tenant=request.tenant)] * len(positions)
        if dropped:
            self.counters["dropped_stores"] += dropped
            index = self.primary.index
            self._emit("dropped", [k for k in ikeys if k not in index])
        return positions, internal, slots, accepted

    def _commit_locked(
        self,
        keys: list[BlockKey],
        slots: list[int],
        infos: Sequence[BlockInfo | None] | None,
        request: RequestContext | None,
    ) -> None:
        """WRITING -> READY for a completed store (lock held), then the write-through cascade."""
        self.primary.commit(keys, slots, infos)
        self.counters["stores"] += len(slots)
        self._emit("stored", keys)
        if self.writes.copies_on_commit:
            self.writes.committed(keys, slots, request)

    def complete_store(self, handle: StoreHandle, success: bool = True) -> None:
        """Make the slots READY (or free them when ``success`` is false); then the write policy runs."""
        with self._lock:
            if self._closed:
                raise MisuseError(_CLOSED)
            self._handles.redeem("complete_store", handle, StoreHandle)
            keys, slots = handle.internal_keys, handle.slots
            if not success:
                self.primary.abort(keys, slots)
            elif slots:
                self._commit_locked(keys, slots, handle.infos, handle.request)
        if self._events.outbox:
            self._events.dispatch()

    # -- load --------------------------------------------------------------------------------
    def prepare_load(self, keys: Sequence[BlockKey], request: RequestContext | None = None) -> LoadHandle:
        """Pin the slots of ``keys`` for reading. Raises :class:`MisuseError` if a key is not HIT."""
        ikeys = self._internal_keys("prepare_load", keys, request)
        with self._lock:
            self._check_open()
            pr = self.primary
            slots = pr.find(ikeys)
            bad = [i for i, x in enumerate(slots) if not pr.readable(x)]
            if bad:
                i = bad[0]
                raise MisuseError(
                    f"prepare_load: key #{i} is not readable in the primary tier (lookup said HIT? it may "
                    "have been evicted since; load only what lookup reports as leading hits)"
                )
            pr.pin(slots)
            return self._handles.issue(LoadHandle(list(keys), slots, request))

    def complete_load(self, handle: LoadHandle) -> None:
        """Unpin the slots of ``handle`` (reading is finished)."""
        with self._lock:
            self._check_open()
            self._handles.redeem("complete_load", handle, LoadHandle)
            self.counters["loads"] += len(handle.slots)
            freed = self.primary.unpin(handle.slots)
            if freed:
                self._emit("evicted", freed)
        if self._events.outbox:
            self._events.dispatch()

    def _pin_leading(self, keys: Sequence[BlockKey], request: RequestContext | None) -> LoadHandle:
        """Pin the longest leading run of readable keys (never raises for misses)."""
        ikeys = self._internal_keys("load", keys, request)
        with self._lock:
            self._check_open()
            pr = self.primary
            slots = pr.find(ikeys)
            m = 0
            while m < len(slots) and pr.readable(slots[m]):
                m += 1
            slots = slots[:m]
            pr.pin(slots)
            return self._handles.issue(LoadHandle(list(keys[:m]), slots, request))

    # -- byte movers (the KVMover component's methods, same names, signatures and docs) -----
    store_blocks = _mover_call(KVMover.store_blocks)
    load_blocks = _mover_call(KVMover.load_blocks)
    store_kv = _mover_call(KVMover.store_kv)
    load_kv = _mover_call(KVMover.load_kv)
    submit_store_kv = _mover_call(KVMover.submit_store_kv)
    submit_load_kv = _mover_call(KVMover.submit_load_kv)
    poll_transfers = _mover_call(KVMover.poll_transfers)

    # -- jobs, lifecycle ---------------------------------------------------------------------
    @property
    def coalesce_promotions(self) -> bool:
        """Whether promotions wait for the next poll/drain/close, then go out as one job per tier and
        request (for callers asking one key at a time, polling once per step). Off by default."""
        return self.jobs.coalesce_promotions

    @coalesce_promotions.setter
    def coalesce_promotions(self, value: bool) -> None:
        with self._lock:
            self.jobs.coalesce_promotions = bool(value)
            if not value:
                self.jobs.flush_promotions_locked()

    @property
    def inflight_jobs(self) -> int:
        """Tier jobs submitted and not yet finished (plus store jobs waiting for budget)."""
        with self._lock:
            return self.jobs.inflight + len(self.jobs.deferred)

    def poll(self) -> list[EngineEvent]:
        """Collect finished tier jobs: promotions become READY, store jobs unpin. Returns new events."""
        with self._lock:
            self._check_open()
            mark = self._events.emitted
            self.jobs.poll_locked()
            new = self._events.since(mark)
        if self._events.outbox:
            self._events.dispatch()
        return new

    def drain(self) -> None:
        """Block until no tier I/O (and no ``submit_*_kv`` copy) touches the primary buffer."""
        pool = self._mover.pool
        if pool is not None:
            pool.drain()
        with self._lock:
            self._check_open()
            self.jobs.drain_locked()
        if self._events.outbox:
            self._events.dispatch()

    def flush(self) -> int:
        """Write every READY block not yet in the secondary tiers to them (write-back/after-hits).

        Returns the number of blocks submitted. Does not wait; :meth:`drain` does.
        """
        with self._lock:
            self._check_open()
            if not self.tiers:
                return 0
            return self.writes.flush()

    def reset(self) -> None:
        """Drop every unpinned READY block. Pinned, WRITING and FLUSHING blocks are kept."""
        with self._lock:
            self._check_open()
            self.timed_pins.release_all()  # what they kept is as stale as everything else
            dropped = self.primary.drop_unpinned()
            self.counters["resets"] += 1
            self.counters["evictions"] += len(dropped)
            self._emit("reset", dropped)
        if self._events.outbox:
            self._events.dispatch()

    def close(self) -> None:
        """Flush (write-back), drain, shut the tiers down and release the buffer. Idempotent."""
        if self._closed:
            return
        # First: a scrape must not read an engine half torn down.
        stop_metrics(self.metrics_exporter)
        self.metrics_exporter = None
        self.serving.close()
        if self.writes.flush_dirty:
            self.flush()
        self.drain()
        with self._lock:
            self._closed = True
            for t, tier in enumerate(self.tiers):
                try:
                    tier.shutdown()
                except Exception as exc:
                    self.jobs.tier_error(t, "shutdown", exc)
        if self._mover.pool is not None:
            self._mover.pool.shutdown()
        self.primary.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- observability -----------------------------------------------------------------------
    def events(self) -> list[EngineEvent]:
        """Events since the last call (the queue keeps the newest 65,536)."""
        return self._events.take_all()

    def subscribe(self, callback: Callable[[EngineEvent], None]) -> None:
        """Call ``callback(event)`` for every future event, outside the engine's lock."""
        self._events.subscribe(callback)

    def stats(self) -> dict[str, Any]:
        """Counters: the engine's, ``primary``, ``tiers`` by name, ``latency`` (:mod:`.snapshot`)."""
        with self._lock:
            return engine_stats(self._parts, self.timed_pins, self._mover, self.admission, self.jobs)
