"""kvtier inside vLLM (0.32, 0.33, 0.34): a ``SecondaryTierManager`` that runs any kvtier tier.

vLLM's ``SecondaryTierFactory`` loads it from ``kv_connector_extra_config.secondary_tiers`` with no
registration and no patch::

    {"type": "KvtierTier", "module_path": "kvtier.integrations.vllm",
     "tier": "fs", "root_dir": "/mnt/nvme/kv", "max_bytes": "200GiB"}

``tier`` names the kvtier tier (``fs`` by default; ``tier_module_path`` loads a third party's kvtier
plug-in); every other key is that tier's option, except the ones the adapter consumes itself
(``name``, ``cache_salt``, ``locality``, ``enable_kv_events``; see
:func:`kvtier.config.vllm.split_adapter_entry`). ``enable_kv_events`` means what it means on
vLLM's fs tier: with vLLM's KV cache events on, the blocks the kvtier tier stores and later drops
are published (``take_events``) to vLLM's KV-event publisher, so a cache-aware router knows them.
vLLM's fs keys ``n_read_threads`` / ``n_write_threads`` keep vLLM's meaning (their sum is kvtier
fs's ``threads``).

What the adapter guarantees vLLM (the points of vLLM's contract, ``tiering/base.py``):
    * **Non-blocking.** ``lookup``/``submit_*``/``get_finished_jobs`` only translate and delegate to
      the kvtier tier, whose own contract forbids blocking (I/O runs on its workers).
    * **Exactly once.** Every submitted job id is reported once: results of ids not in flight (a
      duplicate from a faulty tier) are dropped and logged; a submit that raises is a failed job.
    * **Partial success.** A promotion that loaded some keys reports them in ``successful_keys``
      (always a subset of the job's keys); a store reports all-or-nothing, as vLLM reads it.
    * **Drain never aborts a copy.** ``drain_jobs`` waits on the tier's ``drain`` (which finishes
      every chunk already started) and then until each in-flight job has a result.
    * **Back-pressure.** Each result carries the bytes moved and the seconds taken, so vLLM's
      detector (fed by the manager from ``transfer_bytes`` and the job's ``submit_time``) sees the
      tier's real speed; stores the tier drops (full medium, its own gate) are failed jobs, which the
      detector counts as failures. The adapter never stores behind vLLM's back: the manager consults
      the detector before every cascade and the adapter adds no queue of its own.
    * **Never crashes the engine.** A backend error is a MISS or a failed job, logged rate-limited.
    * **A failed promotion never frees chunks still being written.** When a tier's ``submit_load``
      raises, it may already have handed part of the job to its I/O. On vLLM 0.34 the failed result
      carries ``deferred_release``, an event set once the tier has no job in flight (or its
      ``drain`` returned: always before ``drain_jobs`` returns); on 0.32/0.33, which have no such
      field, the failed result itself is held back until then, so vLLM keeps the chunks reserved.
    * **Recency without ``touch``.** vLLM's scheduler never calls ``touch`` (0.34 removed it), so a
      block a request found in the tier (a lookup HIT) is refreshed in the tier's eviction order when
      vLLM reports the request finished (``on_request_finished``), once per request.
    * **Versions.** vLLM 0.32, 0.33 and 0.34 (:mod:`.compat`); any other vLLM is refused when the
      factory builds the tier. Keyword arguments neither that vLLM nor the kvtier tier knows are
      accepted and logged once per process (``kvtier check`` refuses them in a config file).

Remote tiers (``redis``, ``obj``, ``mooncake``, ``p2p``) take their options in the same entry;
secrets come from environment variables the entry names (``password_env``, ``secret_key_env``,
``secret_env``), never from a value vLLM would print with its config. ``p2p`` loads other instances'
blocks (hits count as vLLM's ``p2p`` cache-hit source) and, with ``serve``, serves this engine's
primary tier to them through vLLM's ``serve_external_requests`` (:mod:`.serve`; static ``peers``
only, no ``directory``); its stores move nothing.

Namespace: the kvtier tier's namespace is derived from the offloading spec (model, dtype, KV
groups, block and chunk size, parallel layout, row size; see
:func:`~kvtier.config.vllm.vllm_namespace`) plus ``cache_salt``, so a layout change
never reuses old blocks while two vLLM instances with the same layout share them. vLLM's keys
(block hash + 4-byte big-endian group index) are passed to the tier unchanged.

Metrics: every :class:`~kvtier.tiers.base.TierStats` counter is declared through vLLM's
``build_metric_definitions`` as ``kvtier:tier_<counter>`` (label ``kvtier_tier``) and reported as
deltas from ``get_stats``, so it appears on vLLM's own ``/metrics``.

Importing this module imports vLLM (the ``vllm`` extra).
"""

