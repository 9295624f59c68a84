"""The default offloading spec: everything comes from config, through the plug-in registry.

``spec_name: "tiering"`` (or vLLM's spelling ``"TieringOffloadingSpec"``): the primary tier's policy is
``eviction_policy`` (+ ``cache_policy_module_path``, ``policy_options``) and the secondary tiers are
the ``secondary_tiers`` entries, in order, each resolved by ``type`` (+ ``module_path``).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from kvtier.errors import MisuseError
from kvtier.plugins import check_tier, create_policy
from kvtier.specs.base import OffloadingSpec

if TYPE_CHECKING:
    from kvtier.policies.base import CachePolicy
    from kvtier.tiers.base import SecondaryTier, TierContext

__all__ = ["TieringSpec"]


class TieringSpec(OffloadingSpec):
    """Builds the policy and the tiers exactly as the config lists them."""

    def create_policy(self, capacity: int) -> CachePolicy:
        return create_policy(self.config, capacity)

    def create_tiers(self, primary_kv_view: memoryview, contexts: list[TierContext]) -> list[SecondaryTier]:
        tier_configs = self.config.secondary_tiers
        if len(contexts) != len(tier_configs):
            raise MisuseError(
                f"TieringSpec.create_tiers: {len(contexts)} contexts for {len(tier_configs)} configured tiers"
            )
        # Every entry is checked before any is built: a bad later tier leaves no directory,
        # thread or connection of an earlier one behind.
        checked = [
            check_tier(tc, ctx, self.config.plugins) for tc, ctx in zip(tier_configs, contexts, strict=True)
        ]
        built: list[SecondaryTier] = []
        try:
            for entry in checked:
                built.append(entry.build(primary_kv_view))
        except BaseException:
            # Tiers may own threads and files: do not leak the ones built before the failing entry.
            for tier in reversed(built):
                # The original error is the one to report; a failing shutdown must not mask it.
                with contextlib.suppress(Exception):
                    tier.shutdown()
            raise
        return built
