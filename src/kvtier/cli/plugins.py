"""``kvtier plugins``: every tier, policy and spec kvtier can load by name, and where each comes from."""

from __future__ import annotations

import argparse
import json

from kvtier.cli import options

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]


#: The command's line in ``kvtier --help``; :data:`DESCRIPTION` opens ``kvtier plugins --help``.
HELP = "list tiers, policies and specs (built-in, registered, entry point)"
DESCRIPTION = (
    "List every plug-in kvtier resolves by name: kind, name, source (built-in, registered, entry "
    "point) and import target module:Class. Nothing is imported. Out-of-tree code named by "
    "module_path in a config is not listed: it is loaded only when a config asks for it."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``plugins`` options to its parser (built by :func:`kvtier.cli.main.build_parser`)."""
    p.add_argument("--kind", choices=["tier", "policy", "spec"], help="only this kind")
    options.add_json(p, "print a JSON list instead of a table")


def run(args: argparse.Namespace) -> int:
    from kvtier.cli.main import print_table
    from kvtier.plugins import list_plugins

    rows = list_plugins(args.kind)
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
        return 0
    print_table(
        "kvtier plug-ins",
        ["kind", "name", "source", "target"],
        [(r.kind, r.name, r.source, r.target) for r in rows],
    )
    return 0
