"""``kvtier serve``: run an engine from a config and export its Prometheus metrics.

The process builds the configured stack (e.g. a shared-memory primary tier other processes attach to,
or tiers that warm up by scanning a shared directory), polls it so tier jobs complete, and serves
``/metrics`` on ``127.0.0.1:--metrics-port`` (or config ``metrics_port``) until SIGINT/SIGTERM or
``--duration`` seconds. It prints the metrics URL on stdout once listening (one line), so scripts
can wait for it.

Exit codes: 0 stopped cleanly; 2 bad input (config, port in use).
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
import time
from typing import Any

from kvtier.cli import args as types

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``serve`` on an ``argparse`` subparsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run an engine from a config and serve its Prometheus metrics",
        description="Build the configured engine and serve /metrics on 127.0.0.1 until interrupted.",
    )
    p.add_argument("--config", "-c", help="config file or JSON string (default: built-in defaults)")
    p.add_argument(
        "--metrics-port", type=types.port, help="port on 127.0.0.1 (0 = any free port); default: config"
    )
    p.add_argument("--metrics-addr", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--duration", type=types.duration, help="stop after this many seconds (default: run until signalled)"
    )
    p.add_argument("--poll-interval", type=types.duration, default=0.05, help="seconds between engine polls")
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``kvtier serve``; returns the exit code."""
    from kvtier.config_layers import resolve_config
    from kvtier.engine import Engine
    from kvtier.errors import ConfigError
    from kvtier.metrics import start_exporter

    config = resolve_config(args.config).config
    port = args.metrics_port if args.metrics_port is not None else config.metrics_port
    if port is None:
        raise ConfigError("metrics_port", "serve needs --metrics-port PORT or metrics_port in the config")
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        # serve owns the exporter; the engine must not bind config.metrics_port a second time.
        with Engine(dataclasses.replace(config, metrics_port=None)) as engine:
            exporter = start_exporter(engine, port, addr=args.metrics_addr)
            try:
                print(exporter.url, flush=True)
                deadline = None if args.duration is None else time.monotonic() + args.duration
                while not stop.is_set():
                    engine.poll()
                    engine.events()  # nobody reads them here; keep the queue empty
                    timeout = args.poll_interval
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        timeout = min(timeout, left)
                    stop.wait(timeout)
            finally:
                exporter.close()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    print("stopped", file=sys.stderr)
    return 0
