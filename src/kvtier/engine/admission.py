"""Admission: which keys found in a secondary tier are promoted into the primary tier.

:meth:`Admission.lookup_tiers` asks the tiers, in order, about the keys a lookup did not find in the
primary tier, and decides for each batch a tier holds whether to load it:

* **promotion share**: promotions may hold at most ``promotion_share`` of the ``max_inflight_jobs``
  budget (at least one job), so a burst of promotions can never take the budget stores need
  (vLLM #49902/#50014). A promotion over budget is refused: the keys are answered MISS and counted in
  ``promotions_rejected``.
* **cost gate**: with a ``cost_model`` configured, a batch is promoted only if
  :meth:`~kvtier.costmodel.CostModel.should_load` says loading it beats recomputing it; otherwise the
  next tier is asked (if none loads the keys they are MISS) and the keys are counted in
  ``promotions_skipped_cost``, per tier too. One check per (tier, lookup call), none without a model.

A promoted key gets a WRITING slot (reserved through the write policies, which decide what happens
to the victims) and one load job per (tier, lookup call) is submitted to the job book. Given the
engine's :class:`~kvtier.engine.parts.Parts` (the tiers, the counters, the primary tier: this call's
own hits are pinned while promotions evict), the job book and a ``reserve`` callable; runs under the
engine's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvtier.engine.jobs import JobBook
from kvtier.engine.parts import Parts
from kvtier.keys import BlockKey, LookupCode, LookupResult

if TYPE_CHECKING:
    from kvtier.costmodel import CostModel

__all__ = ["Admission", "Reserve"]

_HIT, _PENDING, _RETRY = int(LookupCode.HIT), int(LookupCode.HIT_PENDING), int(LookupCode.RETRY)

#: ``reserve(keys) -> (positions, slots, dropped)``: WRITING slots for the keys not resident yet.
Reserve = Callable[[list[BlockKey]], tuple[list[int], list[int], int]]


class Admission:
    """Promotion decisions of one engine: budget share and cost gate.

    Attributes:
        cost: decides whether a tier's hits are worth loading (``None``: always promote).
        max_promotions: promotion jobs allowed in flight at once.
        skipped_cost: per tier, keys found there that the cost gate did not load.
    """

    def __init__(
        self,
        parts: Parts,
        jobs: JobBook,
        reserve: Reserve,
        promotion_share: float,
        cost: CostModel | None = None,
    ) -> None:
        self._parts = parts
        self._jobs = jobs
        self._reserve = reserve
        self.cost = cost
        self.max_promotions = max(1, int(promotion_share * jobs.max_inflight))
        self.skipped_cost: list[int] = [0] * len(parts.tiers)

    def lookup_tiers(
        self, keys: list[BlockKey], slots: list[int], codes: bytearray, request: Any
    ) -> tuple[int, int]:
        """Ask the tiers, in order, about ``keys`` whose primary ``slots`` are ``-1``.

        Updates ``codes`` (HIT_PENDING for promoted keys, RETRY where a tier said so) and returns
        ``(retries, promoted)``.
        """
        remaining = [i for i, s in enumerate(slots) if s < 0]
        # Primary hits of this very call must survive the evictions promotions may cause.
        held = [s for i, s in enumerate(slots) if codes[i] == _HIT]
        self._parts.primary.pin(held)
        promoted_n = 0
        try:
            for t, tier in enumerate(self._parts.tiers):
                if not remaining:
                    break
                asked = [keys[i] for i in remaining]
                try:
                    answers = tier.lookup_many(asked, request)
                    if len(answers) != len(asked):
                        raise ValueError(f"lookup_many answered {len(answers)} results for {len(asked)} keys")
                except Exception as exc:
                    self._jobs.tier_error(t, "lookup", exc)
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
                    self._parts.counters["promotions_skipped_cost"] += len(found)
                    self.skipped_cost[t] += len(found)
                    rest += found
                    found = []
                if found:
                    promoted = self.promote(t, [keys[i] for i in found], request)
                    for i, ok in zip(found, promoted, strict=True):
                        if ok:
                            codes[i] = _PENDING
                            promoted_n += 1
                        else:
                            rest.append(i)
                remaining = rest
        finally:
            self._parts.primary.unpin(held)
        return sum(1 for i in remaining if codes[i] == _RETRY), promoted_n

    def promote(self, t: int, keys: list[BlockKey], request: Any) -> list[bool]:
        """Reserve slots for ``keys`` (held by tier ``t``) and submit one load job; per-key success."""
        jobs = self._jobs
        over = jobs.promotions_inflight >= self.max_promotions or jobs.inflight >= jobs.max_inflight
        if over and not jobs.joins_staged(t, request):  # joining a staged job adds no job
            self._parts.counters["promotions_rejected"] += len(keys)
            return [False] * len(keys)
        positions, slots, _ = self._reserve(keys)
        ok = [False] * len(keys)
        self._parts.counters["promotions_failed"] += len(keys) - len(positions)
        if not positions:
            return ok
        if jobs.submit_load(t, [keys[p] for p in positions], slots, request):
            for p in positions:
                ok[p] = True
        return ok
