"""Mooncake Store's return codes, sorted into what the ``mooncake`` tier does about each.

``MooncakeDistributedStore`` reports failures as negative integers (one per key for the batched
calls) instead of raising; the few exceptions its bindings can raise go through :data:`MOONCAKE_ERRORS`
like any backend's. :func:`kind_of` sorts a code into one of five kinds, so the tier's data path
reasons about kinds only:

``MISSING``      the key is not there (or not readable yet): a miss, never an error
``EXISTS``       a put found the key already stored: keys name content, so it counts as stored
``FULL``         no space (``NO_AVAILABLE_HANDLE``, a tenant quota): the store is dropped, stores pause
``UNAVAILABLE``  a transfer or RPC failed (a dead or stalled segment holder, an unreachable master):
                 the circuit breaker counts it
``REJECTED``     anything else (bad parameters, a lease still held): fails the request only

Values are those of Mooncake's ``ErrorCode`` (``mooncake-store/include/types.h``, v0.3.x).
"""

from __future__ import annotations

from typing import Final

from kvtier.errors import TierError, TierUnavailableError
from kvtier.tiers.remote.errors import ErrorMap, RemoteFullError, RemoteRejectedError

__all__ = [
    "EXISTS",
    "FULL",
    "MISSING",
    "MOONCAKE_ERRORS",
    "OBJECT_HAS_LEASE",
    "REJECTED",
    "UNAVAILABLE",
    "MooncakeCodeError",
    "MooncakeFullError",
    "MooncakeRejectedError",
    "MooncakeUnavailableError",
    "code_error",
    "kind_of",
]

MISSING: Final = "missing"
EXISTS: Final = "exists"
FULL: Final = "full"
UNAVAILABLE: Final = "unavailable"
REJECTED: Final = "rejected"

NO_AVAILABLE_HANDLE: Final = -200
INVALID_PARAMS: Final = -600
REPLICA_IS_NOT_READY: Final = -703
OBJECT_NOT_FOUND: Final = -704
OBJECT_ALREADY_EXISTS: Final = -705
OBJECT_HAS_LEASE: Final = -706
LEASE_EXPIRED: Final = -707
TRANSFER_FAIL: Final = -800
RPC_FAIL: Final = -900
TENANT_QUOTA_EXCEEDED: Final = -1700

_NAMES: Final = {
    -1: "INTERNAL_ERROR",
    NO_AVAILABLE_HANDLE: "NO_AVAILABLE_HANDLE",
    INVALID_PARAMS: "INVALID_PARAMS",
    REPLICA_IS_NOT_READY: "REPLICA_IS_NOT_READY",
    OBJECT_NOT_FOUND: "OBJECT_NOT_FOUND",
    OBJECT_ALREADY_EXISTS: "OBJECT_ALREADY_EXISTS",
    OBJECT_HAS_LEASE: "OBJECT_HAS_LEASE",
    LEASE_EXPIRED: "LEASE_EXPIRED",
    TRANSFER_FAIL: "TRANSFER_FAIL",
    RPC_FAIL: "RPC_FAIL",
    -901: "RPC_TIMEOUT",
    TENANT_QUOTA_EXCEEDED: "TENANT_QUOTA_EXCEEDED",
}

_KINDS: Final = {
    OBJECT_NOT_FOUND: MISSING,
    REPLICA_IS_NOT_READY: MISSING,  # another writer's put is still in flight
    LEASE_EXPIRED: MISSING,  # evicted while we read it: the bytes are not trustworthy, a miss
    OBJECT_ALREADY_EXISTS: EXISTS,
    NO_AVAILABLE_HANDLE: FULL,
    TENANT_QUOTA_EXCEEDED: FULL,
    -1: UNAVAILABLE,  # batch_is_exist's "error" answer
    TRANSFER_FAIL: UNAVAILABLE,
    RPC_FAIL: UNAVAILABLE,
    -901: UNAVAILABLE,
    -1010: UNAVAILABLE,  # UNAVAILABLE_IN_CURRENT_STATUS: a master failing over
}


def kind_of(code: int) -> str:
    """The kind of a negative Mooncake return code (see the module doc)."""
    return _KINDS.get(code, REJECTED)


def name_of(code: int) -> str:
    return _NAMES.get(code, f"code {code}")


class MooncakeUnavailableError(TierUnavailableError):
    """A Mooncake call answered a code meaning the store or the key is not reachable (``code``)."""

    code: int = 0


class MooncakeFullError(RemoteFullError):
    """A Mooncake call answered "no space" or a quota code (``code``)."""

    code: int = 0


class MooncakeRejectedError(RemoteRejectedError):
    """A Mooncake call answered any other failure code (``code``)."""

    code: int = 0


#: Every error :func:`code_error` makes; each carries the store's return ``code``. One class per
#: kind, each under the kvtier error its kind maps to (single inheritance: the tier's breaker and
#: drop logic catch the kvtier classes).
MooncakeCodeError = MooncakeUnavailableError | MooncakeFullError | MooncakeRejectedError


def code_error(code: int, what: str) -> MooncakeCodeError:
    """A kvtier error for ``code`` returned by ``what`` (a short description of the call)."""
    kind = kind_of(code)
    message = f"mooncake: {what} answered {name_of(code)} ({code})"
    err: MooncakeCodeError
    if kind in (UNAVAILABLE, MISSING):
        err = MooncakeUnavailableError(message)
    elif kind == FULL:
        err = MooncakeFullError(message)
    else:
        err = MooncakeRejectedError(message)
    err.code = code
    return err


#: Exceptions the bindings can raise (pybind11 turns C++ exceptions into ``RuntimeError``; a wrong
#: argument type is a ``TypeError``, a kvtier bug).
MOONCAKE_ERRORS = ErrorMap(
    "mooncake",
    [
        (RuntimeError, TierUnavailableError),
        (TypeError, TierError),
        (ValueError, TierError),
    ],
)
