"""Peer-to-peer block sharing: instances serve primary-tier blocks to each other (docs/p2p.md).

:mod:`~kvtier.tiers.p2p.tier` (:class:`P2PTier`, the client side as a secondary tier),
:mod:`~kvtier.tiers.p2p.options` (:class:`P2POptions`, its config keys),
:mod:`~kvtier.tiers.p2p.protocol` (frames, authentication), :mod:`~kvtier.tiers.p2p.server` (the
block server), :mod:`~kvtier.tiers.p2p.client` (one peer connection),
:mod:`~kvtier.tiers.p2p.directory` (the Redis peer directory) and :mod:`~kvtier.tiers.p2p.service`
(server plus directory publisher, as ``kvtier serve`` and the engine start them).
"""

from kvtier.tiers.p2p.options import P2POptions
from kvtier.tiers.p2p.tier import P2P_ERRORS, P2PTier

# The public home of the class is this package (the built-in name's and entry point's target,
# ``kvtier.tiers.p2p:P2PTier``); reprs, pickles and ``kvtier plugins`` name it so.
P2PTier.__module__ = __name__

__all__ = ["P2P_ERRORS", "P2POptions", "P2PTier"]
