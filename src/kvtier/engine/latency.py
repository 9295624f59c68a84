"""Operation latency of one engine: fixed-bucket histograms per tier and operation.

Owns ``stats()["latency"]``: ``{tier: {operation: {"buckets": [[upper_bound_seconds,
cumulative_count], ..., [inf, count]], "sum": seconds, "count": n}}}``, Prometheus-style
(cumulative, ``le`` semantics: a duration equal to a bound counts in that bound's bucket, the last
bound is ``+inf``). The primary tier (``"primary"``) has ``lookup``, ``load`` and ``store``; each
secondary tier, by name, ``load`` (promotion jobs) and ``store`` (store jobs).

What is timed, always in wall-clock seconds (``time.perf_counter``, also when the engine runs on a
virtual clock, so a simulation reports what the engine itself cost):

* primary ``lookup``: one :meth:`Engine.lookup` (or the lookup half of ``access``), tier lookups
  included, lock wait excluded;
* primary ``load`` / ``store``: one byte-moving call (``load_blocks``, ``load_kv``, ``store_blocks``,
  ``store_kv``, also when a ``submit_*_kv`` worker runs it), slot bookkeeping included;
* a secondary tier's ``load`` / ``store``: one job, from its submission to the engine applying its
  result (``poll``/``drain``), so the figure includes how long the result waited to be collected.

Observing is one bisection and three updates. The lookup and job histograms are only touched under
the engine's lock (observed in ``lookup``/``poll``, read by ``stats()``), so they take no lock of
their own; the primary ``load``/``store`` ones are observed outside it, also from ``submit_*_kv``
workers, and take a lock of their own (uncontended in practice). The bounds are fixed (1-2.5-5
steps from 1 µs to 50 s): the histograms of every engine and tier aggregate in Prometheus without
any agreement beyond this module.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

__all__ = ["BOUNDS", "Histogram", "Latency"]

#: Upper bounds in seconds of the finite buckets (``+inf`` is implied).
BOUNDS: tuple[float, ...] = tuple(float(f"{m}e{e}") for e in range(-6, 2) for m in ("1", "2.5", "5"))

PRIMARY_OPS = ("lookup", "load", "store")
TIER_OPS = ("load", "store")


class Histogram:
    """Counts of durations per bucket of :data:`BOUNDS`, their sum and number.

    Args:
        lock: taken by :meth:`observe` and :meth:`snapshot`, for a histogram observed from several
            threads; ``None`` (the default) when the caller already serialises every call (the
            engine's lock), which saves the lock's cost on the lookup path.
    """

    __slots__ = ("_counts", "_lock", "count", "total")

    def __init__(self, lock: threading.Lock | None = None) -> None:
        self._counts = [0] * (len(BOUNDS) + 1)  # per bucket, not cumulative; the last is +inf
        self._lock = lock
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration (a negative one, from a clock step, counts as 0)."""
        if seconds < 0.0:
            seconds = 0.0
        i = bisect_left(BOUNDS, seconds)
        lock = self._lock
        if lock is None:
            self._counts[i] += 1
            self.count += 1
            self.total += seconds
            return
        with lock:
            self._counts[i] += 1
            self.count += 1
            self.total += seconds

    def snapshot(self) -> dict[str, Any]:
        """``{"buckets": [[bound, cumulative], ..., [inf, count]], "sum": s, "count": n}``."""
        if self._lock is None:
            counts, total = list(self._counts), self.total
        else:
            with self._lock:
                counts, total = list(self._counts), self.total
        buckets: list[list[float | int]] = []
        running = 0
        for bound, n in zip((*BOUNDS, math.inf), counts, strict=True):
            running += n
            buckets.append([bound, running])
        return {"buckets": buckets, "sum": total, "count": running}


class Latency:
    """The histograms of one engine: the primary tier's and one pair per secondary tier.

    Args:
        tier_names: the secondary tiers' names, by index (the engine's ``tiers``).

    :meth:`job`, ``lookup.observe`` and :meth:`snapshot` run under the engine's lock.

    Attributes:
        lookup, load, store: the primary tier's histograms.
        tiers: per secondary tier index, ``{"load": Histogram, "store": Histogram}``.
    """

    def __init__(self, tier_names: Sequence[str]) -> None:
        self.names = list(tier_names)
        self.lookup = Histogram()
        self.load = Histogram(threading.Lock())
        self.store = Histogram(threading.Lock())
        self.tiers: list[dict[str, Histogram]] = [{op: Histogram() for op in TIER_OPS} for _ in tier_names]

    def job(self, t: int, promotion: bool, seconds: float) -> None:
        """One finished job of secondary tier ``t`` (``promotion``: a load, else a store)."""
        self.tiers[t]["load" if promotion else "store"].observe(seconds)

    def snapshot(self) -> dict[str, dict[str, dict[str, Any]]]:
        """What ``stats()["latency"]`` holds (see the module docstring)."""
        out = {"primary": {op: getattr(self, op).snapshot() for op in PRIMARY_OPS}}
        for name, ops in zip(self.names, self.tiers, strict=True):
            out[name] = {op: h.snapshot() for op, h in ops.items()}
        return out

    def primary_io(self) -> dict[str, float | int]:
        """The primary tier's ``read_seconds``/``read_jobs`` (loads, primary -> caller) and
        ``write_seconds``/``write_jobs`` (stores), only for directions timed at least once: an
        engine whose bytes are moved by someone else (``prepare_store`` + a direct write) does not
        report a constant 0 that would read as infinitely fast."""
        out: dict[str, float | int] = {}
        for direction, h in (("read", self.load), ("write", self.store)):
            if h.count:
                out[f"{direction}_seconds"] = h.total
                out[f"{direction}_jobs"] = h.count
        return out
