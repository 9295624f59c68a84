"""Capacity planning: the cheapest tier stack for a trace and a model (``kvtier plan``, docs/plan.md).

Library first; the CLI (:mod:`kvtier.cli.plan`) is a thin shell over :func:`plan`.

* :mod:`kvtier.plan.model` — KV bytes per token from a Hugging Face ``config.json``;
* :mod:`kvtier.plan.menu` — tier kinds (price, bandwidth, latency) and the GPU, overridable;
* :mod:`kvtier.plan.stack` — a stack of sizes and the kvtier config that builds it (kinds -> tiers);
* :mod:`kvtier.plan.curve` — the one-pass LRU hit-ratio curve (stack distances);
* :mod:`kvtier.plan.points` / :mod:`kvtier.plan.search` — estimate, simulate (in parallel), refine;
* :mod:`kvtier.plan.economics` — storage cost, GPU time saved, net saving;
* :mod:`kvtier.plan.planner` — :func:`plan` and :class:`PlanResult`;
* :mod:`kvtier.plan.render` / :mod:`kvtier.plan.plots` — the table and the PNGs.
"""

from __future__ import annotations

from kvtier.plan.planner import PlanResult, plan

__all__ = ["PlanResult", "plan"]
