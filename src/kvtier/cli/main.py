"""``kvtier``: the command-line entry point.

Each subcommand lives in its own module ``kvtier.cli.<name>`` exposing ``HELP`` (its line in
``kvtier --help``), ``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args) -> int``;
:data:`COMMANDS` lists them in help order. Command modules are imported when ``main`` runs (never
when :mod:`kvtier` is imported) and must keep their top-level imports light: heavy dependencies are
imported inside ``run``.

Exit codes (all commands): 0 success; 1 the command ran and found a problem (e.g. a failed round
trip); 2 bad input (config, arguments), printed as one line ``ErrorType: message``; 130 interrupted.
Output closed early by the reader (``kvtier replay | head -1``) is success: exit 0, nothing on stderr.
Output goes through :mod:`kvtier.cli.output` (plain text without ``rich``); option values use the
types in :mod:`kvtier.cli.args` (size strings, ports, durations). ``python -m kvtier`` runs ``main``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from kvtier import __version__
from kvtier.errors import KvtierError

__all__ = ["COMMANDS", "build_parser", "error_line", "main", "print_table"]

#: Subcommand module names under ``kvtier.cli`` (a module not installed yet is left out of the menu).
COMMANDS = ["plugins", "check", "replay", "plan", "bench", "serve"]


def _load(name: str) -> ModuleType | None:
    module = f"kvtier.cli.{name}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None  # listed but not shipped in this build
        raise


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every available subcommand registered)."""
    from kvtier.cli.args import OneLineParser

    parser = OneLineParser(
        prog="kvtier",
        description="Tiered, pluggable KV-cache offloading for LLM inference. Commands: "
        f"{', '.join(COMMANDS)} (kvtier COMMAND --help for each).",
    )
    parser.add_argument("--version", action="version", version=f"kvtier {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log INFO lines (e.g. which plug-ins were loaded)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = _load(name)
        if module is None:
            continue
        p = sub.add_parser(name, help=module.HELP, description=module.DESCRIPTION)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
        _show_defaults(p)
    return parser


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Append ``(default: X)`` to every option's help that has a default and does not say it
    already, in ``parser`` and its subcommands, so ``--help`` never hides what a flag does when
    it is left out."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _show_defaults(child)
            continue
        default = action.default
        if action.help in (None, argparse.SUPPRESS) or default in (None, False, argparse.SUPPRESS):
            continue
        if "default" in str(action.help).lower() or "%(default)" in str(action.help):
            continue
        shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else default
        action.help = f"{action.help} (default: {str(shown).replace('%', '%%')})"


def error_line(exc: BaseException) -> str:
    """``ErrorType: message`` on one line (the CLI's error format)."""
    text = " ".join(str(exc).split()) or repr(exc)
    return f"{type(exc).__name__}: {text}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvtier`` command line; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        code = run(args)
        sys.stdout.flush()  # inside the try: a reader gone before the last flush is the same case
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `kvtier ... | head`: the reader took what it wanted; that is success, not an error. Point
        # stdout at /dev/null so the interpreter's own flush at exit cannot fail and print either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KvtierError as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    except Exception as exc:
        # A bug or an environment problem: still one line (the user can rerun under python -X dev
        # or call the library for the traceback), and a distinct exit code from bad input.
        print(error_line(exc), file=sys.stderr)
        return 1
    return int(code or 0)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a table to stdout: with rich when it is installed, aligned plain text otherwise."""
    from kvtier.cli.output import TextTable, emit

    table = TextTable(title, columns)
    for row in rows:
        table.add_row(*row)
    emit([table])


if __name__ == "__main__":  # pragma: no cover - python -m kvtier.cli.main
    sys.exit(main())
