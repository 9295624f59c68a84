"""Hit ratio versus capacity plots (matplotlib, headless ``Agg`` backend).

One curve per policy, the Belady/OPT curve (the best any policy could do at that capacity) and the
infinite-cache ceiling (every re-reference hits). matplotlib is imported only here, only when a plot
is asked for (extra ``cli``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from kvtier.errors import KvtierError
from kvtier.extras import install_hint

__all__ = ["plot_hit_ratio", "pyplot"]

Curve = Sequence[tuple[float, float]]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the headless ``Agg`` backend (every kvtier plot draws through it);
    :class:`KvtierError` with the install command when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - installed with the plot extra
        raise KvtierError(f"--plot needs matplotlib: {install_hint('matplotlib')}") from exc
    return plt


def plot_hit_ratio(
    path: str | os.PathLike[str],
    curves: Mapping[str, Curve],
    *,
    opt: Curve | None = None,
    ceiling: float | None = None,
    title: str = "Block hit ratio vs capacity",
    xlabel: str = "capacity (% of unique blocks)",
) -> list[str]:
    """Write a PNG of hit ratio (y, in %) against capacity (x); return the legend's labels, in order.

    ``curves`` maps a policy name to ``(x, hit_ratio)`` points with ``hit_ratio`` in [0, 1]; ``opt``
    is the OPT curve, ``ceiling`` the infinite-cache hit ratio (a horizontal line). Raises
    :class:`KvtierError` with the path when the file cannot be written. The labels (one per policy,
    then ``OPT (Belady)`` and ``infinite cache (…%)`` when given) are read back from the drawn legend.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    try:
        markers = "osD^v<>pX*"
        for i, (name, pts) in enumerate(curves.items()):
            srt = sorted(pts)
            ax.plot(
                [p[0] for p in srt], [100 * p[1] for p in srt], marker=markers[i % len(markers)], label=name
            )
        if opt:
            srt = sorted(opt)
            ax.plot(
                [p[0] for p in srt],
                [100 * p[1] for p in srt],
                color="black",
                linestyle="--",
                marker="*",
                label="OPT (Belady)",
            )
        if ceiling is not None:
            ax.axhline(
                100 * ceiling, color="grey", linestyle=":", label=f"infinite cache ({100 * ceiling:.2f}%)"
            )
        ax.set_xlabel(xlabel)
        ax.set_ylabel("block hit ratio (%)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        legend = ax.legend(loc="lower right")
        labels = [t.get_text() for t in legend.get_texts()]
        fig.tight_layout()
        try:
            fig.savefig(os.fspath(path), format="png")
        except OSError as exc:
            raise KvtierError(f"--plot: cannot write {os.fspath(path)} ({exc.strerror or exc})") from exc
    finally:
        plt.close(fig)
    return labels
