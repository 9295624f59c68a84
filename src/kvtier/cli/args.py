"""``argparse`` value types shared by the subcommands: sizes, ports, durations, counts.

Each is a callable that ``argparse`` calls with the option's text; a bad value raises
``argparse.ArgumentTypeError``, which :class:`OneLineParser` reports as one line
``ConfigError: --x: ...`` with exit code 2 (bad input), the CLI's convention. Sizes accept exactly
what config files accept (:func:`kvtier.config.parse_size`: ``4096``, ``4KiB``, ``1.5MB``).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import NoReturn

from kvtier.config import parse_size
from kvtier.errors import ConfigError

__all__ = [
    "OneLineParser",
    "count",
    "duration",
    "port",
    "positive",
    "positive_int",
    "seconds_or_zero",
    "size",
]

_ARG_ERROR = re.compile(r"argument (?P<opt>[^:/\s]+)(?:/\S+)?: (?P<msg>.*)", re.S)


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr and exit code 2.

    ``argument --x: ...`` (a bad option value) prints as ``ConfigError: --x: ...``, like every other
    bad-input error of the CLI; anything else (unknown option, missing argument) as ``UsageError:``.
    Subparsers inherit the class.
    """

    def error(self, message: str) -> NoReturn:
        m = _ARG_ERROR.match(message)
        if m:
            line = f"ConfigError: {m['opt']}: {m['msg']}"
        else:
            line = f"UsageError: {message} (see {self.prog} --help)"
        print(" ".join(line.split()), file=sys.stderr)
        sys.exit(2)


def size(text: str) -> int:
    """Bytes from ``text`` (``4096``, ``4KiB``, ``2MB``); at least 1."""
    try:
        value = parse_size(text, "size")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"expected a size such as 4096, 4KiB or 2MB, got {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port number 0..65535 (0 lets the system pick a free port)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {value}")
    return value


def duration(text: str) -> float:
    """Seconds, a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds such as 30 or 0.5, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _float_in(text: str, low: float, high: float, *, open_low: bool, example: str, what: str) -> float:
    """``text`` as a finite float in ``[low, high]`` (``(low, high]`` with ``open_low``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what} such as {example}, got {text!r}") from None
    above = value > low if open_low else value >= low
    if not (math.isfinite(value) and above and value <= high):
        bound = f"> {low:g}" if open_low else f">= {low:g}"
        raise argparse.ArgumentTypeError(f"must be a finite {what} {bound} and <= {high:g}, got {text!r}")
    return value


def seconds_or_zero(text: str) -> float:
    """Seconds, a finite number in 0..3600."""
    return _float_in(text, 0, 3600, open_low=False, example="15 or 0", what="number of seconds")


def positive(text: str) -> float:
    """A finite number > 0 (a price, a rate): ``nan``, ``inf`` and negatives are refused."""
    return _float_in(text, 0, 1e15, open_low=True, example="2.5", what="number")


def count(text: str) -> int:
    """An integer >= 0."""
    return positive_int(text, low=0)


def positive_int(text: str, low: int = 1) -> int:
    """An integer >= ``low`` (1)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value
