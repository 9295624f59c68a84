"""``kvtier serve``: run an engine from a config and export its Prometheus metrics.

The process builds the configured stack (e.g. a shared-memory primary tier other processes attach to,
or tiers that warm up by scanning a shared directory), polls it so tier jobs complete, and serves
``/metrics`` on ``127.0.0.1:--metrics-port`` (or config ``metrics_port``) until SIGINT/SIGTERM or
``--duration`` seconds. It prints the metrics URL on stdout once listening (one line), so scripts
can wait for it.

With ``--p2p-port`` (or a ``p2p`` tier with ``serve`` options in the config) it also runs the p2p
block server that lets peer instances load this engine's primary-tier blocks (docs/p2p.md), and
prints ``p2p HOST:PORT`` on stdout once listening; ``--metrics-port`` is then optional.

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
from kvtier.cli import options

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]


#: The command's line in ``kvtier --help``; :data:`DESCRIPTION` opens ``kvtier serve --help``.
HELP = "run an engine from a config and serve its Prometheus metrics"
DESCRIPTION = "Build the configured engine and serve /metrics on 127.0.0.1 until interrupted."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``serve`` options to its parser (built by :func:`kvtier.cli.main.build_parser`)."""
    options.add_config(p, "config file or JSON string (default: built-in defaults)")
    p.add_argument(
        "--metrics-port", type=types.port, help="port on 127.0.0.1 (0 = any free port); default: config"
    )
    p.add_argument("--metrics-addr", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--duration", type=types.duration, help="stop after this many seconds (default: run until signalled)"
    )
    p.add_argument("--poll-interval", type=types.duration, default=0.05, help="seconds between engine polls")
    g = p.add_argument_group("p2p block server (docs/p2p.md)")
    g.add_argument(
        "--p2p-port", type=types.port, help="serve primary-tier blocks to peers on this port (0: any)"
    )
    g.add_argument("--p2p-addr", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    g.add_argument("--p2p-secret-env", help="environment variable holding the shared secret")
    g.add_argument("--p2p-secret-file", help="file (mode 0600) holding the shared secret")
    g.add_argument("--p2p-directory", help="redis:// URL of the fleet directory to publish held blocks to")
    g.add_argument("--p2p-layout", default="", help="layout fingerprint peers must present")


def run(args: argparse.Namespace) -> int:
    """Run ``kvtier serve``; returns the exit code."""
    from kvtier.config.layers import resolve_config
    from kvtier.engine import Engine
    from kvtier.errors import ConfigError
    from kvtier.metrics import start_exporter

    config = resolve_config(args.config).config
    port = args.metrics_port if args.metrics_port is not None else config.metrics_port
    p2p_port = getattr(args, "p2p_port", None)
    serves_p2p = p2p_port is not None or _config_serves_p2p(config)
    if port is None and not serves_p2p:
        raise ConfigError("metrics_port", "serve needs --metrics-port PORT or metrics_port in the config")
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        # serve owns the exporter; the engine must not bind config.metrics_port a second time.
        with Engine(dataclasses.replace(config, metrics_port=None)) as engine:
            service = _start_p2p(engine, args) if p2p_port is not None else engine.serving.block_service
            if serves_p2p and service is None:
                raise ConfigError("serve", "the p2p block server did not start (see the warning above)")
            exporter = start_exporter(engine, port, addr=args.metrics_addr) if port is not None else None
            try:
                if service is not None:
                    print(f"p2p {service.address}", flush=True)
                if exporter is not None:
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
                if exporter is not None:
                    exporter.close()
                if service is not None and service is not engine.serving.block_service:
                    service.close()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    print("stopped", file=sys.stderr)
    return 0


def _config_serves_p2p(config: Any) -> bool:
    return any(t.type == "p2p" and t.options.get("serve") is not None for t in config.secondary_tiers)


def _start_p2p(engine: Any, args: argparse.Namespace) -> Any:
    """The block service of ``--p2p-*`` (the secret from ``--p2p-secret-env``/``--p2p-secret-file``)."""
    from kvtier.tiers.p2p.protocol import load_secret
    from kvtier.tiers.p2p.service import start

    secret = load_secret(secret_env=args.p2p_secret_env, secret_file=args.p2p_secret_file, what="--p2p")
    return start(
        engine,
        secret=secret,
        options={"host": args.p2p_addr, "port": args.p2p_port},
        layout=args.p2p_layout,
        directory=args.p2p_directory,
    )
