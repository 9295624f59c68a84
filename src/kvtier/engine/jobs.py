"""The job book: every tier job of one engine from submission to its one result.

Owns the in-flight jobs (id -> tier, kind, keys, slots, start time), the FIFO of store jobs waiting
for budget, the job counters (``jobs_submitted``, ``jobs_finished``, ...), the per-tier totals
(:class:`TierIo`: I/O seconds, jobs in flight, errors, promotions) and the rate-limited logging of
tier failures; it times each job from submission to its result into the engine's
:class:`~kvtier.engine.latency.Latency`. It applies each :class:`~kvtier.jobs.JobResult` exactly once:
a finished promotion makes its slots READY (or frees them), a finished store unpins its slots.

It does not decide *what* to copy (the write policies in :mod:`kvtier.engine.writes` do) nor *whether*
to promote (:mod:`kvtier.engine.admission` does); it is given only what it needs: the primary tier,
the tiers, the job-id source, the clock, an ``emit(kind, keys, tier)`` callback, the engine's counter
dict and the :class:`~kvtier.engine.residency.Residency` it reports copies to (all in the engine's
:class:`~kvtier.engine.parts.Parts`). Every method runs
under the engine's lock (the ``*_locked`` names say so where it matters).

Back-pressure: at most ``max_inflight`` tier jobs are in flight; a store over budget waits in a
bounded FIFO (``4 * max_inflight``), its slots pinned, and is submitted by the next ``poll``; when
the FIFO is full the oldest waiting store is given up (slots unpinned, ``tier_stores_dropped``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtier.engine.parts import Emit, Parts
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey

__all__ = ["Emit", "JobBook", "TierIo"]

log = logging.getLogger("kvtier.engine")

_LOG_EVERY = 60.0


@dataclass(slots=True)
class _Job:
    tier: int
    promotion: bool
    keys: list[BlockKey]
    slots: list[int]
    started: float  # time.perf_counter() at submission


@dataclass(slots=True)
class TierIo:
    """Engine-side totals of one tier.

    ``read`` is tier -> primary (promotions), ``write`` is primary -> tier (stores); seconds are the
    sum of the tiers' ``JobResult.seconds`` over every reported job. ``inflight_jobs``: submitted,
    not yet reported (:meth:`JobBook.tier_io` adds ``deferred_stores``, stores waiting for budget);
    ``errors``: calls to the tier that raised (each answered as a miss); ``jobs_failed``: jobs it
    reported failed; ``promotions`` / ``promotions_failed``: blocks its load jobs did / did not
    bring into the primary tier.
    """

    read_seconds: float = 0.0
    write_seconds: float = 0.0
    read_jobs: int = 0
    write_jobs: int = 0
    inflight_jobs: int = 0
    errors: int = 0
    jobs_failed: int = 0
    promotions: int = 0
    promotions_failed: int = 0


class JobBook:
    """In-flight and waiting tier jobs of one engine.

    Args:
        parts: the engine's shared parts; the book uses the primary tier (the slots the jobs read
            and write), the tiers (by index, ``t`` below), the job ids, the clock (stamped on each
            :class:`~kvtier.jobs.TransferJob`), ``emit`` (``stored``/``promoted``/``*_failed``/
            ``evicted``), the counters (``tier_errors``, ``promotions``, ``promotions_failed``), the
            residency (told when a promotion lands and when a store's copy is lost), the job budget
            and the latency histograms (each job's duration, submission to result).
    """

    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self.max_inflight = parts.max_inflight
        self.max_deferred = 4 * parts.max_inflight
        self.jobs: dict[int, _Job] = {}
        self.deferred: deque[tuple[int, list[BlockKey], list[int], Any]] = deque()
        self.promotions_inflight = 0
        #: Stage promotions until :meth:`flush_promotions_locked` (the next poll, drain or close):
        #: an engine asked one key at a time (vLLM's scheduler) then loads each tier's keys of a
        #: step as one job, where one job per key would cost a hand-off and a report per key.
        self.coalesce_promotions = False
        self._staged: dict[tuple[int, int], tuple[int, Any]] = {}
        self.job_counts: dict[str, int] = dict.fromkeys(
            ("jobs_submitted", "jobs_finished", "jobs_failed", "unknown_results", "tier_stores_dropped"), 0
        )
        self.tier_io_totals: list[TierIo] = [TierIo() for _ in parts.tiers]
        self._logged: dict[tuple[int, str], float] = {}

    @property
    def inflight(self) -> int:
        return len(self.jobs)

    def counters(self) -> dict[str, int]:
        """Job counters for ``Engine.stats()``."""
        out = dict(self.job_counts)
        out["jobs_inflight"] = len(self.jobs)
        out["promotions_inflight"] = self.promotions_inflight
        out["deferred_stores"] = len(self.deferred)
        return out

    def tier_io(self, t: int) -> dict[str, float | int]:
        """The engine's totals of tier ``t`` (see :class:`TierIo`)."""
        out: dict[str, float | int] = dataclasses.asdict(self.tier_io_totals[t])
        out["deferred_stores"] = sum(1 for d in self.deferred if d[0] == t)
        return out

    def tier_stats(self, t: int) -> dict[str, Any]:
        """Tier ``t``'s ``get_stats()`` (empty when it raises: counted as an error) plus :meth:`tier_io`."""
        try:
            out: dict[str, Any] = dict(self._parts.tiers[t].get_stats())
        except Exception as exc:
            self.tier_error(t, "get_stats", exc)
            out = {}
        out.update(self.tier_io(t))
        return out

    def tier_error(self, t: int, what: str, exc: BaseException) -> None:
        """Count a tier failure; log it at most once a minute per (tier, operation)."""
        self._parts.counters["tier_errors"] += 1
        if t < len(self.tier_io_totals):
            self.tier_io_totals[t].errors += 1
        now = time.monotonic()
        if now - self._logged.get((t, what), -_LOG_EVERY) >= _LOG_EVERY:
            self._logged[(t, what)] = now
            name = self._parts.tiers[t].name if t < len(self._parts.tiers) else str(t)
            log.warning(
                "kvtier: tier %s %s failed (treated as a miss): %s: %s", name, what, type(exc).__name__, exc
            )

    # -- promotions --------------------------------------------------------------------------
    def joins_staged(self, t: int, request: Any) -> bool:
        """Whether a promotion from tier ``t`` for ``request`` would join a staged job (no new job)."""
        return (t, id(request)) in self._staged

    def submit_load(self, t: int, keys: list[BlockKey], slots: list[int], request: Any) -> bool:
        """Submit one promotion job: tier ``t`` copies ``keys`` into their WRITING ``slots``.

        With :attr:`coalesce_promotions`, the job is staged instead (joining the staged job of the
        same tier and request, if any) and handed to the tier by :meth:`flush_promotions_locked`.
        Returns False when the tier refused the job (it is then finished as failed: slots freed).
        """
        if self.coalesce_promotions:
            staged = self._staged.get((t, id(request)))
            if staged is not None:
                rec = self.jobs[staged[0]]
                rec.keys += keys
                rec.slots += slots
                return True
        job_id = self._parts.ids()
        self.jobs[job_id] = _Job(t, True, list(keys), list(slots), time.perf_counter())
        self.tier_io_totals[t].inflight_jobs += 1
        self.promotions_inflight += 1
        self.job_counts["jobs_submitted"] += 1
        if self.coalesce_promotions:
            self._staged[(t, id(request))] = (job_id, request)
            return True
        return self._hand_load(t, job_id, request)

    def _hand_load(self, t: int, job_id: int, request: Any) -> bool:
        rec = self.jobs[job_id]
        rec.started = time.perf_counter()
        try:
            slots = np.array(rec.slots, dtype=np.int32)
            job = TransferJob(job_id, rec.keys, slots, True, request, self._parts.clock())
            self._parts.tiers[t].submit_load(job)
        except Exception as exc:
            self.tier_error(t, "submit_load", exc)
            self.finish(t, JobResult(job_id, False, error=f"{type(exc).__name__}: {exc}"))
            return False
        return True

    def flush_promotions_locked(self) -> None:
        """Hand every staged promotion to its tier (one job per tier and request). A tier that
        refuses one finishes it as failed: its slots are freed and later lookups miss."""
        staged, self._staged = self._staged, {}
        for (t, _), (job_id, request) in staged.items():
            self._hand_load(t, job_id, request)

    # -- stores ------------------------------------------------------------------------------
    def submit_store(self, t: int, keys: list[BlockKey], slots: list[int], request: Any) -> None:
        """Copy READY/FLUSHING ``slots`` to tier ``t``; the slots stay pinned until the job ends."""
        self._parts.primary.pin(slots)
        if len(self.jobs) >= self.max_inflight or self.deferred:
            self.deferred.append((t, keys, slots, request))
            while len(self.deferred) > self.max_deferred:
                _, given_up_keys, given_up_slots, _ = self.deferred.popleft()
                self.job_counts["tier_stores_dropped"] += len(given_up_keys)
                self._parts.residency.lost(given_up_slots)
                self._unpin(given_up_slots)
            return
        self._submit_store_now(t, keys, slots, request)

    def _submit_store_now(self, t: int, keys: list[BlockKey], slots: list[int], request: Any) -> None:
        job_id = self._parts.ids()
        self.jobs[job_id] = _Job(t, False, keys, slots, time.perf_counter())
        self.tier_io_totals[t].inflight_jobs += 1
        self.job_counts["jobs_submitted"] += 1
        try:
            job = TransferJob(
                job_id, list(keys), np.array(slots, dtype=np.int32), False, request, self._parts.clock()
            )
            self._parts.tiers[t].submit_store(job)
        except Exception as exc:
            self.tier_error(t, "submit_store", exc)
            self.finish(t, JobResult(job_id, False, error=f"{type(exc).__name__}: {exc}"))

    def _unpin(self, slots: list[int]) -> None:
        freed = self._parts.primary.unpin(slots)
        if freed:
            self._parts.emit("evicted", freed, None)

    def pump(self) -> None:
        """Submit waiting stores while the budget allows."""
        while self.deferred and len(self.jobs) < self.max_inflight:
            t, keys, slots, request = self.deferred.popleft()
            self._submit_store_now(t, keys, slots, request)

    # -- completion --------------------------------------------------------------------------
    def finish(self, t: int, result: JobResult) -> None:
        """Apply one job result (each job is applied exactly once; strays are counted and ignored)."""
        rec = self.jobs.get(result.job_id)
        if rec is None or rec.tier != t:
            self.job_counts["unknown_results"] += 1
            log.error(
                "kvtier: tier #%d reported unknown or already finished job %s (tier bug)", t, result.job_id
            )
            return
        del self.jobs[result.job_id]
        self._parts.latency.job(t, rec.promotion, time.perf_counter() - rec.started)
        name = self._parts.tiers[t].name
        io = self.tier_io_totals[t]
        io.inflight_jobs -= 1
        secs = result.seconds if isinstance(result.seconds, float | int) else 0.0  # a sloppy tier's None
        if rec.promotion:
            io.read_seconds += secs
            io.read_jobs += 1
        else:
            io.write_seconds += secs
            io.write_jobs += 1
        self.job_counts["jobs_finished"] += 1
        if not result.success:
            self.job_counts["jobs_failed"] += 1
            io.jobs_failed += 1
        bad_keys: list[BlockKey] = []
        bad_slots: list[int] = []
        if result.success and result.successful_keys is None:
            ok_keys, ok_slots = rec.keys, rec.slots
        else:
            got = result.successful_keys or frozenset()
            ok_keys, ok_slots = [], []
            for k, x in zip(rec.keys, rec.slots, strict=True):
                if k in got:
                    ok_keys.append(k)
                    ok_slots.append(x)
                else:
                    bad_keys.append(k)
                    bad_slots.append(x)
        if rec.promotion:
            self.promotions_inflight -= 1
            pr = self._parts.primary
            pr.commit(ok_keys, ok_slots, None)
            self._parts.residency.copied(ok_slots)  # it came from a tier: write-back need not flush it
            pr.abort(bad_keys, bad_slots)
            self._parts.counters["promotions"] += len(ok_keys)
            self._parts.counters["promotions_failed"] += len(bad_keys)
            io.promotions += len(ok_keys)
            io.promotions_failed += len(bad_keys)
            if ok_keys:
                self._parts.emit("promoted", ok_keys, name)
            if bad_keys:
                self._parts.emit("promotion_failed", bad_keys, name)
            return
        if ok_keys:
            self._parts.emit("stored", ok_keys, name)
        if bad_keys:
            self._parts.residency.lost(bad_slots)  # write-back/after-hits may try again later
            self._parts.emit("store_failed", bad_keys, name)
        self._unpin(rec.slots)

    def poll_locked(self) -> None:
        """Hand staged promotions over, collect every tier's finished jobs, submit waiting stores."""
        self.flush_promotions_locked()
        for t, tier in enumerate(self._parts.tiers):
            try:
                results = tier.get_finished_jobs()
            except Exception as exc:
                self.tier_error(t, "get_finished_jobs", exc)
                continue
            for r in results:
                self.finish(t, r)
        self.pump()

    def drain_locked(self) -> None:
        """Until no job is in flight or waiting: submit, drain every tier, collect."""
        while True:
            before = len(self.jobs) + len(self.deferred)
            self.flush_promotions_locked()
            self.pump()
            for t, tier in enumerate(self._parts.tiers):
                try:
                    tier.drain()
                except Exception as exc:
                    self.tier_error(t, "drain", exc)
            self.poll_locked()
            after = len(self.jobs) + len(self.deferred)
            if after == 0:
                return
            if after >= before:
                # A tier drained but did not report its jobs: contract breach; do not spin forever.
                log.error(
                    "kvtier: %d tier job(s) still unreported after drain(); their slots stay pinned", after
                )
                return
