"""``kvtier plan``: the cheapest tier stack for a trace and a model (a thin shell over
:func:`kvtier.plan.plan`; see docs/plan.md).

Exit codes: 0 a recommendation was printed; 1 the ``--target-hit`` cannot be reached; 2 bad input
(``ErrorType: message`` on one line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvtier.cli import options
from kvtier.cli.args import count, duration, positive, positive_int
from kvtier.cli.progress import ProgressLine
from kvtier.errors import ConfigError

__all__ = ["DEFAULT_KV_BYTES_PER_TOKEN", "DESCRIPTION", "HELP", "add_arguments", "run"]

#: Llama-3-8B in bf16 (32 layers x 8 KV heads x 128 dims x K and V x 2 bytes), when no model is given.
DEFAULT_KV_BYTES_PER_TOKEN = 131072


#: The command's line in ``kvtier --help``; :data:`DESCRIPTION` opens ``kvtier plan --help``.
HELP = "capacity planner: the cheapest RAM/NVMe/Redis/S3 stack for a trace, with cost and savings"
DESCRIPTION = (
    "Search tier sizes for a trace, simulating candidates through the engine "
    "(as `kvtier replay --simulate`), and recommend the cheapest stack for the objective."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``plan`` options to its parser (built by :func:`kvtier.cli.main.build_parser`)."""
    options.add_trace(p, "trace (.jsonl/.jsonl.gz: Mooncake, Qwen-Bailian, generic); "
                      "default: the shipped conversation trace")  # fmt: skip
    _add_model_options(p)
    _add_menu_options(p)
    _add_search_options(p)
    _add_fleet_options(p)
    options.add_json(p)
    options.add_progress(p, "progress on stderr (default: on; a line every few seconds when stderr is "
                         "not a terminal)")  # fmt: skip


def _add_model_options(p: argparse.ArgumentParser) -> None:
    """The block size: the model's KV bytes per token and the trace's tokens per block."""
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model-config", metavar="JSON", help="Hugging Face config.json of the model")
    kv_help = f"KV bytes per token (default {DEFAULT_KV_BYTES_PER_TOKEN:,}: Llama-3-8B, bf16)"
    model.add_argument("--kv-bytes-per-token", type=positive_int, help=kv_help)
    p.add_argument("--kv-dtype", help="KV-cache dtype overriding the config's (e.g. fp8)")
    bt_help = "tokens per trace block (512 in the Mooncake traces, 16 at vLLM's block size)"
    options.add_tokens_per_block(p, bt_help, flags=("--block-tokens", "--tokens-per-block"))


def _add_menu_options(p: argparse.ArgumentParser) -> None:
    """What may be bought and at what price: tier kinds, the menu, drives, the GPU."""
    p.add_argument("--tiers", default="ram,nvme,redis,s3", help="kinds to search, fastest first (ram first)")
    p.add_argument("--menu", metavar="FILE", help="JSON/YAML overriding prices, bandwidths, latencies, GPU")
    p.add_argument(
        "--nvme-drives",
        type=int,
        metavar="N",
        help="NVMe drives per node: plan a striped fs tier (one root per drive) and report the stack "
        "with one drive failed (default 1, or the menu's)",
    )
    p.add_argument(
        "--nvme-drive-size",
        metavar="SIZE",
        help="capacity of one NVMe drive (e.g. 3.5TiB): the NVMe sizes searched stay within the drives",
    )
    p.add_argument("--prefill-tokens-per-second", type=positive, help="GPU prefill rate (default 10,000)")
    p.add_argument(
        "--gpu-price", type=positive, metavar="USD_PER_HOUR", help="GPU price per hour (default 2.50)"
    )


