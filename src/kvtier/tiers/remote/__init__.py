"""The remote-tier base every network tier builds on (docs/remote.md).

:mod:`~kvtier.tiers.remote.base` (:class:`RemoteTier`: a client per worker, routes, retries),
:mod:`~kvtier.tiers.remote.breaker` (one circuit breaker per route),
:mod:`~kvtier.tiers.remote.errors` (a backend's exceptions mapped onto kvtier's),
:mod:`~kvtier.tiers.remote.index` (the existence index) and :mod:`~kvtier.tiers.remote.sockio`
(socket I/O with kernel timeouts, scatter-gather sends, the idle-connection check).
"""

from kvtier.tiers.remote.base import RemoteTier, positive_number
from kvtier.tiers.remote.breaker import CircuitBreaker
from kvtier.tiers.remote.errors import (
    ErrorMap,
    RemoteFullError,
    RemoteRejectedError,
    RemoteTimeoutError,
    exception_classes,
)
from kvtier.tiers.remote.index import ExistenceIndex

# The public home of the base is this package (``kvtier.tiers.remote.RemoteTier``, docs/remote.md).
RemoteTier.__module__ = __name__

__all__ = [
    "CircuitBreaker",
    "ErrorMap",
    "ExistenceIndex",
    "RemoteFullError",
    "RemoteRejectedError",
    "RemoteTier",
    "RemoteTimeoutError",
    "exception_classes",
    "positive_number",
]
