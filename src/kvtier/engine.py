"""The tiering engine: the one object an inference engine talks to.

:class:`Engine` orchestrates the :class:`~kvtier.primary.PrimaryTier` (slots, states, pins), its
:class:`~kvtier.policies.base.CachePolicy` and the ordered secondary tiers. Everything slow is a job;
no method blocks except :meth:`Engine.drain` and :meth:`Engine.close`. All state changes happen under
one lock, taken once per call (batched calls, no per-key objects), so the simulate path costs about
a microsecond per block.

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

import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

from kvtier.config import KvtierConfig, load_config
from kvtier.engine_build import build_cost_model, build_tiers, config_namespace, start_metrics, stop_metrics
from kvtier.engine_jobs import JobBook
from kvtier.engine_movers import MoverMixin
from kvtier.engine_types import EngineEvent, LoadHandle, LookupReport, RequestContext, StoreHandle
from kvtier.errors import ConfigError, MisuseError
from kvtier.keys import BlockInfo, BlockKey
from kvtier.policies.base import CachePolicy
from kvtier.primary import PrimaryTier
from kvtier.tiers.base import SecondaryTier
from kvtier.transfer.pool import JobIds, TransferPool

if TYPE_CHECKING:
    from kvtier.metrics import MetricsExporter

__all__ = ["Engine", "EngineEvent", "LoadHandle", "LookupReport", "RequestContext", "StoreHandle"]

log = logging.getLogger(__name__)

_MISS, _HIT, _PENDING, _RETRY = 0, 1, 2, 3
_READY, _WRITING, _FLUSHING = 2, 1, 3
_CLOSED = "engine is closed; create a new Engine"
_EVENT_QUEUE = 65536


class Engine(MoverMixin):
    """Look up, store and load KV blocks across the primary tier and the secondary tiers.

    Args:
        config: a :class:`KvtierConfig`, a mapping, a JSON string or a config file path.
        clock: monotonic seconds (virtual in simulation); stamped on jobs and events.
        policy: overrides the configured policy (capacity must equal ``num_slots``).
        tiers: overrides the configured secondary tiers: instances, or factories called with
            :attr:`primary_kv_view` (an instance built on another view of the same shape is attached
            to this engine's buffer).

    Construction goes through the configured spec (``spec_name``), resolved by the plug-in
    registry. With ``primary_backing: none`` (simulation) no buffer exists and configured secondary
    tiers are not built: slots, states, pins and eviction work as in real mode, bytes never move.
    """

    def __init__(
        self,
        config: KvtierConfig | Mapping[str, Any] | str | None = None,
        *,
        clock: Callable[[], float] | None = None,
        policy: CachePolicy | None = None,
        tiers: Sequence[SecondaryTier | Callable[[memoryview], SecondaryTier]] | None = None,
    ) -> None:
        cfg = load_config(config)
        self.config = cfg
        self._clock = clock or time.monotonic
        self.namespace = config_namespace(cfg)
        spec = None
        num_slots = cfg.num_primary_slots
        simulate = cfg.primary_backing == "none"
        if policy is None or (tiers is None and not simulate and cfg.secondary_tiers):
            from kvtier.plugins import create_spec

            spec = create_spec(cfg)
            num_slots = spec.num_primary_slots
        if num_slots < 1:
            raise ConfigError(
                "cpu_bytes_to_use",
                f"{cfg.cpu_bytes_to_use} bytes hold no slot of {cfg.row_stride} bytes; raise it",
            )
        if policy is None:
            assert spec is not None
            policy = spec.create_policy(num_slots)
        elif policy.capacity != num_slots:
            raise MisuseError(
                f"policy capacity {policy.capacity} must equal the primary tier's {num_slots} slots "
                f"(cpu_bytes_to_use {cfg.cpu_bytes_to_use} // row_stride {cfg.row_stride})"
            )
        self.primary = PrimaryTier(
            num_slots, cfg.block_bytes, policy, backing=cfg.primary_backing, shm_name=cfg.shm_name
        )
        self.policy = policy
        self.num_slots = num_slots
        self.block_bytes = cfg.block_bytes
        self.row_stride = self.primary.row_stride
        self.primary_kv_view: memoryview = self.primary.primary_kv_view
        try:
            self.tiers: list[SecondaryTier] = build_tiers(self, spec, tiers, simulate)
            cost = build_cost_model(cfg, self.tiers)  # shuts the tiers down when it raises
        except BaseException:
            self.primary.close()
            raise
        self._lock = threading.Lock()
        self._ids = JobIds()
        self._events: deque[EngineEvent] = deque(maxlen=_EVENT_QUEUE)
        self._subscribers: list[Callable[[EngineEvent], None]] = []
        self._outbox: list[EngineEvent] = []
        self._nemitted = 0
        self._tenant_prefix: dict[str, bytes] = {}
        # Tenant tags are keyed by the deployment's model + cache_salt: engines of one deployment
        # agree on them (so shared tiers still share a tenant's blocks), while a caller that omits
        # the tenant cannot forge another tenant's internal keys unless it knows cache_salt.
        self._tenant_key = hashlib.blake2b(
            f"{self.config.model}\0{self.config.cache_salt}".encode(), digest_size=32
        ).digest()
        self._open_handles: set[int] = set()
        self._token = 0
        self._pool: TransferPool | None = None
        self._closed = False
        self._write_back = cfg.write_policy == "write_back" and bool(self.tiers)
        self._write_through = cfg.write_policy == "write_through" and bool(self.tiers)
        self._after_hits = cfg.write_after_hits if cfg.write_policy == "after_hits" and self.tiers else 0
        self.primary.track_tiers = bool(self.tiers)
        self.jobs = JobBook(self, cfg.max_inflight_jobs, cfg.promotion_share, cost)
        self.c: dict[str, int] = dict.fromkeys(
            (
                "lookup_calls", "lookups", "hits", "pending", "retries", "misses", "stores",
                "dropped_stores", "evictions", "writebacks", "loads", "promotions", "promotions_failed",
                "promotions_rejected", "promotions_skipped_cost", "tier_errors", "bytes_stored",
                "bytes_loaded", "resets",
            ),
            0,
        )  # fmt: skip
        #: The Prometheus exporter started for ``metrics_port`` (``None`` when not configured/failed).
        self.metrics_exporter: MetricsExporter | None = start_metrics(self, cfg)

    # -- helpers -----------------------------------------------------------------------------
    def _scope(self, keys: Sequence[BlockKey], request: RequestContext | None) -> list[BlockKey]:
        """Engine-internal keys: a tenant's keys carry a 9-byte prefix derived from its name."""
        if request is None or request.tenant is None:
            return keys if isinstance(keys, list) else list(keys)
        prefix = self._tenant_prefix.get(request.tenant)
        if prefix is None:
            digest = hashlib.blake2b(
                request.tenant.encode(), digest_size=8, key=self._tenant_key, person=b"kvtier-tenant"
            ).digest()
            prefix = self._tenant_prefix.setdefault(request.tenant, b"\x01" + digest)
        return [BlockKey(prefix + k) for k in keys]

    def _check_open(self) -> None:
        if self._closed:
            raise MisuseError(_CLOSED)

    def _emit(self, kind: str, keys: Sequence[BlockKey], tier: str | None = None) -> None:
        ev = EngineEvent(kind, tuple(keys), tier, self._clock())
        self._events.append(ev)
        self._nemitted += 1
        if self._subscribers:
            self._outbox.append(ev)

    def _dispatch(self) -> None:
        """Deliver queued events to subscribers, outside the lock (callbacks may call the engine)."""
        with self._lock:
            out, self._outbox = self._outbox, []
        for ev in out:
            for cb in list(self._subscribers):
                try:
                    cb(ev)
                except Exception:  # a broken metrics hook must not break inference
                    log.exception("kvtier: event subscriber failed")

    def _next_token(self) -> int:
        self._token += 1
        self._open_handles.add(self._token)
        return self._token

    def _close_token(self, token: int, what: str) -> None:
        try:
            self._open_handles.remove(token)
        except KeyError:
            raise MisuseError(f"{what}: handle already completed or not from this engine") from None

    def _after_evict(
        self, evicted: list[BlockKey], flush_keys: list[BlockKey], flush_slots: list[int]
    ) -> None:
        if evicted:
            self.c["evictions"] += len(evicted)
            self._emit("evicted", evicted)
        if flush_keys:
            # Write-back: victims stay readable (FLUSHING) until every tier has copied them.
            self.c["evictions"] += len(flush_keys)
            self.c["writebacks"] += len(flush_keys)
            for t in range(len(self.tiers)):
                self.jobs.submit_store(t, flush_keys, flush_slots, None)

    def _reserve(self, ikeys: list[BlockKey]) -> tuple[list[int], list[int], int]:
        pr = self.primary
        pos, slots, evicted, fk, fs, dropped = pr.reserve(ikeys, flush_dirty=self._write_back)
        if evicted or fk:
            self._after_evict(evicted, fk, fs)
        if dropped and self._write_back and self.jobs.inflight:
            # Write-back victims free their slots only when the flush ends; fast tiers are done
            # already, so collect their results and try the dropped keys once more.
            self.jobs.poll_locked()
            if pr.num_free:
                pos2, slots2, _, _, _, dropped = pr.reserve(ikeys, evict=False)
                pos = pos + pos2
                slots = slots + slots2
        return pos, slots, dropped

    # -- lookup ------------------------------------------------------------------------------
    def lookup(self, keys: Sequence[BlockKey], request: RequestContext | None = None) -> LookupReport:
        """Where each key is: HIT (primary, readable now), HIT_PENDING, RETRY or MISS.

        Every key is evaluated. Primary hits touch the policy in key order. A key found in a
        secondary tier reserves a primary slot and is promoted by one batched job per (tier, call);
        when no slot or no promotion budget is available it is answered MISS.
        """
        # Inlined fast paths (no tenant, a list; open engine): this runs once per request.
        ikeys = (
            keys
            if (request is None or request.tenant is None) and type(keys) is list
            else self._scope(keys, request)
        )
        with self._lock:
            if self._closed:
                raise MisuseError(_CLOSED)
            codes, npend = self._lookup_locked(ikeys, request)
        if self._outbox:
            self._dispatch()
        return LookupReport(len(codes) - len(codes.lstrip(b"\x01")), None, npend, codes)

    def _lookup_locked(self, ikeys: list[BlockKey], request: RequestContext | None) -> tuple[bytes, int]:
        """The body of :meth:`lookup` (lock held): per-key codes and the number pending."""
        n = len(ikeys)
        pr = self.primary
        slots = list(map(pr.index.get, ikeys, repeat(-1, n)))
        codes = bytearray(n)
        nretry = npend = 0
        if n and max(slots) >= 0:
            states = pr.states
            touch: list[BlockKey] = []
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
                # A write-back victim hit again stays: READY (and most recent) once more, so it
                # is not freed under the caller's feet when its flush ends.
                pr.rescue(rescue)
            if touch:
                pr.policy.touch_many(touch)
                if self._after_hits:
                    self._count_hits(touch, request)
            npend = codes.count(_PENDING)
        nhits = codes.count(_HIT)
        if self.tiers and nhits + npend < n:
            nretry, promoted = self.jobs.lookup_tiers(ikeys, slots, codes, request)
            npend += promoted
        c = self.c
        c["lookup_calls"] += 1
        c["lookups"] += n
        c["hits"] += nhits
        c["pending"] += npend
        c["retries"] += nretry
        c["misses"] += n - nhits - npend - nretry
        return bytes(codes), npend

    def _count_hits(self, keys: list[BlockKey], request: RequestContext | None) -> None:
        pr = self.primary
        hits, persisted, index = pr.hits, pr.persisted, pr.index
        due: list[int] = []
        for k in keys:
            s = index[k]
            hits[s] += 1
            if hits[s] >= self._after_hits and not persisted[s]:
                persisted[s] = 1
                due.append(s)
        if due:
            dkeys = pr.keys_of(due)
            for t in range(len(self.tiers)):
                self.jobs.submit_store(t, dkeys, due, request)

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
        ikeys = (
            keys
            if (request is None or request.tenant is None) and type(keys) is list
            else self._scope(keys, request)
        )
        with self._lock:
            if self._closed:
                raise MisuseError(_CLOSED)
            codes, npend = self._lookup_locked(ikeys, request)
            nmiss = codes.count(_MISS)
            if nmiss:
                if nmiss == len(codes):
                    mk: list[BlockKey] = ikeys
                    mi = infos
                else:
                    idx = [i for i, x in enumerate(codes) if x == _MISS]
                    mk = [ikeys[i] for i in idx]
                    mi = [infos[i] for i in idx] if infos is not None else None
                _, internal, slots, sel = self._prepare_locked(mk, request, mi)
                if slots:
                    self._commit_locked(internal, slots, sel, request)
        if self._outbox:
            self._dispatch()
        return LookupReport(len(codes) - len(codes.lstrip(b"\x01")), None, npend, codes)

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
        """
        ikeys = (
            keys
            if (request is None or request.tenant is None) and type(keys) is list
            else self._scope(keys, request)
        )
        with self._lock:
            if self._closed:
                raise MisuseError(_CLOSED)
            pl, internal, slots, sel = self._prepare_locked(ikeys, request, infos)
            user = internal if ikeys is keys else [keys[p] for p in pl]
            self._token = token = self._token + 1
            self._open_handles.add(token)
        if self._outbox:
            self._dispatch()
        return StoreHandle(user, slots, pl, request, internal, sel, token)

    def _prepare_locked(
        self,
        ikeys: list[BlockKey],
        request: RequestContext | None,
        infos: Sequence[BlockInfo | None] | None,
    ) -> tuple[list[int], list[BlockKey], list[int], Sequence[BlockInfo | None] | None]:
        """The body of :meth:`prepare_store` (lock held): positions, accepted keys, slots, infos."""
        pl, slots, dropped = self._reserve(ikeys)
        if len(pl) == len(ikeys):  # every key accepted, in order (the usual case): C-level copies
            internal = ikeys[:]
            sel: Sequence[BlockInfo | None] | None = None if infos is None else list(infos)
        else:
            internal = [ikeys[p] for p in pl]
            sel = None if infos is None else [infos[p] for p in pl]
        if sel is None and request is not None and request.tenant is not None:
            sel = [BlockInfo(tenant=request.tenant)] * len(pl)
        if dropped:
            self.c["dropped_stores"] += dropped
            index = self.primary.index
            self._emit("dropped", [k for k in ikeys if k not in index])
        return pl, internal, slots, sel

    def _commit_locked(
        self,
        keys: list[BlockKey],
        slots: list[int],
        infos: Sequence[BlockInfo | None] | None,
        request: RequestContext | None,
    ) -> None:
        """WRITING -> READY for a completed store (lock held), then the write-through cascade."""
        self.primary.commit(keys, slots, infos)
        self.c["stores"] += len(slots)
        self._emit("stored", keys)
        if self._write_through:
            persisted = self.primary.persisted
            for x in slots:
                persisted[x] = 1
            for t in range(len(self.tiers)):
                self.jobs.submit_store(t, keys, slots, request)

    def complete_store(self, handle: StoreHandle, success: bool = True) -> None:
        """Make the slots READY (or free them when ``success`` is false); then the write policy runs."""
        with self._lock:
            if self._closed:
                raise MisuseError(_CLOSED)
            try:
                self._open_handles.remove(handle.token)
            except KeyError:
                raise MisuseError(
                    "complete_store: handle already completed or not from this engine"
                ) from None
            keys, slots = handle.internal_keys, handle.slots
            if not success:
                self.primary.abort(keys, slots)
            elif slots:
                self._commit_locked(keys, slots, handle.infos, handle.request)
        if self._outbox:
            self._dispatch()

    # -- load --------------------------------------------------------------------------------
    def prepare_load(self, keys: Sequence[BlockKey], request: RequestContext | None = None) -> LoadHandle:
        """Pin the slots of ``keys`` for reading. Raises :class:`MisuseError` if a key is not HIT."""
        ikeys = self._scope(keys, request)
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
            token = self._next_token()
        return LoadHandle(list(keys), slots, request, token)

    def complete_load(self, handle: LoadHandle) -> None:
        """Unpin the slots of ``handle`` (reading is finished)."""
        with self._lock:
            self._check_open()
            self._close_token(handle.token, "complete_load")
            self.c["loads"] += len(handle.slots)
            freed = self.primary.unpin(handle.slots)
            if freed:
                self._emit("evicted", freed)
        if self._outbox:
            self._dispatch()

    def _pin_leading(self, keys: Sequence[BlockKey], request: RequestContext | None) -> LoadHandle:
        """Pin the longest leading run of readable keys (never raises for misses)."""
        ikeys = self._scope(keys, request)
        with self._lock:
            self._check_open()
            pr = self.primary
            slots = pr.find(ikeys)
            m = 0
            while m < len(slots) and pr.readable(slots[m]):
                m += 1
            slots = slots[:m]
            pr.pin(slots)
            token = self._next_token()
        return LoadHandle(list(keys[:m]), slots, request, token)

    # -- jobs, lifecycle ---------------------------------------------------------------------
    @property
    def inflight_jobs(self) -> int:
        """Tier jobs submitted and not yet finished (plus store jobs waiting for budget)."""
        with self._lock:
            return self.jobs.inflight + len(self.jobs.deferred)

    def poll(self) -> list[EngineEvent]:
        """Collect finished tier jobs: promotions become READY, store jobs unpin. Returns new events."""
        with self._lock:
            self._check_open()
            mark = self._nemitted
            self.jobs.poll_locked()
            k = min(self._nemitted - mark, len(self._events))
            ev = self._events  # newest k, read from the right end (O(k), not O(queue))
            new = [ev[-i] for i in range(k, 0, -1)]
        if self._outbox:
            self._dispatch()
        return new

    def drain(self) -> None:
        """Block until no tier I/O (and no ``submit_*_kv`` copy) touches the primary buffer."""
        if self._pool is not None:
            self._pool.drain()
        with self._lock:
            self._check_open()
            self.jobs.drain_locked()
        if self._outbox:
            self._dispatch()

    def flush(self) -> int:
        """Write every READY block not yet in the secondary tiers to them (write-back/after-hits).

        Returns the number of blocks submitted. Does not wait; :meth:`drain` does.
        """
        with self._lock:
            self._check_open()
            if not self.tiers:
                return 0
            pr = self.primary
            due = pr.dirty_ready()
            if due:
                keys = pr.keys_of(due)
                for x in due:
                    pr.persisted[x] = 1
                for t in range(len(self.tiers)):
                    self.jobs.submit_store(t, keys, due, None)
        return len(due)

    def reset(self) -> None:
        """Drop every unpinned READY block. Pinned, WRITING and FLUSHING blocks are kept."""
        with self._lock:
            self._check_open()
            dropped = self.primary.drop_unpinned()
            self.c["resets"] += 1
            self.c["evictions"] += len(dropped)
            self._emit("reset", dropped)
        if self._outbox:
            self._dispatch()

    def close(self) -> None:
        """Flush (write-back), drain, shut the tiers down and release the buffer. Idempotent."""
        if self._closed:
            return
        # First: a scrape must not read an engine half torn down.
        stop_metrics(self.metrics_exporter)
        self.metrics_exporter = None
        if self._write_back:
            self.flush()
        self.drain()
        with self._lock:
            self._closed = True
            for t, tier in enumerate(self.tiers):
                try:
                    tier.shutdown()
                except Exception as exc:
                    self.jobs.tier_error(t, "shutdown", exc)
        if self._pool is not None:
            self._pool.shutdown()
        self.primary.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- observability -----------------------------------------------------------------------
    def events(self) -> list[EngineEvent]:
        """Events since the last call (the queue keeps the newest 65,536)."""
        with self._lock:
            out = list(self._events)
            self._events.clear()
        return out

    def subscribe(self, callback: Callable[[EngineEvent], None]) -> None:
        """Call ``callback(event)`` for every future event, outside the engine's lock."""
        with self._lock:
            self._subscribers.append(callback)

    def stats(self) -> dict[str, Any]:
        """Counters: ``primary`` slot counts, per-tier stats by name, and engine counters.

        Each tier's entry is its ``get_stats()`` plus the engine's ``read_seconds``/``write_seconds``
        (sum of ``JobResult.seconds`` of its load/store jobs) and ``read_jobs``/``write_jobs``.
        """
        with self._lock:
            out: dict[str, Any] = dict(self.c)
            out["primary"] = self.primary.counts()
            out["primary"]["backing"] = self.primary.backing
            tiers: dict[str, Any] = {}
            for t, tier in enumerate(self.tiers):
                try:
                    d: dict[str, Any] = dict(tier.get_stats())
                except Exception as exc:
                    self.jobs.tier_error(t, "get_stats", exc)
                    d = {}
                d.update(self.jobs.tier_io(t))
                tiers[tier.name] = d
            out["tiers"] = tiers
            out.update(self.jobs.counters())
            return out
