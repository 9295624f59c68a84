"""``kvtier replay``: replay a KV-cache trace through the engine; sweeps, OPT, plots, JSON.

With no arguments it replays the conversation trace shipped in the package on the default stack
(primary tier in RAM + ``fs`` tier in a temporary directory). See docs/replay.md.

Exit codes: 0 success; 1 real-mode verification found mismatched blocks; 2 bad input (config, trace,
option), printed as one line ``ErrorType: message``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvtier.cli import args as types
from kvtier.cli import options
from kvtier.cli.progress import ProgressLine
from kvtier.errors import ConfigError, KvtierError

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]

DEFAULT_SWEEP_CAPACITIES = "1%,5%,10%,25%,50%"
DEFAULT_SWEEP_POLICIES = "lru,arc,s3fifo,sieve,prefix"


#: The command's line in ``kvtier --help``; :data:`DESCRIPTION` opens ``kvtier replay --help``.
HELP = "replay a KV-cache trace through the engine (hit ratios, capacity planning)"
DESCRIPTION = (
    "Replay a Mooncake or generic JSONL trace (optionally gzip) through the kvtier engine. "
    "Default: the shipped conversation trace on RAM + a temporary fs tier, real bytes."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``replay`` options to its parser (built by :func:`kvtier.cli.main.build_parser`)."""
    options.add_trace(p, "trace file (.jsonl or .jsonl.gz); default: the shipped trace")
    options.add_config(
        p,
        "config file (.json/.yaml) or JSON string; default: RAM + temporary fs tier "
        "(with --simulate/--sweep: the RAM tier alone)",
    )
    _add_run_options(p)
    _add_fleet_options(p)
    _add_output_options(p)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """What is replayed and how: mode, policy, capacity, block shape, sweep and OPT."""
    p.add_argument("--simulate", action="store_true", help="metadata only, virtual clock, same engine")
    p.add_argument("--policy", help="eviction policy (comma-separated list with --sweep)")
    p.add_argument("--capacity", help="primary capacity: 1%% of unique blocks, 1827 blocks or 64MiB")
    options.add_block_bytes(p, "synthetic payload bytes per block, e.g. 4096 or 4KiB (keeps the slot count)")
    options.add_tokens_per_block(p, "tokens per trace block (default 512)")
    p.add_argument("--limit", type=types.positive_int, help="replay only the first N requests")
    p.add_argument("--sweep", action="store_true", help="capacity x policy sweep (simulate) with OPT")
    p.add_argument("--plot", metavar="PNG", help="write hit ratio vs capacity plot (implies --sweep)")
    p.add_argument(
        "--opt",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compute Belady/OPT (default: on with --simulate and --sweep)",
    )
    p.add_argument(
        "--jobs", type=int, default=1, help="--sweep: replay the points in N processes (0: one per core)"
    )
    p.add_argument(
        "--sync",
        action="store_true",
        help="real mode: finish each request's tier I/O before the next request (fs tiers on one "
        "I/O thread), so per-tier hits match --simulate exactly; no effect with --simulate/--sweep",
    )


def _add_fleet_options(p: argparse.ArgumentParser) -> None:
    fleet = options.add_fleet_group(
        p,
        "fleet simulation (with --simulate; docs/plan.md, 'Planning a fleet')",
        instances=types.positive_int,
        help="simulate N engine instances behind a router, each with the config's stack",
    )
    fleet.add_argument(
        "--router",
        default="prefix",
        choices=["round_robin", "session", "prefix"],
        help="request routing (default prefix: longest cached prefix, bounded load)",
    )
    fleet.add_argument(
        "--shared-tiers",
        metavar="NAMES",
        help="secondary tiers shared by all instances (default: the redis/obj/mooncake ones)",
    )
    options.add_imbalance(fleet)


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """Where the results go: JSON or tables, a live metrics endpoint, progress on stderr."""
    options.add_json(p)
    p.add_argument(
        "--metrics-port",
        type=types.port,
        help="serve Prometheus metrics on 127.0.0.1:PORT while replaying (0: a free port; the URL is "
        "printed on stderr)",
    )
    p.add_argument(
        "--metrics-linger",
        type=types.seconds_or_zero,
        default=15.0,
        help="with --metrics-port: seconds the final values stay up after the replay, one scrape "
        "interval (default 15; 0: close at once)",
    )
    options.add_progress(
        p, "progress on stderr (default: on; a bar on a terminal, a line every few seconds otherwise)"
    )


def _fail(exc: BaseException) -> int:
    msg = str(exc).splitlines()[0] if str(exc) else repr(exc)
    print(f"{type(exc).__name__}: {msg}", file=sys.stderr)
    return 2


