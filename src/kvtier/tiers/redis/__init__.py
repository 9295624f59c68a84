"""The ``redis`` tier (docs/remote.md): :mod:`~kvtier.tiers.redis.tier` (:class:`RedisTier`),
:mod:`~kvtier.tiers.redis.options` (:class:`RedisOptions`, its config keys) and
:mod:`~kvtier.tiers.redis.wire` (its own RESP reader and vectored sends for block payloads)."""

from kvtier.tiers.redis.options import RedisOptions
from kvtier.tiers.redis.tier import REDIS_ERRORS, RedisTier

# The public home of the class is this package (the built-in name's and entry point's target,
# ``kvtier.tiers.redis:RedisTier``); reprs, pickles and ``kvtier plugins`` name it so.
RedisTier.__module__ = __name__

__all__ = ["REDIS_ERRORS", "RedisOptions", "RedisTier"]
