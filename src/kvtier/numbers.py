"""The one check every number in a kvtier config passes: a real, finite number in its range.

Each built-in tier declares its numeric options in ``option_ranges`` (option -> :class:`Range`);
:func:`check_numbers` checks a config entry against that table before anything is built, and
constructors call :func:`check_number` for the same option with the same range, so a value is
refused with the same one-line message (naming the key) wherever it enters. NaN, infinities and
absurd magnitudes (``1e300`` seconds) are refused here rather than failing later in a socket
timeout or a ``struct`` pack.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtier.errors import ConfigError

__all__ = [
    "BANDWIDTH",
    "BYTES",
    "CONNECTIONS",
    "COUNT",
    "MAX_BYTES",
    "NONNEGATIVE",
    "NONNEG_SECONDS",
    "POSITIVE",
    "SECONDS",
    "TTL_SECONDS",
    "Range",
    "Ranges",
    "check_bandwidth",
    "check_number",
    "check_numbers",
    "range_of",
]

#: Largest byte size any option may name (1 EiB): beyond it a size is a typo, not a disk.
MAX_BYTES = 1 << 60


@dataclass(frozen=True, slots=True)
class Range:
    """Allowed values: ``low <= v <= high`` (``low < v`` with ``open_low``), integers only with
    ``integer``; ``size`` also accepts a size string such as ``"8GiB"`` (integers, bytes)."""

    low: float
    high: float
    integer: bool = False
    open_low: bool = False
    size: bool = False
    unit: str = ""

    def describe(self) -> str:
        kind = "a size in bytes" if self.size else "an integer" if self.integer else "a finite number"
        low = f"> {self.low:g}" if self.open_low else f">= {self.low:g}"
        unit = f" {self.unit}" if self.unit else ""
        return f"{kind}{unit} {low} and <= {self.high:g}"

    def contains(self, value: float) -> bool:
        above = value > self.low if self.open_low else value >= self.low
        return above and value <= self.high


#: Seconds of a timeout, interval or back-off: > 0, at most about 11 days.
SECONDS = Range(0, 1e6, open_low=True, unit="seconds")
#: Seconds that may be zero (a negative-cache TTL of 0 disables it).
NONNEG_SECONDS = Range(0, 1e6, unit="seconds")
#: Seconds an entry lives on a server (a Redis TTL): up to ten years.
TTL_SECONDS = Range(0, 3.2e8, open_low=True, unit="seconds")
#: Connections one server holds at once (each costs a thread).
CONNECTIONS = Range(1, 4096, integer=True)
#: A count of things (blocks per batch, index entries): at least 1.
COUNT = Range(1, 1 << 40, integer=True)
#: A byte size (``"8GiB"`` or an integer), up to :data:`MAX_BYTES`.
BYTES = Range(0, MAX_BYTES, integer=True, size=True)
#: A rate, price or per-token cost that must be > 0 (a cost model's or a planning menu's figures).
POSITIVE = Range(0, 1e15, open_low=True)
#: The same where 0 is meaningful (a price of a tier already paid for).
NONNEGATIVE = Range(0, 1e15)
#: Bytes per second of a link or a device: > 0, at most 1 PB/s.
BANDWIDTH = Range(0, 1e15, open_low=True, unit="bytes per second")


def check_bandwidth(key: str, value: Any) -> float:
    """A bandwidth option: bytes per second as a number, or a size string read as per second
    (``"2GB"``), in :data:`BANDWIDTH`; a :class:`ConfigError` naming ``key`` otherwise."""
    if isinstance(value, str):
        from kvtier.config import parse_size  # config imports this module

        value = parse_size(value, key)
    return float(check_number(key, value, BANDWIDTH))


def check_number(key: str, value: Any, rng: Range) -> float:
    """``value`` if it is a real number (not a bool) in ``rng``, else a :class:`ConfigError` naming
    ``key``. Integers come back as ``int`` (a float with an integral value too, for ``integer``
    ranges); sizes may be strings (``"8GiB"``)."""
    if rng.size and isinstance(value, str):
        from kvtier.config import parse_size  # config imports this module

        value = parse_size(value, key)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value):
        raise ConfigError(key, f"expected {rng.describe()}, got {value!r}")
    if rng.integer:
        if isinstance(value, float) and not value.is_integer():
            raise ConfigError(key, f"expected {rng.describe()}, got {value!r}")
        value = int(value)
    if not rng.contains(value):
        raise ConfigError(key, f"expected {rng.describe()}, got {value!r}")
    return value  # type: ignore[no-any-return]


#: Option -> its range, or -> the ranges of a nested mapping option (``backpressure``, ``serve``).
Ranges = Mapping[str, "Range | Mapping[str, Range]"]


def range_of(ranges: Ranges, name: str) -> Range:
    """The range of the plain numeric option ``name`` in ``ranges`` (not a nested mapping)."""
    rng = ranges[name]
    if not isinstance(rng, Range):
        raise TypeError(f"option {name!r} is a mapping of ranges, not a number")
    return rng


def check_numbers(options: Mapping[str, Any], ranges: Ranges, key_path: str = "") -> None:
    """:func:`check_number` for every option of ``ranges`` that ``options`` sets (``None`` means
    "not set": the option's own default applies), into nested mappings. The key in an error is
    ``key_path.option`` (``key_path.backpressure.alpha``)."""
    for name, rng in ranges.items():
        value = options.get(name)
        key = f"{key_path}.{name}" if key_path else name
        if value is None:
            continue
        if isinstance(rng, Range):
            check_number(key, value, rng)
        elif isinstance(value, Mapping):  # a non-mapping is the owner's type error to report
            check_numbers(value, rng, key)
