"""Paired per-round ratios for the benchmarks (imported by the bench scripts next to it).

On a shared machine the speed drifts from second to second, so a best-of or a ratio of two medians
keeps the drift. A benchmark that runs kvtier and its reference back to back in every round
instead reports the median of the per-round ratios, with their spread.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Sequence

__all__ = ["paired_ratio", "rounds"]


def rounds(min_rounds: int, max_rounds: int, seconds: float) -> Iterator[int]:
    """Round numbers 0, 1, ...: at least ``min_rounds``, then more while ``seconds`` have not
    passed, at most ``max_rounds``. A quiet machine gets many rounds (a tighter median) in the
    same time a loaded one spends on the minimum."""
    t0 = time.monotonic()
    r = 0
    while r < min_rounds or (r < max_rounds and time.monotonic() - t0 < seconds):
        yield r
        r += 1


def paired_ratio(reference_s: Sequence[float], kvtier_s: Sequence[float]) -> tuple[float, dict[str, float]]:
    """(median, spread) of ``reference_s[i] / kvtier_s[i]`` over rounds: kvtier's throughput over
    the reference's for the same bytes; spread = min, quartiles and max of the per-round ratios."""
    per_round = sorted(r / k for r, k in zip(reference_s, kvtier_s, strict=True))
    q = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else [per_round[0]] * 3
    spread = {"min": per_round[0], "q1": q[0], "q3": q[2], "max": per_round[-1]}
    return statistics.median(per_round), {k: round(v, 3) for k, v in spread.items()}
