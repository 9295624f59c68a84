"""The ``mooncake`` tier (docs/remote.md): :mod:`~kvtier.tiers.mooncake.tier` (:class:`MooncakeTier`),
:mod:`~kvtier.tiers.mooncake.options` (:class:`MooncakeOptions`, its config keys) and
:mod:`~kvtier.tiers.mooncake.codes` (the store's return codes mapped onto kvtier's errors)."""

from kvtier.tiers.mooncake.options import MooncakeOptions
from kvtier.tiers.mooncake.tier import HEADER_ROW, MooncakeTier

# The public home of the class is this package (the built-in name's and entry point's target,
# ``kvtier.tiers.mooncake:MooncakeTier``); reprs, pickles and ``kvtier plugins`` name it so.
MooncakeTier.__module__ = __name__

__all__ = ["HEADER_ROW", "MooncakeOptions", "MooncakeTier"]
