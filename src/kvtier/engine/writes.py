"""Write policies: when a block in the primary tier gets copied to the secondary tiers.

One :class:`WritePolicy` object per tier says when that tier receives a copy:

* :class:`WriteThrough`: as soon as a store completes (``write_policy: write_through``);
* :class:`WriteBack`: only when the block is evicted from the primary tier; the victim stays
  readable (FLUSHING) until the copy is done (``write_back``);
* :class:`AfterHits`: once a lookup has hit the block ``write_after_hits`` times (``after_hits``).

:class:`TierWrites` applies an engine's policies: it is the one place that turns "a store completed",
"a block was hit", "these are the victims" and ``flush()`` into store jobs, and it reserves primary
slots (reservation evicts, and what happens to a victim is the write policy's business). It records
every copy in the :class:`~kvtier.engine.residency.Residency`, the one owner of "which block is in
the tiers". It is given the engine's :class:`~kvtier.engine.parts.Parts` (the primary tier, that
residency, the counters, ``emit``) and the job book; every method runs under the engine's lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from kvtier.engine.jobs import JobBook
from kvtier.engine.parts import Parts
from kvtier.errors import ConfigError, MisuseError
from kvtier.keys import BlockKey

__all__ = [
    "AfterHits",
    "TierWrites",
    "WriteBack",
    "WritePolicy",
    "WriteThrough",
    "write_policies",
    "write_policy_type",
]


class WritePolicy:
    """When tier number ``tier`` gets a copy of a primary block (one instance per tier).

    Subclasses set the class attributes; the behaviour lives in :class:`TierWrites`, which asks them.

    Attributes:
        tier: index of the tier in the engine's ``tiers``.
        name: the ``write_policy`` config value.
        copies_on_commit: copy as soon as a store completes.
        flushes_victims: copy an evicted block before freeing its slot.
        hits_to_copy: copy once a block has been hit this many times (0: never on hits).
    """

    __slots__ = ("hits_to_copy", "tier")

    name: ClassVar[str] = ""
    copies_on_commit: ClassVar[bool] = False
    flushes_victims: ClassVar[bool] = False

    def __init__(self, tier: int, hits_to_copy: int = 0) -> None:
        self.tier = tier
        self.hits_to_copy = hits_to_copy

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tier={self.tier})"


class WriteThrough(WritePolicy):
    """Copy every completed store at once (the tier always holds what the primary holds)."""

    __slots__ = ()
    name = "write_through"
    copies_on_commit = True


class WriteBack(WritePolicy):
    """Copy a block only when it is evicted; ``flush()`` and ``close()`` copy the rest."""

    __slots__ = ()
    name = "write_back"
    flushes_victims = True


class AfterHits(WritePolicy):
    """Copy a block once lookups have hit it ``hits_to_copy`` times (reused blocks only)."""

    __slots__ = ()
    name = "after_hits"

    def __init__(self, tier: int, hits_to_copy: int = 1) -> None:
        super().__init__(tier, hits_to_copy)


_POLICIES: dict[str, type[WritePolicy]] = {c.name: c for c in (WriteThrough, WriteBack, AfterHits)}


def write_policy_type(name: str) -> type[WritePolicy]:
    """The policy class of a ``write_policy`` value; :class:`~kvtier.errors.ConfigError` if unknown."""
    cls = _POLICIES.get(name)
    if cls is None:
        raise ConfigError("write_policy", f"expected one of {', '.join(_POLICIES)}, got {name!r}")
    return cls


def write_policies(name: str, ntiers: int, after_hits: int = 1) -> list[WritePolicy]:
    """One policy object per tier for the configured ``write_policy`` (``write_after_hits``)."""
    cls = write_policy_type(name)
    if cls is AfterHits:
        return [AfterHits(t, after_hits) for t in range(ntiers)]
    return [cls(t) for t in range(ntiers)]


class TierWrites:
    """Turns primary-tier events into store jobs, as each tier's :class:`WritePolicy` says.

    Attributes:
        policies: one per tier, in tier order.
        copies_on_commit: some tier copies completed stores (the facade skips :meth:`committed`
            when none does: the simulate path pays nothing).
        hits_to_copy: the ``after_hits`` threshold, 0 when no tier copies on hits.
        flush_dirty: some tier flushes victims (write-back): reservation keeps them FLUSHING.
    """

    def __init__(self, parts: Parts, policies: Sequence[WritePolicy], jobs: JobBook) -> None:
        self._parts = parts
        self.policies = list(policies)
        self._jobs = jobs
        # Residency keeps one "in the tiers" bit per slot, so an engine's tiers must agree on when
        # they are written; write_policies() builds them that way.
        if len({(type(p), p.hits_to_copy) for p in self.policies}) > 1:
            raise MisuseError(f"the tiers of one engine must share one write policy, got {self.policies}")
        self._on_commit = [p.tier for p in self.policies if p.copies_on_commit]
        self._on_evict = [p.tier for p in self.policies if p.flushes_victims]
        self._on_hits = [p.tier for p in self.policies if p.hits_to_copy]
        self.copies_on_commit = bool(self._on_commit)
        self.flush_dirty = bool(self._on_evict)
        self.hits_to_copy = self.policies[0].hits_to_copy if self._on_hits else 0

    def _submit(self, tiers: list[int], keys: list[BlockKey], slots: list[int], request: Any) -> None:
        submit = self._jobs.submit_store
        for t in tiers:
            submit(t, keys, slots, request)

    def committed(self, keys: list[BlockKey], slots: list[int], request: Any) -> None:
        """A store completed (``slots`` READY): write-through copies them now."""
        if self._on_commit:
            self._parts.residency.copied(slots)
            self._submit(self._on_commit, keys, slots, request)

    def hit(self, keys: list[BlockKey], request: Any) -> None:
        """Lookups hit ``keys`` (READY, in the primary): after-hits copies those hit often enough.

        The engine calls this after the lookup's tier lookups and promotions, never before. An
        asynchronous tier makes room for a copy (evicting) on its worker, whenever that gets to
        the job: a copy submitted first could evict, or not yet, a block the same call then looks
        up, depending on thread timing. Submitted after them, the copy sees the call's promotions
        already submitted (their blocks protected from its evictions, and loaded first), in real
        mode as in the simulator, whose tiers finish every job at once (docs/replay.md).
        """
        if self._on_hits:
            due = self._parts.residency.due_after_hits(keys, self.hits_to_copy)
            if due:
                self._submit(self._on_hits, self._parts.primary.keys_of(due), due, request)

    def flush(self) -> int:
        """Copy every READY block not in the tiers yet, to every tier; the number of blocks."""
        due = self._parts.residency.uncopied_ready()
        if due:
            self._submit(list(range(len(self.policies))), self._parts.primary.keys_of(due), due, None)
        return len(due)

    def reserve(self, keys: list[BlockKey]) -> tuple[list[int], list[int], int]:
        """WRITING slots for the keys not resident yet: ``(positions, slots, dropped)``.

        Victims are freed (``evicted`` events) or, under write-back, kept FLUSHING and copied first.
        Write-back victims free their slots only when their flush ends; when keys were dropped for
        want of a slot, fast tiers may be done already, so their results are collected and the
        dropped keys tried once more (without evicting again).
        """
        pr = self._parts.primary
        pos, slots, evicted, flush_keys, flush_slots, dropped = pr.reserve(keys, flush_dirty=self.flush_dirty)
        if evicted:
            self._parts.counters["evictions"] += len(evicted)
            self._parts.emit("evicted", evicted, None)
        if flush_keys:
            self._parts.counters["evictions"] += len(flush_keys)
            self._parts.counters["writebacks"] += len(flush_keys)
            self._submit(self._on_evict, flush_keys, flush_slots, None)
        if dropped and self.flush_dirty and self._jobs.inflight:
            self._jobs.poll_locked()
            if pr.num_free:
                pos2, slots2, _, _, _, dropped = pr.reserve(keys, evict=False)
                pos = pos + pos2
                slots = slots + slots2
        return pos, slots, dropped
