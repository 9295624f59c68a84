"""The existence index of a shared remote tier: answers ``lookup`` from memory, never the network.

What a remote tier knows about a key is a *hint*: another instance may have written it, the server
may have evicted it. The index keeps three things, bounded:

* ``known``: keys seen to exist (this instance stored or loaded them, a listing or a check found
  them) -- ``HIT``. A key that turns out missing on load is moved to ``absent`` (a miss, no error).
* ``absent``: keys a check found missing, with an expiry ``negative_ttl`` s later -- ``MISS`` until
  then. After it, the key is checked again, so a block another instance writes becomes visible
  within ``negative_ttl`` (the negative-lookup policy that stays correct with several writers).
* ``pending``: keys queued for a batched existence check on a worker.

What an unknown key answers is the ``unknown`` policy:

* ``"check"`` (default): ``MISS`` now, and a check is queued; if the key exists, later lookups HIT
  (one recompute of a block another instance wrote, never a stalled request). Until the tier is
  :attr:`~ExistenceIndex.warm` (it has heard from the server once, or a listing finished), unknown
  keys answer ``RETRY`` until their check answers instead: a restarted instance finds what is
  already there without recomputing it;
* ``"wait"``: ``RETRY`` until the check has answered (the engine asks again next step);
* ``"miss"``: ``MISS``, no check (an instance then only sees what it stored itself, loaded, or
  what a listing found).

A listing or a check runs on a worker while jobs go on, so what it reports can be older than what
the tier learnt meanwhile (a load dropped the key as corrupt, the tier evicted it). *Found* keys
(:meth:`~ExistenceIndex.add_found`, :meth:`~ExistenceIndex.resolve`) therefore never override an
unexpired ``absent`` entry: the key stays MISS until ``negative_ttl`` passes and is checked again.
Only the tier's own stores and loads (:meth:`~ExistenceIndex.add`) do.

Not thread-safe on its own: the tier calls it under its lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kvtier.keys import BlockKey, LookupResult
from kvtier.tiers.base import RemovalLog

__all__ = ["ExistenceIndex"]


class ExistenceIndex:
    """Bounded positive/negative/pending sets of keys (see the module doc).

    Args:
        capacity: most keys remembered as known (oldest forgotten first: a forgotten key is checked
            again, never wrongly missed for long).
        negative_ttl: seconds a checked-missing key stays MISS.
        unknown: ``"check"``, ``"wait"`` or ``"miss"`` (see the module doc).
        removals: where a known key found gone is noted (the tier's log; a private one if ``None``).
            A key dropped only because ``capacity`` is full is not noted: it is still stored, and
            a later lookup finds it again.
    """

    POLICIES = ("check", "wait", "miss")

    def __init__(
        self,
        capacity: int = 1 << 20,
        negative_ttl: float = 2.0,
        unknown: str = "check",
        removals: RemovalLog | None = None,
    ) -> None:
        if unknown not in self.POLICIES:
            raise ValueError(f"unknown must be one of {self.POLICIES}, got {unknown!r}")
        self.capacity = capacity
        self.negative_ttl = negative_ttl
        self.unknown = unknown
        self.removals = removals if removals is not None else RemovalLog()
        self.known: OrderedDict[BlockKey, None] = OrderedDict()
        self._absent: OrderedDict[BlockKey, float] = OrderedDict()
        self._pending: set[BlockKey] = set()
        self._cold: set[BlockKey] = set()  # queued before the tier was warm: RETRY until checked
        self._queue: list[BlockKey] = []
        #: The tier has heard from the server (or finished a listing): see the module doc.
        self.warm = False

    def lookup(self, key: BlockKey, now: float) -> LookupResult:
        """HIT / MISS / RETRY; an unknown key may be queued for a check (:meth:`take_queue`)."""
        if key in self.known:
            return LookupResult.HIT
        expiry = self._absent.get(key)
        if expiry is not None:
            if now < expiry:
                return LookupResult.MISS
            del self._absent[key]
        if self.unknown == "miss":
            return LookupResult.MISS
        if key not in self._pending:
            self._pending.add(key)
            self._queue.append(key)
            if not self.warm:
                self._cold.add(key)
        if self.unknown == "wait" or key in self._cold:
            return LookupResult.RETRY
        return LookupResult.MISS

    def has_queue(self) -> bool:
        return bool(self._queue)

    def take_queue(self, limit: int) -> list[BlockKey]:
        """Up to ``limit`` queued keys for one check (they stay pending until :meth:`resolve`)."""
        out, self._queue = self._queue[:limit], self._queue[limit:]
        return out

    def resolve(self, keys: Iterable[BlockKey], exists: Iterable[bool], now: float) -> None:
        """Record a check's answers."""
        for key, present in zip(keys, exists, strict=True):
            self._pending.discard(key)
            self._cold.discard(key)
            if not present:
                self.forget(key, now)
            elif not self._missing(key, now):  # not forgotten while the check ran
                self.add(key)

    def abandon(self, keys: Iterable[BlockKey]) -> None:
        """A check failed: the keys are unknown again (a later lookup queues them again)."""
        for key in keys:
            self._pending.discard(key)
            self._cold.discard(key)

    def add(self, key: BlockKey) -> None:
        """``key`` exists (stored, loaded or found)."""
        self._absent.pop(key, None)
        self.known[key] = None
        self.known.move_to_end(key)
        while len(self.known) > self.capacity:
            self.known.popitem(last=False)

    def add_many(self, keys: Iterable[BlockKey]) -> None:
        """:meth:`add` of each key (a job's worth in one pass)."""
        absent, known = self._absent, self.known
        for key in keys:
            if absent:
                absent.pop(key, None)
            known[key] = None
            known.move_to_end(key)
        while len(known) > self.capacity:
            known.popitem(last=False)

    def add_found(self, keys: Iterable[BlockKey], now: float) -> list[BlockKey]:
        """A listing found ``keys``: :meth:`add` those not known missing since; returns them."""
        found = [key for key in keys if not self._missing(key, now)]
        self.add_many(found)
        return found

    def _missing(self, key: BlockKey, now: float) -> bool:
        expiry = self._absent.get(key)
        return expiry is not None and now < expiry

    def forget(self, key: BlockKey, now: float) -> None:
        """``key`` does not exist (evicted by the server, never written, corrupt and removed)."""
        if key in self.known:
            del self.known[key]
            self.removals.note((key,))
        self._absent[key] = now + self.negative_ttl
        self._absent.move_to_end(key)
        while len(self._absent) > self.capacity:
            self._absent.popitem(last=False)

    def clear_pending(self) -> None:
        """Drop every queued check (the backend is unreachable: lookups answer MISS meanwhile)."""
        self._pending.clear()
        self._cold.clear()
        self._queue.clear()
