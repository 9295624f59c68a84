"""The planner's two PNGs (matplotlib, imported lazily, headless ``Agg`` backend).

* :func:`plot_capacity` — per tier kind, hit ratio (left axis) and net saving (right axis) against
  that tier's capacity in GiB, the other tiers held at the recommended sizes: lines are the one-pass
  curve's estimates over the whole range, markers the stacks simulated through the engine that
  share the other tiers' sizes, a star the recommendation.
* :func:`plot_pareto` — storage cost against GPU value per month: grid estimates (grey), simulated
  stacks (blue), their Pareto front (line), the recommendation (star) and the break-even line
  (value = cost; above it a stack pays for itself).

Titles carry the trace (requests, references, hours), the block size in tokens and bytes.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from kvtier.errors import KvtierError
from kvtier.plan.economics import GIB
from kvtier.plan.planner import PlanResult
from kvtier.plan.points import estimate
from kvtier.plan.stack import Stack
from kvtier.sim.plot import pyplot

__all__ = ["plot_capacity", "plot_pareto"]


def _title(result: PlanResult, what: str) -> str:
    return (
        f"{what}\n{result.trace}: {result.requests:,} requests, {result.block_refs:,} block refs, "
        f"{result.trace_seconds / 3600:.2f} h; blocks of {result.tokens_per_block} tokens = "
        f"{result.block_bytes / 2**20:,.1f} MiB"
    )


def _save(fig: Any, path: str | os.PathLike[str]) -> None:
    try:
        fig.savefig(path)
    except OSError as exc:
        raise KvtierError(f"{path}: cannot write plot ({exc.strerror or exc})") from exc


def plot_capacity(result: PlanResult, path: str | os.PathLike[str]) -> None:
    """Hit ratio and net saving against each tier's capacity (GiB); see the module docstring."""
    rec = result.recommendation
    ctx = result.context
    if rec is None or ctx is None:
        raise KvtierError("no recommendation to plot (target not reached)")
    plt = pyplot()
    kinds = result.kinds
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4.6), dpi=100, squeeze=False)
    try:
        u = result.unique_blocks
        base = dict(rec.stack.sizes)
        for ax, kind in zip(axes[0], kinds, strict=True):
            lo = 1 if kind != "ram" else max(1, min(b for k, b in rec.stack.sizes if k == "ram"))
            xs = np.unique(np.geomspace(lo, u, 60).astype(np.int64))
            est_hit, est_net, gib = [], [], []
            for b in xs:
                sizes = tuple((k, int(b) if k == kind else base[k]) for k in base)
                p = estimate(ctx, Stack(sizes))
                est_hit.append(100 * p.block_hit)
                est_net.append(p.econ.net_saving)
                gib.append(p.econ.bytes_by_tier.get(kind, 0) / GIB)
            ax.plot(gib, est_hit, color="tab:blue", label="hit ratio (one-pass estimate)")
            twin = ax.twinx()
            twin.plot(gib, est_net, color="tab:green", linestyle="--", label="net saving (estimate)")
            others = {k: b for k, b in base.items() if k != kind}
            sims = [p for p in result.simulated if {k: b for k, b in p.stack.sizes if k != kind} == others]
            if sims:
                xs_sim = [p.econ.bytes_by_tier.get(kind, 0) / GIB for p in sims]
                ax.plot(xs_sim, [100 * p.block_hit for p in sims], "o", color="tab:blue",
                        label="hit ratio (simulated)")  # fmt: skip
                twin.plot(xs_sim, [p.econ.net_saving for p in sims], "s", color="tab:green",
                          label="net saving (simulated)")  # fmt: skip
            x_rec = rec.econ.bytes_by_tier.get(kind, 0) / GIB
            ax.plot([x_rec], [100 * rec.block_hit], "*", color="tab:red", markersize=14, label="recommended")
            ax.set_xscale("log")
            ax.set_xlabel(f"{kind} capacity (GiB)")
            ax.set_ylabel("block hit ratio (%)")
            twin.set_ylabel("net saving ($/month)")
            twin.axhline(0.0, color="grey", linewidth=0.6)
            ax.set_title(f"{kind} (others as recommended)")
            ax.grid(True, alpha=0.3)
            lines = ax.get_legend_handles_labels()
            tl = twin.get_legend_handles_labels()
            # Below the axes, not on them: inside, the legend covered the curves.
            ax.legend(lines[0] + tl[0], lines[1] + tl[1], loc="upper center", bbox_to_anchor=(0.5, -0.16),
                      ncol=2, fontsize=8, frameon=False)  # fmt: skip
        fig.suptitle(_title(result, "Hit ratio and net saving against tier capacity"), fontsize=10)
        fig.tight_layout()
        _save(fig, path)
    finally:
        plt.close(fig)


def plot_pareto(result: PlanResult, path: str | os.PathLike[str]) -> None:
    """Storage cost against GPU value ($/month): estimates, simulated stacks, the front, the answer."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=100)
    try:
        est = result.estimates
        ax.scatter([p.econ.storage_cost for p in est], [p.econ.gpu_value for p in est], s=6, color="0.75",
                   label=f"grid stacks, estimated ({len(est):,})")  # fmt: skip
        sim = result.simulated
        ax.scatter([p.econ.storage_cost for p in sim], [p.econ.gpu_value for p in sim], s=30,
                   color="tab:blue", label=f"simulated through the engine ({len(sim)})")  # fmt: skip
        front = result.front
        ax.plot([p.econ.storage_cost for p in front], [p.econ.gpu_value for p in front], color="tab:blue",
                label="Pareto front (simulated)")  # fmt: skip
        top = max([p.econ.storage_cost for p in sim] + [p.econ.gpu_value for p in sim] + [1.0])
        # Many points, not two: on the symlog cost axis value = cost is a curve, and a two-point
        # segment would pass far above it (stacks under the segment saved several times their cost).
        xs = np.concatenate([np.linspace(0.0, 10.0, 64), np.geomspace(10.0, max(top, 10.0) * 1.05, 192)[1:]])
        ax.plot(xs, xs, color="grey", linestyle=":", label="break-even (value = cost)")
        rec = result.recommendation
        if rec is not None:
            ax.plot([rec.econ.storage_cost], [rec.econ.gpu_value], "*", color="tab:red", markersize=16,
                    label=f"recommended: {rec.stack.label()} blocks")  # fmt: skip
        ax.set_xscale("symlog", linthresh=10.0)
        ax.set_xlabel("storage cost ($/month)")
        ax.set_ylabel("GPU prefill time saved ($/month)")
        ax.set_title(_title(result, "Cost against saving"), fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        _save(fig, path)
    finally:
        plt.close(fig)
