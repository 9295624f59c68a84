"""The offloading-spec contract: how a whole stack is assembled from a config.

A spec decides how many primary slots there are, which eviction policy orders them and which
secondary tiers sit behind them. The default (``tiering``) reads all three from config through the
plug-in registry; a third party replaces the assembly as a whole with ``spec_name`` +
``spec_module_path`` (e.g. a stack that picks tiers from the host's hardware).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtier.config import KvtierConfig
    from kvtier.policies.base import CachePolicy
    from kvtier.tiers.base import SecondaryTier, TierContext

__all__ = ["OffloadingSpec"]


class OffloadingSpec(ABC):
    """Assembles a primary tier's policy and the ordered secondary tiers.

    The engine guarantees it calls :meth:`create_policy` once and :meth:`create_tiers` once per
    engine, from one thread. Construction: ``Spec(config)``; a spec must not do I/O in ``__init__``.
    """

    def __init__(self, config: KvtierConfig) -> None:
        self.config = config

    @property
    def num_primary_slots(self) -> int:
        """Primary-tier slots (default: as many rows as ``cpu_bytes_to_use`` holds)."""
        return self.config.num_primary_slots

    @abstractmethod
    def create_policy(self, capacity: int) -> CachePolicy:
        """The eviction policy of the primary tier, for ``capacity`` blocks."""

    @abstractmethod
    def create_tiers(self, primary_kv_view: memoryview, contexts: list[TierContext]) -> list[SecondaryTier]:
        """The secondary tiers, fastest first; ``contexts[i]`` belongs to the i-th tier built.

        ``contexts`` has one entry per ``config.secondary_tiers`` entry; a spec that builds tiers of
        its own derives further contexts with :func:`dataclasses.replace`.
        """
