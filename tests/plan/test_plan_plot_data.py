"""The planner's plots show what they claim (issue 28), checked on the plotted data of a real
small plan (the shipped trace, 300 requests): the Pareto plot's break-even line is value = cost
everywhere on its symlog axis (it was a two-point segment that passed far above the curve), and
each capacity panel's legend names every series drawn, the simulated points included, and sits
outside the axes instead of over the curves."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from needs import need_module

need_module("matplotlib", "plot")

from kvtier.cli.main import main  # noqa: E402
from kvtier.plan import plots  # noqa: E402


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    captured: dict[str, Any] = {}
    mp = pytest.MonkeyPatch()

    def keep(fig: Any, path: Any) -> None:
        fig.canvas.draw()
        captured[str(path).rsplit("-", 1)[1]] = fig

    mp.setattr(plots, "_save", keep)
    import matplotlib.pyplot as plt

    mp.setattr(plt, "close", lambda *a, **k: None)  # keep the figures for inspection
    prefix = tmp_path_factory.mktemp("plots") / "p"
    try:
        code = main(["plan", "--limit", "300", "--simulations", "3", "--jobs", "1", "--no-progress",
                     "--plot", str(prefix)])  # fmt: skip
    finally:
        mp.undo()
    assert code == 0
    return captured


def test_the_break_even_line_is_value_equals_cost_on_the_drawn_axis(figures: dict[str, Any]) -> None:
    fig = figures["pareto.png"]
    ax = fig.axes[0]
    (line,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("break-even")]
    xs, ys = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
    assert np.allclose(xs, ys)
    # What the eye sees: the straight segments drawn between the points, in display space,
    # mapped back to data coordinates, must stay on value = cost.
    disp = ax.transData.transform(np.column_stack([xs, ys]))
    mids = ax.transData.inverted().transform((disp[1:] + disp[:-1]) / 2)
    worst = np.max(np.abs(mids[:, 1] - mids[:, 0]) / np.maximum(mids[:, 0], 1.0))
    assert worst < 0.05, f"the drawn line strays {worst:.0%} from value = cost"
    sim = [c for c in ax.collections if "simulated" in str(c.get_label())]
    top = max(np.max(c.get_offsets()) for c in sim)
    assert xs.max() >= top  # it spans every simulated stack


def test_each_capacity_legend_names_every_series_and_covers_no_curve(figures: dict[str, Any]) -> None:
    fig = figures["capacity.png"]
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_legend() is not None]
    assert panels
    for ax in panels:
        twin = [other for other in fig.axes if other is not ax and other.bbox.bounds == ax.bbox.bounds]
        drawn = {
            ln.get_label() for a in [ax, *twin] for ln in a.get_lines() if not ln.get_label().startswith("_")
        }
        legend = ax.get_legend()
        shown = {t.get_text() for t in legend.get_texts()}
        assert drawn <= shown, f"missing from the legend: {drawn - shown}"
        box = legend.get_window_extent(renderer)
        assert not box.overlaps(ax.get_window_extent(renderer)), "the legend sits on the curves"
    labels = {t.get_text() for ax in panels for t in ax.get_legend().get_texts()}
    assert {"hit ratio (simulated)", "net saving (simulated)"} <= labels  # simulated points are named