def _add_search_options(p: argparse.ArgumentParser) -> None:
    """The objective, the simulated stacks' policies, the search's size and its outputs."""
    goal = p.add_mutually_exclusive_group()
    goal.add_argument(
        "--target-hit", metavar="PCT", help="cheapest stack reaching this block hit ratio (30%%)"
    )
    goal.add_argument("--budget", metavar="USD", help="largest net saving with storage <= $USD per month")
    p.add_argument("--policy", default="lru", help="eviction policy of every tier (default lru)")
    p.add_argument(
        "--write-policy",
        default="write_through",
        choices=["write_through", "after_hits"],
        help="write policy of every simulated stack",
    )
    p.add_argument("--trace-seconds", type=duration, help="traffic duration (default: the timestamps' span)")
    p.add_argument("--limit", type=positive_int, help="plan for the first N requests only (default: all)")
    p.add_argument("--simulations", type=positive_int, default=6, help="grid stacks simulated (default 6)")
    p.add_argument("--refine", type=count, default=3, help="refinement stacks simulated (default 3)")
    p.add_argument("--jobs", type=positive_int, help="parallel simulations (default: one per core)")
    p.add_argument(
        "--write-config", metavar="PATH", help="write the recommended stack's kvtier config (JSON)"
    )
    p.add_argument("--plot", metavar="PREFIX", help="write PREFIX-capacity.png and PREFIX-pareto.png")


def _add_fleet_options(p: argparse.ArgumentParser) -> None:
    fleet = options.add_fleet_group(
        p,
        "fleet planning (docs/plan.md, 'Planning a fleet')",
        instances=int,  # plan_fleet checks the range (1..1024) and names --instances
        help="plan a fleet of N engine instances: compare routers, shared store, p2p",
    )
    fleet.add_argument(
        "--ram-share",
        default="5%",
        metavar="PCT",
        help="fleet RAM as a share of the unique blocks, split over the instances (5%%)",
    )
    fleet.add_argument(
        "--shared-share",
        default="25%",
        metavar="PCT",
        help="shared store size as a share of the unique blocks (25%%)",
    )
    options.add_imbalance(fleet)


def _fraction(text: str, option: str) -> float:
    s = text.strip()
    try:
        value = float(s[:-1]) / 100.0 if s.endswith("%") else float(s)
    except ValueError:
        raise ConfigError(option, f"{text!r} is not a ratio such as 30% or 0.3") from None
    if not math.isfinite(value) or not 0 < value <= 1:
        raise ConfigError(option, f"{text!r} is not a ratio in (0, 100%]")
    return value


def _dollars(text: str) -> float:
    try:
        value = float(text.strip().lstrip("$").replace(",", ""))
    except ValueError:
        raise ConfigError("--budget", f"{text!r} is not an amount of dollars such as 500 or $500") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError("--budget", f"{text!r} is not an amount of dollars >= 0")
    return value


@contextlib.contextmanager
def _trace_path(arg: str | None) -> Iterator[Path]:
    from kvtier.sim.defaults import shipped_trace

    if arg:
        yield Path(arg)
        return
    with shipped_trace() as path:
        yield path


def _kv(args: argparse.Namespace, notes: list[str]) -> tuple[int, dict[str, Any] | None]:
    from kvtier.plan.model import kv_from_config, load_model_config

    if args.model_config:
        m = kv_from_config(load_model_config(args.model_config), kv_dtype=args.kv_dtype,
                           source=Path(args.model_config).name)  # fmt: skip
        return m.bytes_per_token, m.as_dict()
    if args.kv_dtype:
        raise ConfigError(
            "--kv-dtype", "needs --model-config (with --kv-bytes-per-token give the bytes directly)"
        )
    if args.kv_bytes_per_token is not None:
        return args.kv_bytes_per_token, None
    notes.append(
        f"no model given: {DEFAULT_KV_BYTES_PER_TOKEN:,} KV bytes per token assumed (Llama-3-8B, bf16)"
    )
    return DEFAULT_KV_BYTES_PER_TOKEN, None


#: Options passed unchanged to both :func:`kvtier.plan.plan` and :func:`kvtier.plan.fleet.plan_fleet`
#: (argparse dest = keyword), and those only ``plan`` takes.
_COMMON_OPTIONS = ("policy", "trace_seconds", "jobs")
_PLAN_OPTIONS = ("write_policy", "simulations", "refine")


