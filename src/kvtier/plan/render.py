"""The plan as tables for people (``kvtier plan`` without ``--json``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvtier.plan.economics import GIB
from kvtier.plan.menu import TierKind
from kvtier.plan.planner import PlanResult
from kvtier.plan.points import Point

__all__ = ["render_plan"]

TableFn = Callable[[str, Sequence[str], Sequence[Sequence[Any]]], None]


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _usd(x: float) -> str:
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:,.1f} GiB"


def _stack_row(p: Point, mark: str = "") -> list[str]:
    sizes = ", ".join(f"{k} {_gib(p.econ.bytes_by_tier.get(k, 0))}" for k in p.stack.kinds)
    return [
        mark,
        sizes,
        _pct(p.block_hit),
        _usd(p.econ.storage_cost),
        f"{p.econ.saved_gpu_seconds_per_hour:,.0f}",
        _usd(p.econ.gpu_value),
        _usd(p.econ.net_saving),
    ]


def _kind_row(k: TierKind) -> list[str]:
    bw, lat = f"{k.load_bandwidth / 1e9:g} GB/s", f"{k.load_latency * 1e6:g} us"
    what = k.assumption
    if k.drives > 1 or k.drive_bytes is not None:
        size = "" if k.drive_bytes is None else f" of {_gib(k.drive_bytes)}"
        what = f"{k.drives} drive{'s' if k.drives > 1 else ''}{size}; {what}"
    return [k.name, f"${k.price_per_gib_month:g}", bw, lat, k.source, what]


def render_plan(result: PlanResult, table: TableFn, echo: Callable[[str], None] = print) -> None:
    """Print the recommendation, its tiers, the simulated front and the assumptions."""
    bb = result.block_bytes
    echo(
        f"trace {result.trace}: {result.requests:,} requests, {result.block_refs:,} block refs, "
        f"{result.unique_blocks:,} unique blocks of {result.tokens_per_block} tokens "
        f"({bb:,} bytes each at {result.kv_bytes_per_token:,} KV bytes/token), "
        f"{result.trace_seconds / 3600:.2f} h of traffic"
    )
    obj = result.objective
    goal = {
        "target": f"cheapest stack with >= {_pct(obj.value)} block hits",
        "budget": f"largest net saving with storage <= {_usd(obj.value)}/month",
        "pareto": "largest net saving (Pareto front below)",
    }[obj.kind]
    rec = result.recommendation
    if rec is None:
        echo(f"objective: {goal}: not reached")
    else:
        echo(f"objective: {goal}")
        rows = []
        for t in rec.to_json(bb)["tiers"]:
            saved = t["saved_seconds"]
            rows.append(
                [
                    t["kind"],
                    t["type"],
                    f"{t['blocks']:,}",
                    _gib(t["bytes"]),
                    _pct(t["hit_ratio"]),
                    _usd(t["cost_per_month"]),
                    "" if saved is None else f"{saved * 3600 / result.trace_seconds:,.0f}",
                ]
            )
        cols = ["tier", "type", "blocks", "capacity", "hit ratio", "$/month", "GPU s saved/h"]
        table(f"Recommended stack ({rec.source}): {rec.stack.label()}", cols, rows)
        e = rec.econ
        hr = rec.hit_ratio
        echo(
            f"block hits {_pct(rec.block_hit)} (prefix {_pct(hr.get('prefix', 0.0))}, token "
            f"{_pct(hr.get('token', 0.0))}); GPU prefill saved {e.saved_gpu_seconds_per_hour:,.0f} "
            f"s per hour of traffic = {_usd(e.gpu_value)}/month; storage {_usd(e.storage_cost)}/month; "
            f"net saving {_usd(e.net_saving)}/month"
        )
        for kind, d in result.degraded.items():
            drives = min(result.menu.kind(kind).drives, rec.stack.blocks(kind))
            echo(
                f"with one {kind} drive failed (1 of {drives} fenced): block hits {_pct(d.block_hit)} "
                f"({100 * (d.block_hit - rec.block_hit):+.2f} points); net saving "
                f"{_usd(d.econ.net_saving)}/month"
            )
    cols = ["", "stack", "block hits", "storage $/mo", "GPU s saved/h", "GPU $/mo", "net $/mo"]
    front = result.front
    rows = [_stack_row(p, "*" if rec is not None and p.stack == rec.stack else "") for p in front]
    table(f"Pareto front of the {len(result.simulated)} simulated stacks (cost against saving)", cols, rows)
    m = result.menu
    rows = [_kind_row(m.kinds[n]) for n in result.kinds]
    table(
        "Assumptions (override with --menu FILE)",
        ["kind", "$/GiB-month", "load", "latency", "source", "what"],
        rows,
    )
    g = m.gpu
    echo(f"GPU: {g.prefill_tokens_per_second:,.0f} prefill tokens/s, ${g.price_per_hour:g}/hour ({g.source})")
    if result.per_turn:
        rows = [
            [str(t["turn"]), f"{t['requests']:,}", f"{t['block_refs']:,}", _pct(t["hit_ratio"])]
            for t in result.per_turn
        ]
        table(
            "Per turn (flat LRU at the stack's largest tier)",
            ["turn", "requests", "block refs", "hit ratio"],
            rows,
        )
    for note in result.notes:
        echo(f"note: {note}")