from __future__ import annotations

import difflib
import inspect
import logging
import threading
import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any, ClassVar

import numpy as np
from vllm.v1.kv_offload.base import (
    Locality,
    Medium,
    OffloadingEvent,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.base import LookupResult as VllmLookup
from vllm.v1.kv_offload.tiering.base import JobResult as VllmJobResult
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtier.config.vllm import ADAPTER_CLASS, split_adapter_entry, vllm_namespace
from kvtier.errors import ConfigError
from kvtier.integrations.vllm import compat
from kvtier.integrations.vllm.events import TierEvents
from kvtier.integrations.vllm.hints import TIER_PIN_NOTICE, has_pin
from kvtier.integrations.vllm.logonce import log_once as _log_once
from kvtier.integrations.vllm.logonce import reset_log_once as reset_log_once
from kvtier.integrations.vllm.logonce import warn_inline_secrets
from kvtier.integrations.vllm.teardown import collect_cycles
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.plugins import TIERS, create_tier
from kvtier.tiers.base import SecondaryTier, TierContext, TierStats

__all__ = ["METRIC_LABEL", "METRIC_PREFIX", "KvtierTier", "reset_log_once"]

log = logging.getLogger("kvtier.integrations.vllm")

METRIC_PREFIX = "kvtier:tier_"
METRIC_LABEL = "kvtier_tier"
_COUNTERS = tuple(TierStats().as_dict())
# Constructor arguments vLLM's factory supplies itself (never tier options; 0.32-0.34 alike).
_VLLM_SUPPLIED = ("offloading_spec", "primary_kv_view", "tier_type", "backpressure_detector")
_KVTIER_SUPPLIED = ("primary_kv_view", "context")
# After drain, how long to wait for a tier to publish results of jobs it already finished.
_DRAIN_REPORT_TIMEOUT = 5.0
_LOG_INTERVAL = 10.0
# Requests whose lookup hits are kept for the finish-time refresh; beyond it the oldest go (a
# request vLLM never reports finished must not grow the map without bound).
_MAX_TRACKED_REQUESTS = 4096

_LOOKUP = {
    LookupResult.HIT: VllmLookup.HIT,
    LookupResult.MISS: VllmLookup.MISS,
    # vLLM's tiers answer HIT, MISS or RETRY; "being promoted" is "ask again" to vLLM.
    LookupResult.HIT_PENDING: VllmLookup.RETRY,
    LookupResult.RETRY: VllmLookup.RETRY,
}
_MEDIUM = {"CPU": (Medium.CPU, CacheHitSource.HOST), "STORAGE": (Medium.STORAGE, CacheHitSource.DISK)}


def _accepted_options(cls: type[Any]) -> set[str] | None:
    """Keyword options ``cls`` takes besides what kvtier supplies; ``None`` means any (``**kw``)."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - C extensions without a signature
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {p.name for p in params if p.kind in kinds and p.name not in _KVTIER_SUPPLIED}


def _as_bytes(view: memoryview) -> memoryview:
    """vLLM's primary view (format ``b``: a torch int8 tensor) as unsigned bytes, kvtier's contract.

    Zero-copy: a cast shares the buffer. A view that already holds unsigned bytes is returned as is.
    """
    if view.format == "B":
        return view
    shape = list(view.shape or ())
    return view.cast("B").cast("B", shape)


class KvtierTier(SecondaryTierManager):  # type: ignore[misc,unused-ignore]
    """vLLM secondary tier backed by a kvtier tier (see the module doc for config and guarantees).

    vLLM calls every method under its tiering manager's lock (never two at once), sometimes from
    its tier-poll thread; the adapter keeps no per-thread state.
    """

    # A class default for vLLM's __init_subclass__; each instance sets the medium of its kvtier tier.
    medium = Medium.STORAGE
    # Completions are collected on vLLM's per-step poll; a tier-poll thread would only add wake-ups.
    tolerates_off_thread_polling: ClassVar[bool] = False

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        **options: Any,
    ) -> None:
        compat.require_supported_vllm()
        super().__init__(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            backpressure_detector=backpressure_detector,
        )
        path = f"{ADAPTER_CLASS}."
        opts, entry = split_adapter_entry(options, path)
        warn_inline_secrets(entry)
        cls = TIERS.resolve(entry["type"], entry.get("module_path"), key_path=ADAPTER_CLASS)
        entry = self._known_options(cls, entry, opts.tier)
        config = getattr(offloading_spec, "config", None)
        if config is None:
            _log_once(
                "no-config",
                "kvtier: the offloading spec has no config; blocks are namespaced by row size only",
            )
        self.namespace = vllm_namespace(config, row_bytes=self.block_size_bytes, cache_salt=opts.cache_salt)
        context = TierContext(
            name=opts.name or f"kvtier-{opts.tier}",
            block_bytes=self.block_size_bytes,
            namespace=self.namespace.root.hex(),
        )
        try:
            self._tier: SecondaryTier = create_tier(
                entry, primary_kv_view=_as_bytes(primary_kv_view), context=context
            )
        except ConfigError as exc:
            # kvtier's factory numbers its one entry 0; vLLM's user knows it as the KvtierTier entry.
            path = exc.key_path.replace("secondary_tiers[0]", ADAPTER_CLASS, 1)
            raise ConfigError(path, exc.detail) from exc
        self._describe_medium(opts.locality)
        self._kvtier_type = opts.tier
        #: vLLM KV events of this tier (stored / removed), ``None`` when not published (see take_events).
        self._events: TierEvents | None = None
        if opts.enable_kv_events:
            self._events = TierEvents.enable(offloading_spec, self._tier, tier_type, _log_once)
            if self._events is not None:
                self._events.medium, self._events.locality = self.medium, self.locality
        self._inflight: dict[int, Any] = {}
        self._ready: list[VllmJobResult] = []
        self._service: Any = None
        self._served: Any = None
        self._start_serving(primary_kv_view)
        # Failed promotions whose I/O may still write their chunks (see _fail_started_load).
        self._unsafe_events: list[threading.Event] = []  # vLLM 0.34: events not set yet
        self._unsafe_results: list[VllmJobResult] = []  # vLLM 0.32/0.33: results held back
        self._hits: dict[str, set[bytes]] = {}  # req_id -> keys a lookup answered HIT
        self._last_counters: dict[str, int] = {}
        self._next_error_log = 0.0
        log.info(
            "kvtier: vLLM tier %r runs kvtier tier %r (%s) in namespace %s",
            tier_type,
            self._tier.name,
            f"{type(self._tier).__module__}:{type(self._tier).__qualname__}",
            context.namespace[:12],
        )

    def _describe_medium(self, locality: str | None) -> None:
        """vLLM's medium, hit source and locality of this instance, from its kvtier tier's medium
        (``locality``: the configured one, else REMOTE for a remote tier)."""
        medium, source = _MEDIUM.get(self._tier.medium, (Medium.STORAGE, CacheHitSource.EXTERNAL_UNSPECIFIED))
        if getattr(self._tier, "p2p_serves", False):
            source = CacheHitSource.P2P  # blocks from a peer's memory: vLLM's own p2p hit source
        # Per instance: one adapter class fronts tiers of every medium.
        self.medium = medium  # type: ignore[misc]  # a ClassVar in vLLM; per instance here
        self.cache_hit_source = source  # type: ignore[misc]
        locality = locality or ("REMOTE" if self._tier.medium == "REMOTE" else None)
        self.locality = None if locality is None else Locality(locality)

    def _start_serving(self, primary_kv_view: memoryview) -> None:
        """Start the p2p block server when the tier asks for one (see :mod:`.serve`)."""
        if getattr(self._tier, "serve", None) is None:
            return
        from kvtier.integrations.vllm.serve import start_serving

        try:
            started = start_serving(self._tier, _as_bytes(primary_kv_view))
        except BaseException:
            self._tier.shutdown()
            raise
        if started is not None:
            self._service, self._served = started
            # Peers are answered between steps too, by vLLM's tier-poll thread (under the manager
            # lock, like every other call): an idle engine still serves. The kvtier p2p tier
            # tolerates polling from another thread.
            self.tolerates_off_thread_polling = True  # type: ignore[misc]
            log.info("kvtier: p2p block server for vLLM's primary tier on %s", self._service.address)

    @staticmethod
    def _known_options(cls: type[Any], entry: dict[str, Any], tier: str) -> dict[str, Any]:
        """``entry`` without the options ``cls`` does not take; each dropped key is logged once."""
        accepted = _accepted_options(cls)
        if accepted is None:
            return entry
        keep = {"type", "module_path", "name"}
        out: dict[str, Any] = {}
        for key, value in entry.items():
            if key in keep or key in accepted:
                out[key] = value
                continue
            close = difflib.get_close_matches(key, sorted(accepted), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            # The name only, never the value: options may hold credentials.
            _log_once(
                f"option:{tier}:{key}",
                "kvtier: KvtierTier ignores option %r%s: neither vLLM's tier contract nor kvtier tier %r "
                "takes it ('kvtier check' refuses it)",
                key,
                hint,
                tier,
            )
        return out

    @property
    def kvtier_tier(self) -> SecondaryTier:
        """The kvtier tier this adapter runs."""
        return self._tier

    @property
    def block_service(self) -> Any:
        """The p2p block service serving vLLM's primary tier to peers (``None`` when not serving)."""
        return self._service

    # -- translation -------------------------------------------------------------------------
    def _to_kvtier(self, job: Any) -> TransferJob:
        return TransferJob(
            job_id=int(job.job_id),
            keys=[BlockKey(bytes(k)) for k in job.keys],
            slot_ids=np.asarray(job.chunk_ids, dtype=np.int32),
            is_promotion=bool(job.is_promotion),
            req_context=job.req_context,
            submit_time=float(job.submit_time),
        )

    @staticmethod
    def _to_vllm(job: Any, result: JobResult) -> VllmJobResult:
        successful: list[Any] | None = None
        success = bool(result.success)
        if job.is_promotion and not success:
            # Partial promotion: the keys that did land, a subset of the job's keys by construction.
            successful = [k for k in job.keys if bytes(k) in (result.successful_keys or ())] or None
        return VllmJobResult(
            job_id=job.job_id,
            success=success,
            successful_keys=successful,
            transfer_time=float(result.seconds),
            transfer_bytes=int(result.nbytes),
        )

    def _error(self, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now >= self._next_error_log:
            self._next_error_log = now + _LOG_INTERVAL
            log.warning("kvtier: tier %r %s failed: %s: %s", self._tier.name, what, type(exc).__name__, exc)

    def _fail(self, job: Any, reason: str) -> None:
        if self._events is not None:
            self._events.forget(job.job_id)
        if self._inflight.pop(job.job_id, None) is not None:
            self._ready.append(
                VllmJobResult(job_id=job.job_id, success=False, transfer_time=0.0, transfer_bytes=0)
            )
        log.debug("kvtier: job %s failed before it started: %s", job.job_id, reason)

    def _fail_started_load(self, job: Any, reason: str) -> None:
        """Fail a promotion whose ``submit_load`` raised: the tier may have started part of it.

        Its chunks must not go back to vLLM's free pool while the tier's I/O may still write them.
        vLLM 0.34 takes the failed result now with a ``deferred_release`` event, set by
        :meth:`_release_if_quiet`; older vLLM frees a failed promotion's chunks at once, so the
        result itself waits there.
        """
        if self._inflight.pop(job.job_id, None) is None:
            return
        log.debug("kvtier: promotion %s failed after it may have started: %s", job.job_id, reason)
        if compat.HAS_DEFERRED_RELEASE:
            event = threading.Event()
            self._unsafe_events.append(event)
            # A field of vLLM 0.34's JobResult only (the type checker may see an older vLLM).
            since_034: dict[str, Any] = {"deferred_release": event}
            self._ready.append(
                VllmJobResult(
                    job_id=job.job_id, success=False, transfer_time=0.0, transfer_bytes=0, **since_034
                )
            )
        else:
            self._unsafe_results.append(
                VllmJobResult(job_id=job.job_id, success=False, transfer_time=0.0, transfer_bytes=0)
            )

    def _release_unsafe(self) -> None:
        """The tier's I/O can no longer touch the primary: release every deferred chunk."""
        for event in self._unsafe_events:
            event.set()
        self._unsafe_events.clear()
        self._ready.extend(self._unsafe_results)
        self._unsafe_results.clear()

    def _release_if_quiet(self) -> None:
        """Release deferred chunks once the tier has no job in flight (non-blocking)."""
        if not (self._unsafe_events or self._unsafe_results):
            return
        try:
            busy = self._tier.has_pending_work()
        except Exception as exc:
            self._error("has_pending_work", exc)
            return  # unknown: keep the chunks until drain_jobs
        if not busy:
            self._release_unsafe()

    def _collect(self) -> None:
        """Move the tier's new results into ``_ready``, once per in-flight job id."""
        if self._events is not None:
            self._events.take_removals(self._inflight)
        self._release_if_quiet()
        try:
            results = self._tier.get_finished_jobs()
        except Exception as exc:
            self._error("get_finished_jobs", exc)
            return
        for result in results:
            job = self._inflight.pop(result.job_id, None)
            if job is None:
                _log_once(
                    f"dup:{self._tier.name}",
                    "kvtier: tier %r reported job %s that is not in flight (dropped; reported once only)",
                    self._tier.name,
                    result.job_id,
                )
                continue
            if self._events is not None and not job.is_promotion:
                self._events.stored(job, result)
            self._ready.append(self._to_vllm(job, result))

    # -- KV events (see .events) ---------------------------------------------------------------
    def take_events(self) -> Iterable[OffloadingEvent]:
        """Blocks stored into and removed from the kvtier tier since the last call, in order.

        Empty unless the entry sets ``enable_kv_events`` and vLLM publishes KV cache events. A
        ``stored`` event is published when the store job is collected (vLLM's per-step poll); a
        ``removed`` event when the tier reports the block gone (its eviction, a corrupt or missing
        block, another process's eviction of a shared medium), at the next poll or call.
        """
        if self._events is None:
            return []
        # Removals only: finished jobs wait for vLLM's own poll (their stored events come then).
        return self._events.take(self._inflight)

    def _submit(self, job: Any, load: bool) -> None:
        self._inflight[job.job_id] = job
        try:
            kv_job = self._to_kvtier(job)
            if load:
                self._tier.submit_load(kv_job)
            else:
                self._tier.submit_store(kv_job)
        except Exception as exc:
            self._error("submit_load" if load else "submit_store", exc)
            if load and bool(job.is_promotion):
                self._fail_started_load(job, f"{type(exc).__name__}: {exc}")
            else:
                self._fail(job, f"{type(exc).__name__}: {exc}")

    # -- vLLM's SecondaryTierManager contract ---------------------------------------------------
    def lookup(self, key: Any, req_context: Any) -> Any:
        try:
            answer = _LOOKUP[self._tier.lookup(BlockKey(bytes(key)), req_context)]
        except Exception as exc:
            self._error("lookup", exc)
            return VllmLookup.MISS
        if answer is VllmLookup.HIT:
            self._note_hit(bytes(key), req_context)
        return answer

    def _note_hit(self, key: bytes, req_context: Any) -> None:
        req_id = getattr(req_context, "req_id", None)
        if req_id is None:
            return
        hits = self._hits.get(req_id)
        if hits is None:
            if len(self._hits) >= _MAX_TRACKED_REQUESTS:
                del self._hits[next(iter(self._hits))]
            hits = self._hits[req_id] = set()
        hits.add(key)

    def submit_store(self, job_metadata: Any) -> None:
        self._submit(job_metadata, load=False)

    def submit_load(self, job_metadata: Any) -> None:
        self._submit(job_metadata, load=True)

    def get_finished_jobs(self) -> Iterable[Any]:
        self._collect()
        if self._served is not None:
            self._ready += self._served.finished()
        out, self._ready = self._ready, []
        return out

    def has_pending_work(self) -> bool:
        served = self._served is not None and self._served.pending()
        # Deferred chunks count: vLLM keeps stepping (and polling) until they are released.
        return bool(self._inflight or self._ready or served or self._unsafe_events or self._unsafe_results)

    def serve_external_requests(self, parent: Any) -> None:
        """Answer queued p2p peer requests from vLLM's primary tier (see :mod:`.serve`)."""
        if self._served is not None:
            self._served.serve(parent)

    def touch(self, keys: Collection[Any], req_context: Any) -> None:
        """vLLM 0.32/0.33's optional hook (their scheduler never calls it; 0.34 removed it)."""
        self._touch(keys)

    def _touch(self, keys: Iterable[Any]) -> None:
        try:
            self._tier.touch([BlockKey(bytes(k)) for k in keys])
        except Exception as exc:
            self._error("touch", exc)

    def on_new_request(self, req_context: Any) -> Any:
        if has_pin(getattr(req_context, "kv_hints", None)):  # vLLM's own CPU tier decides evictions here
            _log_once("kv_hints:tier", TIER_PIN_NOTICE)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: Any) -> None:
        """Refresh the blocks this request found in the tier (its lookup hits), once."""
        req_id = getattr(req_context, "req_id", None)
        hits = self._hits.pop(req_id, None) if isinstance(req_id, str) else None
        if hits:
            self._touch(sorted(hits))

    def drain_jobs(self) -> None:
        """Wait until no job touches the primary buffer and every job has a result.

        The tier's ``drain`` finishes every copy it started (never aborts one); a job it already
        finished but has not published yet is waited for up to 5 s, then reported failed: vLLM
        asserts that every job is accounted for after a drain, and the bytes of a job that was
        drained are no longer being copied, so failing it is safe. For the same reason every
        deferred release (a promotion that failed after it may have started) happens here at the
        latest, as vLLM 0.34 requires.
        """
        self._tier.drain()
        if self._served is not None:
            # Sends to peers read pinned primary chunks: they end (or are given up) first.
            self._ready += self._served.drain(_DRAIN_REPORT_TIMEOUT)
        self._release_unsafe()
        deadline = time.monotonic() + _DRAIN_REPORT_TIMEOUT
        while True:
            self._collect()
            if not self._inflight:
                return
            if time.monotonic() >= deadline:
                for job in list(self._inflight.values()):
                    self._fail(job, "no result after drain")
                log.warning("kvtier: tier %r left jobs unreported after drain; failed them", self._tier.name)
                return
            time.sleep(0.001)

    def shutdown(self) -> None:
        """Shut the kvtier tier down and let go of it. Idempotent.

        The kvtier tier's numpy view of the primary buffer keeps vLLM's shared region exported;
        while it lives, vLLM's primary tier cannot unmap the region at its own shutdown (which
        follows this one) and logs that it keeps it mapped. Dropping the tier, and collecting the
        reference cycles it leaves (vLLM froze the heap: see :mod:`.teardown`), releases the view.
        """
        tier = getattr(self, "_tier", None)
        if tier is None:
            return
        if self._service is not None:
            # Peers waiting for an answer get "not held" at once; then the server ends every
            # connection and joins its threads (they read the primary buffer), before vLLM unmaps it.
            self._served.close()
            self._service.close()
            self._service = self._served = None
        tier.shutdown()
        # Everything that still names the tier goes too (the KV event log holds it), else the tier
        # and its view outlive this call and vLLM logs "Failed to close mmap_obj" at its cleanup.
        self._events = None
        del self._tier, tier
        collect_cycles()  # vLLM froze the heap at start-up: a plain collect would skip the tier

    # -- metrics -------------------------------------------------------------------------------
    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        from vllm.v1.kv_offload.base import OffloadingCounterMetadata

        return {
            f"{METRIC_PREFIX}{name}": OffloadingCounterMetadata(
                documentation=f"kvtier tier counter {name!r} (kvtier.tiers.base.TierStats).",
                labelnames=(METRIC_LABEL,),
            )
            for name in _COUNTERS
        }

    def get_stats(self) -> Any:
        """Counter increases since the last call, as vLLM's offloading stats (``None`` if none)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats

        try:
            now = self._tier.get_stats()
        except Exception as exc:
            self._error("get_stats", exc)
            return None
        stats = OffloadingConnectorStats()
        for name in _COUNTERS:
            delta = int(now.get(name, 0)) - self._last_counters.get(name, 0)
            if delta > 0:
                stats.increase_counter(f"{METRIC_PREFIX}{name}", delta, (self._tier.name,))
        self._last_counters = {name: int(now.get(name, 0)) for name in _COUNTERS}
        return None if stats.is_empty() else stats

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return ("kvtier_tier_type", "kvtier_namespace")

    def config_info(self) -> Mapping[str, str | int | float | bool]:
        return {"kvtier_tier_type": self._kvtier_type, "kvtier_namespace": self.namespace.root.hex()[:12]}
