"""Options that several ``kvtier`` subcommands share, declared once.

A subcommand adds a shared option through the ``add_*`` function here, so ``--config``, ``--json``,
``--progress``, ``--block-bytes``, ``--tokens-per-block`` and the fleet options keep one spelling, type
and default wherever they appear. Only the help text that says what
the command does with an option is given by the command (``--config``'s fallback differs, say).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from kvtier.cli import args as types
from kvtier.errors import ConfigError
from kvtier.extras import install_hint

__all__ = [
    "JSON_HELP",
    "TOKENS_PER_BLOCK",
    "add_block_bytes",
    "add_config",
    "add_fleet_group",
    "add_imbalance",
    "add_json",
    "add_progress",
    "add_tokens_per_block",
    "add_trace",
    "require",
]

#: Tokens per trace block unless ``--tokens-per-block`` says otherwise (the Mooncake traces' unit).
TOKENS_PER_BLOCK = 512
#: ``--json``'s help where the command prints tables otherwise.
JSON_HELP = "print one JSON document instead of tables"


def add_trace(parser: argparse.ArgumentParser, help: str) -> None:
    """The optional positional trace file (the commands fall back to the shipped trace)."""
    parser.add_argument("trace", nargs="?", help=help)


def add_config(parser: argparse.ArgumentParser, help: str) -> None:
    """``--config``/``-c``: a config file or JSON string; ``help`` says the command's fallback."""
    parser.add_argument("--config", "-c", help=help)


def add_json(parser: argparse.ArgumentParser, help: str = JSON_HELP) -> None:
    parser.add_argument("--json", action="store_true", help=help)


def add_progress(parser: argparse.ArgumentParser, help: str) -> None:
    """``--progress``/``--no-progress``; ``None`` (neither given) lets the command decide."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help=help)


def add_block_bytes(parser: argparse.ArgumentParser, help: str) -> None:
    """``--block-bytes``: a size string (``4096``, ``4KiB``) checked by :func:`kvtier.cli.args.size`."""
    parser.add_argument("--block-bytes", type=types.size, help=help)


def add_tokens_per_block(
    parser: argparse.ArgumentParser, help: str, *, flags: tuple[str, ...] = ("--tokens-per-block",)
) -> None:
    """Tokens per trace block (``args.<first flag>``): the unit a trace's block ids count in."""
    parser.add_argument(*flags, type=types.positive_int, default=TOKENS_PER_BLOCK, help=help)


def add_fleet_group(
    parser: argparse.ArgumentParser, title: str, *, instances: Callable[[str], int], help: str
) -> Any:
    """The fleet option group with ``--instances N`` (parsed by ``instances``); returns the group
    for the command's own fleet options, which :func:`add_imbalance` closes."""
    group = parser.add_argument_group(title)
    group.add_argument("--instances", type=instances, metavar="N", help=help)
    return group


def add_imbalance(group: Any) -> None:
    """``--imbalance``: the ``prefix`` router's load bound (:class:`kvtier.sim.fleet.FleetSpec`)."""
    group.add_argument(
        "--imbalance",
        type=float,
        default=0.25,
        help="prefix router's load bound: <= (1 + X) x the mean load (0.25)",
    )


def require(module: str, option: str) -> None:
    """Refuse ``option`` at once when ``module`` (an optional dependency it needs) is missing:
    a :class:`~kvtier.errors.ConfigError` naming the option and the extra that installs it, before
    the minutes of work whose result the option would need it for."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigError(option, f"needs {module}: {install_hint(module)}")
