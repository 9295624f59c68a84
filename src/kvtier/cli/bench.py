"""``kvtier bench``: each tier's throughput next to its physical reference (memcpy, raw file I/O).

Without ``--config`` it measures the default stack (RAM primary tier + ``fs`` tier in a temporary
directory). ``--json`` prints one object whose ``tiers`` list feeds ``cost_model.bench_file``.
Exit codes: 0 success; 1 a tier returned wrong bytes; 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvtier.cli import args as types
from kvtier.cli import options

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "bench_tables", "run"]


#: The command's line in ``kvtier --help``; :data:`DESCRIPTION` opens ``kvtier bench --help``.
HELP = "throughput of each tier next to memcpy / raw file I/O"
DESCRIPTION = "Measure the primary tier and every configured tier against their physical references."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to its parser (built by :func:`kvtier.cli.main.build_parser`)."""
    options.add_config(p, "config file or JSON string; default: RAM + temporary fs tier")
    p.add_argument("--blocks", type=types.positive_int, default=256, help="blocks per batch (default 256)")
    options.add_block_bytes(p, "bytes per block, e.g. 65536 or 64KiB (default: the config's block_bytes)")
    p.add_argument(
        "--repeats",
        type=types.positive_int,
        default=3,
        help="best of N (default 3; use 5 or more for figures you quote)",
    )
    options.add_json(p, "print one JSON object")


def _rate(bps: float) -> str:
    return f"{bps / 1e9:.2f} GB/s" if bps >= 1e8 else f"{bps / 1e6:.1f} MB/s"


def run(args: argparse.Namespace) -> int:
    """Run ``kvtier bench``; returns the exit code."""
    from kvtier.config.layers import CONFIG_ENV, resolve_config
    from kvtier.sim.defaults import default_config
    from kvtier.sim.tierbench import run_bench

    with contextlib.ExitStack() as stack:
        fallback = None
        if not (args.config or os.environ.get(CONFIG_ENV, "").strip()):
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="kvtier-bench-"))
            fallback = default_config(Path(tmp) / "fs0", block_bytes=args.block_bytes or 256 * 1024)
        config = resolve_config(args.config or None, fallback=fallback).config
        if args.block_bytes is not None:
            config = dataclasses.replace(config, block_bytes=args.block_bytes)
        report = run_bench(config, blocks=args.blocks, repeats=args.repeats)
    bad = [t["name"] for t in report["tiers"] if not t.get("verified", True)]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        from kvtier.cli.output import emit

        emit(bench_tables(report))
    if bad:
        print(f"VerifyError: tier(s) {', '.join(bad)} returned wrong bytes", file=sys.stderr)
        return 1
    return 0


def bench_tables(report: dict[str, Any]) -> list[Any]:
    """The ``kvtier bench`` table: each tier's rates beside its reference, and the ratios."""
    from kvtier.cli.output import TextTable

    cols = ["tier", "medium", "store", "load", "load latency", "reference", "ref store", "ref load",
            "store ratio", "load ratio"]  # fmt: skip
    table = TextTable(
        f"kvtier bench — {report['blocks']} blocks of {report['block_bytes']:,} bytes, best of "
        f"{report.get('repeats', '?')}",
        cols,
        right=frozenset(cols) - {"tier", "medium", "reference"},
    )
    for t in report["tiers"]:
        ref = t.get("reference") or {}
        r = t.get("ratios") or {}
        table.add_row(
            t["name"],
            t["medium"],
            _rate(t["store_bytes_per_s"]),
            _rate(t["load_bytes_per_s"]),
            f"{t['load_latency_s'] * 1e6:.0f} us",
            ref.get("kind", "-"),
            _rate(ref["store_bytes_per_s"]) if ref else "-",
            _rate(ref["load_bytes_per_s"]) if ref else "-",
            f"{r['store']:.2f}" if r else "-",
            f"{r['load']:.2f}" if r else "-",
        )
    return [table]
