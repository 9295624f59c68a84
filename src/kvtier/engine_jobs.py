"""Tier jobs of one :class:`~kvtier.engine.Engine`: submission, admission, completion, drain.

Kept apart from the facade so the engine reads as API and this module as bookkeeping. Every method
runs under the engine's lock (the ``*_locked`` names say so where it matters).

Admission control: at most ``max_inflight_jobs`` tier jobs are in flight; promotions may hold at most
``promotion_share`` of that budget (at least one job), so a burst of promotions can never take the
slots stores need (vLLM #49902/#50014). A promotion over budget is refused (the key is answered MISS
and counted in ``promotions_rejected``); a store over budget waits in a bounded FIFO, its slots
pinned, and is submitted by the next ``poll``; when the FIFO is full the oldest waiting store is
given up (its slots unpinned, counted in ``tier_stores_dropped``).

Cost gate: when the config has a ``cost_model``, a batch of keys found in a tier is promoted only if
:meth:`~kvtier.costmodel.CostModel.should_load` says loading it beats recomputing it; otherwise the
keys are not loaded from that tier (the next tier is asked; if none loads them they are MISS) and
counted in ``promotions_skipped_cost``. One check per (tier, lookup call), none without a model.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult

if TYPE_CHECKING:
    from kvtier.costmodel import CostModel
    from kvtier.engine import Engine

__all__ = ["JobBook"]

log = logging.getLogger("kvtier.engine")

_LOG_EVERY = 60.0
_HIT, _PENDING, _RETRY = 1, 2, 3  # LookupReport.codes values


@dataclass(slots=True)
class _Job:
    tier: int
    promotion: bool
    keys: list[BlockKey]
    slots: list[int]


class JobBook:
    """In-flight and waiting tier jobs of one engine."""

    def __init__(
        self, engine: Engine, max_inflight: int, promotion_share: float, cost: CostModel | None = None
    ) -> None:
        self.e = engine
        #: Decides whether a tier's hits are worth loading (``None``: always promote).
        self.cost = cost
        self.max_inflight = max_inflight
        self.max_promotions = max(1, int(promotion_share * max_inflight))
        self.max_deferred = 4 * max_inflight
        self.jobs: dict[int, _Job] = {}
        self.deferred: deque[tuple[int, list[BlockKey], list[int], Any]] = deque()
        self.promotions_inflight = 0
        self.n: dict[str, int] = dict.fromkeys(
            ("jobs_submitted", "jobs_finished", "jobs_failed", "unknown_results", "tier_stores_dropped"), 0
        )
        self._logged: dict[tuple[int, str], float] = {}
        # Per tier index: [read_seconds, write_seconds, read_jobs, write_jobs] of reported jobs, and
        # the keys found there but not loaded because the cost model said recomputing is faster.
        self.io: list[list[float]] = [[0.0, 0.0, 0, 0, 0] for _ in engine.tiers]

    @property
    def inflight(self) -> int:
        return len(self.jobs)

    def counters(self) -> dict[str, int]:
        out = dict(self.n)
        out["jobs_inflight"] = len(self.jobs)
        out["promotions_inflight"] = self.promotions_inflight
        out["deferred_stores"] = len(self.deferred)
        return out

    def tier_io(self, t: int) -> dict[str, float | int]:
        """Engine-side counters of tier ``t``: seconds and jobs per direction, cost-gate skips.

        ``read`` is tier -> primary (promotion/load jobs), ``write`` is primary -> tier (store jobs);
        seconds are the sum of the tiers' ``JobResult.seconds`` over every reported job.
        ``promotions_skipped_cost`` counts keys found in the tier that the cost gate did not load.
        """
        rs, ws, rj, wj, sk = self.io[t]
        return {
            "read_seconds": rs,
            "write_seconds": ws,
            "read_jobs": int(rj),
            "write_jobs": int(wj),
            "promotions_skipped_cost": int(sk),
        }

    def tier_error(self, t: int, what: str, exc: BaseException) -> None:
        """Count a tier failure; log it at most once a minute per (tier, operation)."""
        self.e.c["tier_errors"] += 1
        now = time.monotonic()
        if now - self._logged.get((t, what), -_LOG_EVERY) >= _LOG_EVERY:
            self._logged[(t, what)] = now
            name = self.e.tiers[t].name if t < len(self.e.tiers) else str(t)
            log.warning(
                "kvtier: tier %s %s failed (treated as a miss): %s: %s", name, what, type(exc).__name__, exc
            )

    def lookup_tiers(
        self,
        ikeys: list[BlockKey],
        slots: list[int],
        codes: bytearray,
        request: Any,
    ) -> tuple[int, int]:
        """Ask the tiers, in order, about keys not in the primary (lock held).

        Updates ``codes`` (2 HIT_PENDING for promoted keys, 3 RETRY) and returns (retries, promoted).
        """
        remaining = [i for i, s in enumerate(slots) if s < 0]
        # Primary hits of this very call must survive the evictions promotions may cause.
        held = [s for i, s in enumerate(slots) if codes[i] == _HIT]
        self.e.primary.pin(held)
        promoted_n = 0
        try:
            for t, tier in enumerate(self.e.tiers):
                if not remaining:
                    break
                ks = [ikeys[i] for i in remaining]
                try:
                    answers = tier.lookup_many(ks, request)
                    if len(answers) != len(ks):
                        raise ValueError(f"lookup_many answered {len(answers)} results for {len(ks)} keys")
                except Exception as exc:
                    self.tier_error(t, "lookup", exc)
                    continue
                found: list[int] = []
                rest: list[int] = []
                for i, a in zip(remaining, answers, strict=True):
                    if a is LookupResult.HIT:
                        found.append(i)
                    else:
                        if a is LookupResult.RETRY:
                            codes[i] = _RETRY
                        rest.append(i)
                if found and self.cost is not None and not self.cost.should_load(tier.name, len(found)):
                    # Loading this batch from this tier is modelled slower than recomputing it.
                    self.e.c["promotions_skipped_cost"] += len(found)
                    self.io[t][4] += len(found)
                    rest += found
                    found = []
                if found:
                    promoted = self.promote(t, [ikeys[i] for i in found], request)
                    for i, ok in zip(found, promoted, strict=True):
                        if ok:
                            codes[i] = _PENDING
                            promoted_n += 1
                        else:
                            rest.append(i)
                remaining = rest
        finally:
            self.e.primary.unpin(held)
        return sum(1 for i in remaining if codes[i] == _RETRY), promoted_n

    # -- promotions --------------------------------------------------------------------------
    def promote(self, t: int, keys: list[BlockKey], request: Any) -> list[bool]:
        """Reserve slots for ``keys`` (held by tier ``t``) and submit one load job; per-key success."""
        e = self.e
        if self.promotions_inflight >= self.max_promotions or len(self.jobs) >= self.max_inflight:
            e.c["promotions_rejected"] += len(keys)
            return [False] * len(keys)
        pl, slots, _ = e._reserve(keys)
        ok = [False] * len(keys)
        e.c["promotions_failed"] += len(keys) - len(pl)
        if not pl:
            return ok
        accepted = [keys[p] for p in pl]
        job_id = e._ids()
        self.jobs[job_id] = _Job(t, True, accepted, slots)
        self.promotions_inflight += 1
        self.n["jobs_submitted"] += 1
        try:
            job = TransferJob(job_id, accepted, np.array(slots, dtype=np.int32), True, request, e._clock())
            e.tiers[t].submit_load(job)
        except Exception as exc:
            self.tier_error(t, "submit_load", exc)
            self.finish(t, JobResult(job_id, False, error=f"{type(exc).__name__}: {exc}"))
            return ok
        for p in pl:
            ok[p] = True
        return ok

    # -- stores ------------------------------------------------------------------------------
    def submit_store(self, t: int, keys: list[BlockKey], slots: list[int], request: Any) -> None:
        """Copy READY/FLUSHING ``slots`` to tier ``t``; the slots stay pinned until the job ends."""
        self.e.primary.pin(slots)
        if len(self.jobs) >= self.max_inflight or self.deferred:
            self.deferred.append((t, keys, slots, request))
            while len(self.deferred) > self.max_deferred:
                _, k2, s2, _ = self.deferred.popleft()
                self.n["tier_stores_dropped"] += len(k2)
                persisted = self.e.primary.persisted
                for x in s2:
                    persisted[x] = 0
                self._unpin(s2)
            return
        self._submit_store_now(t, keys, slots, request)

    def _submit_store_now(self, t: int, keys: list[BlockKey], slots: list[int], request: Any) -> None:
        e = self.e
        job_id = e._ids()
        self.jobs[job_id] = _Job(t, False, keys, slots)
        self.n["jobs_submitted"] += 1
        try:
            job = TransferJob(job_id, list(keys), np.array(slots, dtype=np.int32), False, request, e._clock())
            e.tiers[t].submit_store(job)
        except Exception as exc:
            self.tier_error(t, "submit_store", exc)
            self.finish(t, JobResult(job_id, False, error=f"{type(exc).__name__}: {exc}"))

    def _unpin(self, slots: list[int]) -> None:
        freed = self.e.primary.unpin(slots)
        if freed:
            self.e._emit("evicted", freed)

    def pump(self) -> None:
        """Submit waiting stores while the budget allows."""
        while self.deferred and len(self.jobs) < self.max_inflight:
            t, keys, slots, request = self.deferred.popleft()
            self._submit_store_now(t, keys, slots, request)

    # -- completion --------------------------------------------------------------------------
    def finish(self, t: int, r: JobResult) -> None:
        """Apply one job result (each job is applied exactly once; strays are counted and ignored)."""
        rec = self.jobs.get(r.job_id)
        if rec is None or rec.tier != t:
            self.n["unknown_results"] += 1
            log.error("kvtier: tier #%d reported unknown or already finished job %s (tier bug)", t, r.job_id)
            return
        del self.jobs[r.job_id]
        e = self.e
        pr = e.primary
        name = e.tiers[t].name
        io = self.io[t]
        secs = r.seconds if isinstance(r.seconds, float | int) else 0.0  # a sloppy tier's None
        if rec.promotion:
            io[0] += secs
            io[2] += 1
        else:
            io[1] += secs
            io[3] += 1
        self.n["jobs_finished"] += 1
        if not r.success:
            self.n["jobs_failed"] += 1
        bad: list[BlockKey] = []
        bads: list[int] = []
        if r.success and r.successful_keys is None:
            okk, oks = rec.keys, rec.slots
        else:
            got = r.successful_keys or frozenset()
            okk, oks = [], []
            for k, x in zip(rec.keys, rec.slots, strict=True):
                if k in got:
                    okk.append(k)
                    oks.append(x)
                else:
                    bad.append(k)
                    bads.append(x)
        if rec.promotion:
            self.promotions_inflight -= 1
            pr.commit(okk, oks, None, persisted=True)
            pr.abort(bad, bads)
            e.c["promotions"] += len(okk)
            e.c["promotions_failed"] += len(bad)
            if okk:
                e._emit("promoted", okk, name)
            if bad:
                e._emit("promotion_failed", bad, name)
            return
        if okk:
            e._emit("stored", okk, name)
        if bad:
            # Not in the tier after all: write-back/after-hits may try again later.
            persisted = pr.persisted
            for x in bads:
                persisted[x] = 0
            e._emit("store_failed", bad, name)
        self._unpin(rec.slots)

    def poll_locked(self) -> None:
        """Collect every tier's finished jobs, then submit waiting stores."""
        for t, tier in enumerate(self.e.tiers):
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
            self.pump()
            for t, tier in enumerate(self.e.tiers):
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
