"""The KV events one ``KvtierTier`` publishes to vLLM: blocks its kvtier tier stored and removed.

vLLM drains them with ``take_events`` and hands them to its KV-event publisher, so a cache-aware
router (llm-d's KV indexer, Dynamo's router) knows which blocks this tier holds. Published exactly
when vLLM's own fs tier would: only while vLLM publishes KV cache events at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vllm.v1.kv_offload.base import OffloadingEvent

from kvtier.jobs import JobResult

__all__ = ["TierEvents"]

# The fields this vLLM's OffloadingEvent has (ownership, removal_expected, locality came later).
_EVENT_FIELDS = frozenset(getattr(OffloadingEvent, "__dataclass_fields__", ()))


class TierEvents:
    """Pending ``stored`` / ``removed`` events of one kvtier tier, in order.

    ``gone`` remembers, per in-flight store job, its keys the tier reported removed meanwhile, so
    that job's ``stored`` event (published when the job is collected, possibly later) leaves them
    out: a router is never told the tier holds a block it already dropped. At worst a block is then
    announced late or never, which costs a router a missed hint, not a miss.
    """

    def __init__(self, tier: Any) -> None:
        self._tier = tier
        self.medium: Any = None
        self.locality: Any = None
        self._events: list[OffloadingEvent] = []
        self._gone: dict[int, set[bytes]] = {}

    @classmethod
    def enable(
        cls, offloading_spec: Any, tier: Any, tier_type: str, log_once: Callable[..., None]
    ) -> TierEvents | None:
        """Events for ``tier``, or ``None`` (logged once) when vLLM's KV cache events are off
        (``--kv-events-config``: vLLM would never drain them) or the tier stores nothing of its own."""
        events_config = getattr(offloading_spec, "kv_events_config", None)
        if not getattr(events_config, "enable_kv_cache_events", False):
            log_once(
                f"events-off:{tier_type}",
                "kvtier: enable_kv_events is set on tier %r but vLLM's KV cache events are disabled "
                "(--kv-events-config); the tier emits no events",
                tier_type,
            )
            return None
        if getattr(tier, "stores_nothing", False):
            log_once(
                f"events-none:{tier_type}",
                "kvtier: tier %r stores nothing of its own (its hits are other instances' blocks); it "
                "emits no KV events",
                tier_type,
            )
            return None
        tier.removals.enable()
        return cls(tier)

    def _event(self, keys: list[Any], *, removed: bool) -> OffloadingEvent:
        fields: dict[str, Any] = {
            "keys": keys,
            "medium": self.medium,
            "removed": removed,
            "locality": self.locality,
            # Which tier holds it, so a router (and vLLM's event tracker) keeps this residency
            # apart from the primary tier's and from other tiers of the same medium.
            "ownership": self._tier.name,
            # Every block announced here is also announced when it goes.
            "removal_expected": not removed,
        }
        return OffloadingEvent(**{k: v for k, v in fields.items() if k in _EVENT_FIELDS})

    def take_removals(self, inflight: Mapping[int, Any]) -> None:
        """The tier's removals since the last call become ``removed`` events (see the class doc)."""
        removed = self._tier.removals.take()
        if not removed:
            return
        gone = {bytes(k) for k in removed}
        for job_id, job in inflight.items():
            if not job.is_promotion:
                hit = gone.intersection(bytes(k) for k in job.keys)
                if hit:
                    self._gone.setdefault(job_id, set()).update(hit)
        self._events.append(self._event([bytes(k) for k in removed], removed=True))

    def stored(self, job: Any, result: JobResult) -> None:
        """A collected store job: a ``stored`` event for the blocks it landed and the tier still holds."""
        gone = self._gone.pop(job.job_id, set())
        held = result.successful_keys
        if result.success:
            keys = [k for k in job.keys if bytes(k) not in gone]
        elif held:
            keys = [k for k in job.keys if bytes(k) in held and bytes(k) not in gone]
        else:
            keys = []
        if keys:
            self._events.append(self._event(list(keys), removed=False))

    def forget(self, job_id: int) -> None:
        """A job that failed before it started: nothing of it is announced."""
        self._gone.pop(job_id, None)

    def take(self, inflight: Mapping[int, Any]) -> Iterable[OffloadingEvent]:
        """Every pending event, removals up to now included; the log starts empty again."""
        self.take_removals(inflight)
        out, self._events = self._events, []
        return out