@contextlib.contextmanager
def _resolve(args: argparse.Namespace) -> Iterator[tuple[Path, Any]]:
    """(trace path, config) for the run; temporary directories live for the ``with``."""
    from kvtier.config.layers import CONFIG_ENV, resolve_config
    from kvtier.sim.defaults import default_config, default_simulate_config, shipped_trace

    with contextlib.ExitStack() as stack:
        trace = Path(args.trace) if args.trace else stack.enter_context(shipped_trace())
        fallback = None
        if args.config or os.environ.get(CONFIG_ENV, "").strip():
            pass  # the file layer comes from --config or KVTIER_CONFIG
        elif args.simulate or args.sweep or args.plot is not None:
            fallback = default_simulate_config()
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="kvtier-replay-"))
            fallback = default_config(Path(tmp) / "fs0")
        config = resolve_config(args.config or None, fallback=fallback).config
        if args.sync and not (args.simulate or args.sweep or args.plot is not None):
            config = _one_io_thread(config)
        if args.block_bytes is not None:
            slots = config.num_primary_slots
            config = dataclasses.replace(config, block_bytes=args.block_bytes)
            config = dataclasses.replace(config, cpu_bytes_to_use=slots * config.row_stride)
        yield trace, config


def _one_io_thread(config: Any) -> Any:
    """``config`` with every ``fs`` tier on one I/O thread (``--sync``).

    With several threads a store job's chunks finish in any order, so its blocks enter the tier's
    policy in a varying order and a later victim can differ from the model's (which inserts them in
    key order); one thread keeps key order.
    """
    tiers = tuple(
        dataclasses.replace(t, options={**t.options, "threads": 1}) if t.type == "fs" else t
        for t in config.secondary_tiers
    )
    return dataclasses.replace(config, secondary_tiers=tiers)


@contextlib.contextmanager
def _status(enabled: bool, force: bool, text: str) -> Iterator[None]:
    """A spinner on stderr while the trace is read and keyed (a few seconds for the shipped one);
    one line where there is no terminal (or no rich)."""
    if not enabled:
        yield
        return
    if not _bar_wanted(force):
        yield  # no spinner off a terminal; progress lines follow if the replay takes a while
        return
    from rich.console import Console

    with Console(stderr=True, force_terminal=force or None).status(text):
        yield


def _bar_wanted(force: bool) -> bool:
    from kvtier.cli.output import have_rich

    return have_rich() and (force or sys.stderr.isatty())


class _Progress:
    """A rich progress bar on a terminal (or with ``--progress``), whole lines every few seconds
    on a pipe (:class:`~kvtier.cli.progress.ProgressLine`), or nothing."""

    def __init__(self, enabled: bool, total: int, label: str, force: bool = False) -> None:
        self._bar: Any = None
        self._line: ProgressLine | None = None
        self._label = label
        if not enabled:
            return
        if not _bar_wanted(force):
            self._line = ProgressLine(sys.stderr, terminal=False).__enter__()
            self._line.update(label, 0, total)
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            # --progress asks for the bar even when stderr is not a terminal (logs, CI, tests).
            console=Console(stderr=True, force_terminal=force or None),
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(label, total=total)

    def update(self, done: int, total: int, label: str | None = None) -> None:
        if self._line is not None:
            self._label = label or self._label
            self._line.update(self._label, done, total)
        if self._bar is not None:
            kw: dict[str, Any] = {"completed": done, "total": total}
            if label is not None:
                kw["description"] = label
            self._bar.update(self._task, **kw)

    def close(self) -> None:
        if self._line is not None:
            self._line.__exit__(None, None, None)
            self._line = None
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def run(args: argparse.Namespace) -> int:
    """Run ``kvtier replay`` (see :func:`add_arguments`); returns the exit code."""
    try:
        return _run(args)
    except BrokenPipeError:
        raise  # the reader left (`| head`): main() exits 0, this is not an error
    except (KvtierError, ValueError, OSError) as exc:
        return _fail(exc)


