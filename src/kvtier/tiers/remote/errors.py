"""One map per backend from the client library's exceptions to kvtier's ``TierError`` tree.

A network tier calls its client on worker threads; whatever the client raises is translated here,
once, so the rest of the tier (and the circuit breaker) reasons about four kinds only::

    TierError                      a request failed; the chunk fails, nothing else changes
    ├── RemoteRejectedError        the server refused the request (auth, bad request, wrong type)
    ├── RemoteFullError            the server is out of space or throttling: stores pause
    └── TierUnavailableError       the server cannot be reached: the breaker counts it
        └── RemoteTimeoutError     ... because an operation ran past its deadline

An :class:`ErrorMap` is an ordered table ``client exception class -> kvtier class``; translation walks
the raised exception's MRO and takes the most specific entry, so a subclass the client adds later
still lands on its parent's entry. A backend whose errors carry a code (S3's ``ClientError``) adds a
``refine`` function that picks the class from the instance. Each backend module has a test that
every exception class its client library defines is covered by an entry more specific than
``Exception`` (:meth:`ErrorMap.unmapped`), so no bare client exception reaches the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import ModuleType

from kvtier.errors import TierError, TierUnavailableError

__all__ = [
    "ErrorMap",
    "RemoteFullError",
    "RemoteRejectedError",
    "RemoteTimeoutError",
    "exception_classes",
]


class RemoteRejectedError(TierError):
    """The server refused the request (bad credentials, malformed request, wrong value type)."""


class RemoteFullError(TierError):
    """The server is out of memory/space or asks clients to slow down; stores are paused."""


class RemoteTimeoutError(TierUnavailableError):
    """An operation ran past its deadline (the server is stalled, overloaded or gone)."""


Refine = Callable[[BaseException, type[TierError]], type[TierError]]


class ErrorMap:
    """Ordered ``exception class -> TierError subclass`` table for one backend.

    Args:
        backend: the backend's name, used in messages (``"redis"``, ``"s3"``).
        entries: ``(client exception class, kvtier class)`` pairs; order does not matter (the most
            specific class in the raised exception's MRO wins).
        refine: optional ``(exc, mapped class) -> class`` for errors whose kind is in the instance
            (an HTTP status, an error code).
    """

    def __init__(
        self,
        backend: str,
        entries: Iterable[tuple[type[BaseException], type[TierError]]],
        refine: Refine | None = None,
    ) -> None:
        self.backend = backend
        self._table: dict[type[BaseException], type[TierError]] = dict(entries)
        # Builtins every client can leak (sockets, timeouts) map the same for every backend.
        self._table.setdefault(TimeoutError, RemoteTimeoutError)
        self._table.setdefault(OSError, TierUnavailableError)
        self._refine = refine

    def kind_of(self, cls: type[BaseException]) -> type[TierError] | None:
        """The kvtier class for exceptions of ``cls`` (``None`` if nothing more specific than
        ``Exception`` covers it)."""
        for base in cls.__mro__:
            if base in (Exception, BaseException, object):
                return None
            if base in self._table:
                return self._table[base]
        return None

    def translate(self, exc: BaseException) -> TierError:
        """``exc`` as a kvtier error, its cause kept (``__cause__``); kvtier errors pass through."""
        if isinstance(exc, TierError):
            return exc
        cls = self.kind_of(type(exc)) or TierError
        if self._refine is not None:
            cls = self._refine(exc, cls)
        err = cls(f"{self.backend}: {type(exc).__name__}: {_short(exc)}")
        err.__cause__ = exc
        return err

    def unmapped(self, classes: Iterable[type[BaseException]]) -> list[type[BaseException]]:
        """The classes no entry covers (the coverage test asserts this is empty)."""
        return [c for c in classes if self.kind_of(c) is None]


def exception_classes(*modules: ModuleType) -> list[type[BaseException]]:
    """Every exception class defined in ``modules`` (for the coverage test)."""
    out: list[type[BaseException]] = []
    for mod in modules:
        for value in vars(mod).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__.startswith(mod.__name__.split(".")[0])
                and value not in out
            ):
                out.append(value)
    return out


def _short(exc: BaseException) -> str:
    """The first line of the message, bounded: enough to act on, never a payload dump."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:200]
