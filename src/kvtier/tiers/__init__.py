"""Secondary tiers: the :class:`SecondaryTier` contract and the built-in implementations."""

from kvtier.tiers.base import SecondaryTier, TierContext, TierStats

__all__ = ["SecondaryTier", "TierContext", "TierStats"]