def run(args: argparse.Namespace) -> int:
    """Run ``kvtier plan`` (see :func:`add_arguments`); returns the exit code."""
    from kvtier.plan import plan
    from kvtier.plan.render import render_plan

    if args.plot:
        options.require("matplotlib", "--plot")
    notes: list[str] = []
    kv_bytes, model = _kv(args, notes)
    menu = _menu(args)
    target = _fraction(args.target_hit, "--target-hit") if args.target_hit else None
    budget = _dollars(args.budget) if args.budget else None
    with _trace_path(args.trace) as path:
        requests = _read_requests(path, args.limit, args.block_tokens)
        progress = ProgressLine(sys.stderr) if args.progress is not False else None
        with progress or contextlib.nullcontext():
            common: dict[str, Any] = {
                **{k: getattr(args, k) for k in _COMMON_OPTIONS},
                "kv_bytes_per_token": kv_bytes,
                "tokens_per_block": args.block_tokens,
                "menu": menu,
                "name": path.name,
                "progress": progress.update if progress else None,
            }
            if args.instances is not None:
                return _run_fleet(args, requests, common, notes)
            asked = {"kinds": args.tiers.split(","), "target_hit": target, "budget": budget, "model": model}
            result = plan(requests, **common, **asked, **{k: getattr(args, k) for k in _PLAN_OPTIONS})
    result.notes[:0] = notes
    _print(args, result, _outputs(args, result), render_plan)
    return 0 if result.recommendation is not None else 1


def _menu(args: argparse.Namespace) -> Any:
    """The menu file (or the built-in one) with the GPU and NVMe drive options applied."""
    from kvtier.plan.menu import load_menu

    return (
        load_menu(args.menu)
        .with_gpu(prefill_tokens_per_second=args.prefill_tokens_per_second, price_per_hour=args.gpu_price)
        .with_drives(
            "nvme", args.nvme_drives, args.nvme_drive_size, where=("--nvme-drives", "--nvme-drive-size")
        )
    )


def _read_requests(path: Path, limit: int | None, block_tokens: int) -> Any:
    """The trace's requests; a trace whose blocks are plainly not ``--block-tokens`` long is refused."""
    from kvtier.sim.trace import guess_block_tokens, read_trace

    requests = read_trace(path, limit=limit)
    if not requests:
        raise ConfigError("trace", f"{path}: no requests to plan for")
    guess = guess_block_tokens(requests, prefer=block_tokens)
    if guess is not None and guess != block_tokens:
        raise ConfigError(
            "--block-tokens",
            f"{path.name}: len(hash_ids) matches input_length at {guess}-token blocks, not "
            f"{block_tokens}; pass --block-tokens {guess}",
        )
    return requests


def _print(args: argparse.Namespace, result: Any, written: list[str], render: Any) -> None:
    """``--json``: the result's document with the files written; else the tables."""
    if args.json:
        doc = result.to_json()
        doc["files"] = written
        print(json.dumps(doc, indent=2, default=str))
    else:
        from kvtier.cli.main import print_table

        render(result, print_table)
        for f in written:
            print(f"wrote {f}")


def _run_fleet(args: argparse.Namespace, requests: Any, common: dict[str, Any], notes: list[str]) -> int:
    """``kvtier plan --instances N``: compare fleet designs (kvtier.plan.fleet) and recommend one."""
    from kvtier.plan.fleet import plan_fleet, plot_fleet, render_fleet

    if args.target_hit or args.budget:
        raise ConfigError(
            "--instances", "fleet planning recommends by net saving; drop --target-hit/--budget"
        )
    result = plan_fleet(
        requests,
        **common,
        instances=args.instances,
        ram_share=_fraction(args.ram_share, "--ram-share"),
        shared_share=_fraction(args.shared_share, "--shared-share"),
        imbalance=args.imbalance,
    )
    result.notes[:0] = notes
    written: list[str] = []
    if args.plot:
        out = f"{args.plot}-fleet.png"
        plot_fleet(result, out)
        written.append(out)
    _print(args, result, written, render_fleet)
    return 0


def _outputs(args: argparse.Namespace, result: Any) -> list[str]:
    written: list[str] = []
    if args.write_config and result.config is not None:
        Path(args.write_config).write_text(json.dumps(result.config, indent=2) + "\n", encoding="utf-8")
        written.append(args.write_config)
    if args.plot and result.recommendation is not None:
        from kvtier.plan.plots import plot_capacity, plot_pareto

        cap, par = f"{args.plot}-capacity.png", f"{args.plot}-pareto.png"
        plot_capacity(result, cap)
        plot_pareto(result, par)
        written += [cap, par]
    return written
