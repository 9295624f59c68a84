"""Which primary blocks the secondary tiers hold: the one owner of ``PrimaryTier.persisted``/``hits``.

The primary tier keeps two per-slot arrays for the engine (``bytearray``/``array('i')``, fast to
index from Python): ``persisted[s]`` is 1 once slot ``s``'s block has been handed to the secondary
tiers (or was loaded from one), ``hits[s]`` counts lookups that hit it (for ``after_hits``). Only
:class:`Residency` sets them; the primary tier reads ``persisted`` (a write-back victim already in
the tiers is freed at once instead of being flushed again) and clears both when a slot is freed.

Who calls what:
    * the write policies (:mod:`kvtier.engine.writes`) mark blocks :meth:`~Residency.copied` when
      they hand them to the tiers, and ask :meth:`~Residency.due_after_hits` /
      :meth:`~Residency.uncopied_ready` what to copy next;
    * the job book (:mod:`kvtier.engine.jobs`) marks promoted blocks :meth:`~Residency.copied` and
      reports :meth:`~Residency.lost` when a store job fails or a waiting store is given up, so the
      write policy may try again later.

One bit per slot, not per tier: every tier of an engine follows the same write policy, so "handed
to the tiers" means handed to all of them. Every method runs under the engine's lock.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.keys import BlockKey
from kvtier.primary import PrimaryTier

__all__ = ["Residency"]


class Residency:
    """The ``persisted``/``hits`` bookkeeping of one engine's primary tier."""

    __slots__ = ("_primary",)

    def __init__(self, primary: PrimaryTier) -> None:
        self._primary = primary

    def copied(self, slots: Sequence[int]) -> None:
        """The blocks in ``slots`` are (being) copied to the tiers, or came from one."""
        persisted = self._primary.persisted
        for s in slots:
            persisted[s] = 1

    def lost(self, slots: Sequence[int]) -> None:
        """A copy of ``slots`` did not reach its tier (failed or given up): not in the tiers after all."""
        persisted = self._primary.persisted
        for s in slots:
            persisted[s] = 0

    def due_after_hits(self, keys: Sequence[BlockKey], threshold: int) -> list[int]:
        """Count one hit on each resident key; the slots that just reached ``threshold`` hits and are
        not in the tiers yet, marked copied (the caller submits them)."""
        pr = self._primary
        hits, persisted, index = pr.hits, pr.persisted, pr.index
        due: list[int] = []
        for k in keys:
            s = index[k]
            hits[s] += 1
            if hits[s] >= threshold and not persisted[s]:
                persisted[s] = 1
                due.append(s)
        return due

    def uncopied_ready(self) -> list[int]:
        """READY slots whose block is not in the tiers yet, marked copied (the caller submits them)."""
        due = self._primary.dirty_ready()
        self.copied(due)
        return due
