"""Run independent simulate-mode replays in parallel, one process per core.

Sweeps and the planner replay one prepared trace many times with different configs; each replay is
single-threaded Python, so they scale with processes. :func:`fork_map` forks the workers after
storing the function and the shared state (the prepared trace: large, never pickled) in this
module, so the children inherit them copy-on-write; only the items and the results cross process
boundaries. Where ``fork`` is unavailable, or with one job, it runs the items one by one in this
process. Results come back in the order of the items whatever order the workers finish in.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["default_jobs", "fork_map"]

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")

# (function, shared state) of the running fork_map, read by the forked workers.
_TASK: tuple[Callable[[Any, Any], Any], Any] | None = None


def default_jobs() -> int:
    """Worker processes: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _call(item: tuple[int, Any]) -> tuple[int, Any]:
    assert _TASK is not None
    fn, shared = _TASK
    return item[0], fn(shared, item[1])


def fork_map(
    fn: Callable[[S, T], R],
    shared: S,
    items: Sequence[T],
    *,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[R]:
    """``[fn(shared, x) for x in items]``, ``jobs`` processes at a time (default: one per core).

    ``progress(done, total)`` is called in this process as results arrive. Items and results must
    pickle; ``fn`` and ``shared`` need not.
    """
    global _TASK
    n = len(items)
    workers = min(jobs or default_jobs(), n)
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        out_serial: list[R] = []
        for x in items:
            out_serial.append(fn(shared, x))
            if progress is not None:
                progress(len(out_serial), n)
        return out_serial
    out: list[Any] = [None] * n
    _TASK = (fn, shared)
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for done, (i, result) in enumerate(pool.imap_unordered(_call, list(enumerate(items))), 1):
                out[i] = result
                if progress is not None:
                    progress(done, n)
    finally:
        _TASK = None
    return out