def _run(args: argparse.Namespace) -> int:
    from kvtier.keys import KeyNamespace
    from kvtier.sim.replay import prepare_trace, replay
    from kvtier.sim.trace import read_trace

    sweep_mode = args.sweep or args.plot is not None
    policies = [p.strip() for p in (args.policy or "").split(",") if p.strip()]
    if not sweep_mode and len(policies) > 1:
        raise ConfigError("--policy", "several policies need --sweep")
    if not sweep_mode and args.capacity and "," in args.capacity:
        raise ConfigError("--capacity", "several capacities need --sweep")

    # Progress bars are rich's; without it (core install) replay simply runs without one.
    show_progress = args.progress is not False

    if args.plot is not None:
        options.require("matplotlib", "--plot")  # before the sweep, not after minutes of it
    with _resolve(args) as (trace_path, config):
        with _status(show_progress, args.progress is True, f"reading {trace_path.name}"):
            requests = read_trace(trace_path, limit=args.limit)
            if not requests:
                raise ConfigError("trace", f"{trace_path}: no requests to replay")
            ns = KeyNamespace.from_config(config, block_size=args.tokens_per_block)
            tpb = args.tokens_per_block
            trace = prepare_trace(requests, ns, name=trace_path.name, tokens_per_block=tpb)
        if sweep_mode:
            if args.instances is not None:
                raise ConfigError("--instances", "not with --sweep/--plot; use kvtier plan --instances N")
            return _run_sweep(args, trace, config, policies, show_progress)
        from kvtier.sim.sweep import capacity_config, parse_capacity

        if args.capacity:
            cap = parse_capacity(args.capacity, trace.unique_blocks, config.row_stride)
            config = capacity_config(config, cap.blocks)
        if policies:
            config = dataclasses.replace(config, eviction_policy=policies[0], cache_policy_module_path=None)
        if args.instances is not None:
            return _run_fleet(args, trace, config, requests)
        label = "replay (simulate)" if args.simulate else "replay"
        bar = _Progress(show_progress, trace.requests, label, force=args.progress is True)
        try:
            report = replay(
                trace,
                config,
                simulate=args.simulate,
                progress=bar.update,
                metrics_port=args.metrics_port,
                sync=args.sync,
                on_listen=_print_url,
                metrics_linger=args.metrics_linger,
            )
        finally:
            bar.close()
        want_opt = args.simulate if args.opt is None else args.opt
        if want_opt:
            from kvtier.sim.opt import opt_hit_ratio

            report.opt = {"block": opt_hit_ratio(trace.flat, report.capacity_blocks)}
        if args.json:
            print(json.dumps(report.to_json(), indent=2, default=str))
        else:
            from kvtier.cli.output import emit
            from kvtier.sim.report import report_tables

            emit(report_tables(report))
        return 1 if report.verify_mismatches else 0


def _run_sweep(args: argparse.Namespace, trace: Any, config: Any, policies: list[str], show: bool) -> int:
    from kvtier.cli.output import emit
    from kvtier.sim.parallel import default_jobs
    from kvtier.sim.plot import plot_hit_ratio
    from kvtier.sim.report import sweep_tables
    from kvtier.sim.sweep import parse_capacities, sweep

    caps = parse_capacities(args.capacity or DEFAULT_SWEEP_CAPACITIES, trace.unique_blocks, config.row_stride)
    pols = policies or DEFAULT_SWEEP_POLICIES.split(",")
    bar = _Progress(show, 1, "sweep", force=args.progress is True)
    try:
        result = sweep(
            trace,
            config,
            caps,
            pols,
            with_opt=args.opt is not False,
            progress=lambda label, done, total: bar.update(done, total, label),
            jobs=args.jobs if args.jobs > 0 else default_jobs(),
        )
    finally:
        bar.close()
    if args.plot:
        curves, opt = result.curves()
        plot_hit_ratio(
            args.plot,
            curves,
            opt=opt or None,
            ceiling=result.infinite.get("block"),
            title=f"{trace.name}: block hit ratio vs capacity ({trace.unique_blocks:,} unique blocks)",
        )
    if args.json:
        print(json.dumps(result.to_json(), indent=2, default=str))
    else:
        emit([*sweep_tables(result.rows()), *([f"plot written to {args.plot}"] if args.plot else [])])
    return 0


def _run_fleet(args: argparse.Namespace, trace: Any, config: Any, requests: Any) -> int:
    from kvtier.cli.output import emit
    from kvtier.sim.fleet import FleetSpec, fleet_tables, simulate_fleet

    if not args.simulate:
        raise ConfigError("--instances", "fleet simulation needs --simulate")
    if args.metrics_port is not None:
        raise ConfigError("--metrics-port", "not with --instances (one exporter per engine is not served)")
    shared = None
    if args.shared_tiers is not None:
        shared = tuple(s.strip() for s in args.shared_tiers.split(",") if s.strip())
    spec = FleetSpec(instances=args.instances, router=args.router, shared=shared, imbalance=args.imbalance)
    report = simulate_fleet(trace, config, spec, requests=requests)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        emit(fleet_tables(report))
    return 0


def _print_url(url: str) -> None:
    # stderr: stdout may carry --json; a script reads the URL of a port-0 exporter from here.
    print(f"metrics: {url}", file=sys.stderr, flush=True)
