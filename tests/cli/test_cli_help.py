"""``kvtier --help`` names every command, and every option with a default shows it (issue 28:
the summary named three of six commands and several options hid their defaults)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier.cli.main import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_top_level_help_lists_every_command() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-m", "kvtier", "--help"], capture_output=True, text=True,
                         env=env, timeout=60, check=True).stdout  # fmt: skip
    usage, _, listing = out.partition("positional arguments:")
    for name in COMMANDS:
        assert name in usage, f"the description does not name {name!r}"
        assert f"\n    {name} " in listing or f"\n    {name}\n" in listing


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_with_a_default_shows_it(command: str) -> None:
    parser = subparsers(build_parser())[command]
    nested = [parser, *subparsers(parser).values()]
    for p in nested:
        for action in p._actions:
            if action.help == argparse.SUPPRESS or action.default in (None, False, argparse.SUPPRESS):
                continue
            assert "default" in str(action.help).lower(), f"kvtier {command} {action.option_strings}"
        p.format_help()  # every help string still formats
