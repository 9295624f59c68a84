"""The eviction-policy contract.

A policy only *orders* keys and picks victims; it owns no bytes, slots or pins (mechanism apart from
policy). The primary tier (and any tier with a capacity, such as ``fs``) owns residency and tells the
policy what happened; when it needs room it asks :meth:`CachePolicy.evict` for victims, passing the
keys it cannot give up (pinned, being written) as ``protected``.

Calls are made under the owner's lock: implementations need not be thread-safe, must not block, and
should make ``touch``/``insert``/``remove`` O(1) (they sit on the lookup hot path).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator
from typing import ClassVar

from kvtier.keys import BlockInfo, BlockKey

__all__ = ["CachePolicy"]


class CachePolicy(ABC):
    """Orders resident keys and chooses eviction victims.

    The owner guarantees:
        * ``insert(k)`` is only called for a key not resident, and only while ``len(self) <
          capacity`` (it calls :meth:`evict` first when full);
        * ``touch(k)`` is only called for a resident key;
        * ``remove(k)`` may be called for any key (absent keys are ignored);
        * keys returned by :meth:`evict` are dropped by the owner at once.

    The implementer must:
        * keep ``len(self)`` equal to the number of resident keys (ghost/history entries a policy keeps
          for itself, as ARC and S3-FIFO do, are not resident and are not counted);
        * make :meth:`evict` atomic: exactly ``n`` victims, none of them in ``protected``, or an empty
          list and no change at all.

    Construction: ``Policy(capacity, **options)``; ``capacity`` is in blocks. Options come from config
    and unknown ones must raise ``TypeError`` (the registry turns that into a config error).
    """

    #: Registry name of the built-in (informational; the registry is the source of truth).
    name: ClassVar[str] = ""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"policy capacity must be >= 1 block, got {capacity}")
        self._capacity = int(capacity)

    @property
    def capacity(self) -> int:
        """Maximum number of resident keys, in blocks."""
        return self._capacity

    @abstractmethod
    def __len__(self) -> int:
        """Number of resident keys."""

    @abstractmethod
    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is resident (ghost entries are not)."""

    @abstractmethod
    def __iter__(self) -> Iterator[BlockKey]:
        """Resident keys, in no guaranteed order."""

    @abstractmethod
    def insert(self, key: BlockKey, info: BlockInfo | None = None) -> None:
        """Record that ``key`` became resident. ``info`` is optional prefix/tenant knowledge."""

    @abstractmethod
    def touch(self, key: BlockKey) -> None:
        """Record a hit on resident ``key``."""

    @abstractmethod
    def remove(self, key: BlockKey) -> None:
        """Forget ``key`` (invalidated or dropped by the owner). Absent keys are ignored."""

    @abstractmethod
    def evict(
        self,
        n: int = 1,
        protected: Collection[BlockKey] = (),
        incoming: BlockKey | None = None,
    ) -> list[BlockKey]:
        """Choose and forget exactly ``n`` resident keys not in ``protected``.

        ``incoming`` is the key about to be inserted when eviction is caused by a miss; policies
        whose decision depends on it (ARC looks it up in its ghost lists) use it, others ignore it.

        Returns ``n`` victims, already removed from the policy, or ``[]`` with the policy unchanged
        when ``n`` unprotected victims do not exist. Must not block.
        """

    # Batch helpers: the engine calls these on whole requests. Subclasses may override with faster
    # loops; the defaults keep the per-key semantics exactly.
    def touch_many(self, keys: Iterable[BlockKey]) -> None:
        """``touch`` each key in order."""
        for key in keys:
            self.touch(key)

    def insert_many(self, keys: Iterable[BlockKey], infos: Iterable[BlockInfo | None] | None = None) -> None:
        """``insert`` each key in order (same preconditions as :meth:`insert`, per key)."""
        if infos is None:
            for key in keys:
                self.insert(key)
        else:
            for key, info in zip(keys, infos, strict=True):
                self.insert(key, info)
