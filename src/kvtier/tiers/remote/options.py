"""The options of the network tiers, declared once.

:class:`RemoteOptions` holds what every network tier takes (threads, deadlines, breaker,
existence index, back-pressure); each tier subclasses it with its own keys and, where its
defaults differ, re-declares a field with another default. A tier's constructor takes the config
entry as keyword arguments and hands them to :meth:`RemoteOptions.from_config`, which

* maps a renamed key (``renamed``: old -> new) onto its new name with a one-line deprecation
  message (logged once per process and key), refusing both names at once;
* refuses a key the tier does not take (``ConfigError`` naming it, with the closest valid key);
* checks every number against ``ranges`` (:func:`kvtier.numbers.check_numbers`: finite, in range,
  the key in the message) and then the other values in :meth:`RemoteOptions.check`.

The same class gives the tier its ``option_ranges`` (what the factory checks before building) and
its constructor's signature (:meth:`RemoteOptions.signature`), so ``kvtier check``, the plug-in
factory and the vLLM adapter see the keys as before.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

from kvtier.errors import ConfigError
from kvtier.numbers import NONNEG_SECONDS, SECONDS, Range, Ranges, check_numbers
from kvtier.tiers.async_tier import AsyncTier
from kvtier.tiers.base import TierContext
from kvtier.tiers.remote.index import ExistenceIndex

__all__ = ["OP_TIMEOUT", "RemoteOptions", "check_choice", "check_flag", "check_text"]

log = logging.getLogger("kvtier.tiers.remote")

#: A request's own deadline: long enough for a cold gateway, short enough for a cache.
OP_TIMEOUT = Range(0, 60, open_low=True, unit="seconds")

# (class, old key) pairs whose deprecation was already logged.
_WARNED: set[tuple[str, str]] = set()


def check_choice(key: str, value: object, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else a ``ConfigError`` naming ``key``."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(key, f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def check_flag(key: str, value: object) -> bool:
    """``value`` if it is a bool (``"yes"`` or ``1`` are typos, not true)."""
    if not isinstance(value, bool):
        raise ConfigError(key, f"expected true or false, got {value!r}")
    return value


def check_text(key: str, value: object, example: str) -> str:
    """``value`` if it is a non-empty string, else a ``ConfigError`` showing ``example``."""
    if not isinstance(value, str) or not value:
        raise ConfigError(key, f'expected a non-empty string such as "{example}", got {value!r}')
    return value


@dataclass(frozen=True, kw_only=True)
class RemoteOptions:
    """Config keys common to every network tier (:class:`~kvtier.tiers.remote.RemoteTier`).

    Attributes:
        threads: worker threads (each holds its own client). batch_blocks: blocks per chunk.
        op_timeout: seconds, the deadline of one request (connect and read), <= 60.
        breaker_failures: failed operations in a row that open a route's breaker.
        breaker_reset: seconds a breaker stays open before a trial.
        negative_ttl: seconds a key checked missing stays MISS before it is checked again.
        unknown_keys: what a key the index does not know answers: ``"check"`` (MISS now, checked
            on the server in the background), ``"wait"`` (RETRY until checked) or ``"miss"``.
        full_backoff: seconds stores pause after a "server full" / "slow down" answer.
        backpressure: latency marks of the store gate (:class:`~kvtier.tiers.backpressure.GateConfig`).
        index_capacity: most keys the existence index remembers.
        log_interval: seconds between two log lines of the same kind.
    """

    threads: int = 4
    batch_blocks: int = 8
    op_timeout: float = 1.0
    breaker_failures: int = 3
    breaker_reset: float = 1.0
    negative_ttl: float = 2.0
    unknown_keys: str = "check"
    full_backoff: float = 1.0
    backpressure: Mapping[str, Any] | None = None
    index_capacity: int = 1 << 20
    log_interval: float = 10.0

    #: Numeric options -> their ranges (nested mappings for ``backpressure``).
    ranges: ClassVar[Ranges] = {
        **AsyncTier.option_ranges,
        "op_timeout": OP_TIMEOUT,
        "breaker_failures": Range(1, 1 << 20, integer=True),
        "breaker_reset": SECONDS,
        "negative_ttl": NONNEG_SECONDS,
        "full_backoff": SECONDS,
        "index_capacity": Range(1, 1 << 32, integer=True),
    }
    #: Old key -> its current name: still accepted, with a one-line deprecation message.
    renamed: ClassVar[Mapping[str, str]] = {}

    def __post_init__(self) -> None:
        # Every number first (finite, in range), then the rest; nothing is built yet.
        check_numbers({f.name: getattr(self, f.name) for f in fields(self)}, self.ranges)
        self.check()

    def check(self) -> None:
        """The non-numeric checks (``ConfigError`` naming the key); subclasses extend it."""
        check_choice("unknown_keys", self.unknown_keys, ExistenceIndex.POLICIES)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, owner: str = "") -> Self:
        """The options of one config entry (its keys besides ``type``/``module_path``/``name``).
        ``owner`` names the tier class in deprecation messages."""
        names = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in config.items():
            new = cls.renamed.get(key)
            if new is not None:
                if new in config:
                    raise ConfigError(key, f"is the old name of {new}; set only {new}")
                if (owner, key) not in _WARNED:
                    _WARNED.add((owner, key))
                    log.warning("%s: option %r is deprecated, use %r", owner or cls.__name__, key, new)
                if new in cls.ranges:  # a bad number is named by the key the user wrote
                    check_numbers({key: value}, {key: cls.ranges[new]})
                key = new
            if key not in names:
                close = difflib.get_close_matches(key, sorted(names), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(key, f"unexpected option{hint}; it accepts: {', '.join(sorted(names))}")
            values[key] = value
        return cls(**values)

    @classmethod
    def option_ranges(cls) -> Ranges:
        """``ranges`` with every renamed key under its old name too (the factory checks numbers
        before the options are built, by the names the config uses)."""
        old = {o: cls.ranges[n] for o, n in cls.renamed.items() if n in cls.ranges}
        return {**cls.ranges, **old}

    @classmethod
    def signature(cls) -> inspect.Signature:
        """The constructor signature of a tier taking these options: ``primary_kv_view`` and
        ``context``, then every option with its default (renamed keys last, default ``None``)."""
        kw = inspect.Parameter.KEYWORD_ONLY
        params = [
            inspect.Parameter("primary_kv_view", kw, annotation=memoryview),
            inspect.Parameter("context", kw, annotation=TierContext),
        ]
        for f in fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else None
            params.append(inspect.Parameter(f.name, kw, default=default))
        params += [inspect.Parameter(old, kw, default=None) for old in cls.renamed]
        return inspect.Signature(params, return_annotation=None)
