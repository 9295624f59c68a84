"""The ``prometheus_client`` collector: :data:`~kvtier.metrics.families.FAMILIES` read from an
engine's ``stats()`` at each scrape (no second count, nothing on the hot path)."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from kvtier.errors import KvtierError
from kvtier.metrics.families import (
    BY_NAME,
    FAMILIES,
    ROOT_FAMILIES,
    SCALAR_FAMILIES,
    SECONDARY_FAMILIES,
    Family,
)  # fmt: skip
from kvtier.stats import EngineStats, PrimaryStats, TierReport

__all__ = [
    "EngineCollector",
    "StatsFn",
    "StatsSource",
    "register_collector",
    "require_prometheus",
    "tier_counters",
]

StatsFn = Callable[[], Mapping[str, Any]]


class StatsSource(Protocol):
    """Anything with an engine-style ``stats()`` (the :class:`kvtier.engine.Engine`)."""

    def stats(self) -> Mapping[str, Any]: ...


def tier_counters(stats: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per-tier counters from an ``engine.stats()`` snapshot, keyed by tier name.

    The primary tier is ``"primary"``, read from the engine's totals (its lookups and hits are the
    engine's; "read" is bytes copied out to the inference engine, "write" bytes stored in). Every
    tier gets the same keys: ``lookups, hits, bytes_read, bytes_written, read_seconds,
    write_seconds, evictions, corrupt, dropped_stores, failed_jobs``. ``replay`` builds its per-tier
    report from this same function.
    """
    return _tier_counters(EngineStats.from_mapping(stats))


def _tier_counters(s: EngineStats) -> dict[str, dict[str, float]]:
    p = s.primary or PrimaryStats()
    out = {
        "primary": {
            "lookups": s.lookups, "hits": s.hits,
            "bytes_read": s.bytes_loaded, "bytes_written": s.bytes_stored,
            "read_seconds": p.read_seconds or 0.0, "write_seconds": p.write_seconds or 0.0,
            "evictions": s.evictions, "corrupt": 0.0, "dropped_stores": s.dropped_stores, "failed_jobs": 0.0,
        }
    }  # fmt: skip
    for name, t in s.tiers.items():
        out[name] = {
            "lookups": t.lookups, "hits": t.hits,
            "bytes_read": t.bytes_read, "bytes_written": t.bytes_written,
            "read_seconds": t.read_seconds or 0.0, "write_seconds": t.write_seconds or 0.0,
            "evictions": t.evictions, "corrupt": t.corrupt, "dropped_stores": t.dropped_stores,
            "failed_jobs": t.failed_jobs,
        }  # fmt: skip
    return out


def _histograms(latency: Mapping[str, Any]) -> Iterator[tuple[str, str, list[tuple[str, float]], float]]:
    """``(tier, operation, cumulative buckets, sum)`` from ``stats["latency"]``.

    The engine reports ``latency = {tier: {operation: {"buckets": [[upper_bound_seconds,
    cumulative_count], ...], "sum": seconds, "count": n}}}``; the ``+Inf`` bucket is ``count``. A
    malformed entry is skipped (a scrape never fails on one).
    """
    for tier, ops in latency.items():
        if not isinstance(ops, Mapping):
            continue
        for op, h in ops.items():
            if not isinstance(h, Mapping):
                continue
            try:
                bounds = sorted((float(le), float(n)) for le, n in h.get("buckets", []))
                count = float(h.get("count", bounds[-1][1] if bounds else 0))
                total = float(h.get("sum", 0.0))
            except (TypeError, ValueError, IndexError):
                continue
            buckets = [(repr(le), n) for le, n in bounds if le != float("inf")]
            buckets.append(("+Inf", count))
            yield str(tier), str(op), buckets, total


def require_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - installed with the metrics extra
        raise KvtierError("metrics need prometheus_client: pip install 'kvtier[metrics]'") from exc
    return prometheus_client


class EngineCollector:
    """A ``prometheus_client`` collector reading ``stats()`` of one engine at each scrape.

    ``const_labels`` are added to every sample (e.g. ``{"instance": "replay"}``). A stats call that
    raises yields no samples for that scrape (a cache never breaks its scraper). Tier capacities the
    stats do not carry (``max_bytes``) are read once from each tier's ``config_info()`` when the
    source is an engine with ``tiers``.
    """

    def __init__(self, source: StatsSource | StatsFn, const_labels: Mapping[str, str] | None = None) -> None:
        self._stats: StatsFn = source.stats if hasattr(source, "stats") else source
        self._labels = dict(const_labels or {})
        self._max_bytes: dict[str, float] = {}
        for tier in getattr(source, "tiers", None) or []:
            try:
                info = tier.config_info()
                if isinstance(info.get("max_bytes"), int | float):
                    self._max_bytes[str(tier.name)] = float(info["max_bytes"])
            except Exception:
                continue  # a tier without config_info simply has no max_bytes series

    def _tier_max(self, name: str, t: TierReport) -> float | None:
        return t.max_bytes if t.max_bytes is not None else self._max_bytes.get(name)

    def describe(self) -> list[Any]:
        # Returning nothing keeps registration from calling stats() (the engine may not be ready).
        return []

    def collect(self) -> Iterator[Any]:
        """Every family of :data:`FAMILIES`, read from one ``stats()`` snapshot, in its order."""
        pc = require_prometheus()
        try:
            stats = EngineStats.from_mapping(self._stats())
        except Exception:
            return
        made = _Families(pc.metrics_core, self._labels)
        out = {
            **self._engine_families(made, stats),
            **self._tier_families(made, stats),
            **_moved(made, stats),
        }
        for fam in FAMILIES:
            yield out[fam.name]

    def _engine_families(self, made: _Families, s: EngineStats) -> dict[str, Any]:
        """The build info, the single-sample engine families and promotions by result."""
        from kvtier import __version__

        build = BY_NAME["kvtier_build_info"]
        out = {build.name: made.family(build, [(__version__, platform.python_version(), 1.0)])}
        for fam in SCALAR_FAMILIES:
            owner, _, name = fam.fields[0].rpartition(".")
            src: Any = (s.primary or PrimaryStats()) if owner == "primary" else s
            out[fam.name] = made.family(fam, [(getattr(src, name),)])
        promos = BY_NAME["kvtier_engine_promotions_total"]
        results = ("started", "failed", "rejected", "skipped_cost")
        out[promos.name] = made.family(
            promos, [(r, getattr(s, k)) for r, k in zip(results, promos.fields, strict=True)]
        )
        return out

    def _tier_families(self, made: _Families, s: EngineStats) -> dict[str, Any]:
        """The per-tier counters and gauges (``tier`` label): primary and every secondary tier."""
        tiers = _tier_counters(s)
        out: dict[str, Any] = {}
        for name, key in (
            ("kvtier_tier_lookups_total", "lookups"), ("kvtier_hits_total", "hits"),
            ("kvtier_evictions_total", "evictions"), ("kvtier_corrupt_blocks_total", "corrupt"),
            ("kvtier_dropped_stores_total", "dropped_stores"), ("kvtier_failed_jobs_total", "failed_jobs"),
        ):  # fmt: skip
            out[name] = made.family(BY_NAME[name], [(tier, c[key]) for tier, c in tiers.items()])
        for fam in SECONDARY_FAMILIES:
            if fam.name in out:
                continue  # already built above with the primary tier's sample (corrupt, failed jobs)
            field = fam.fields[0].removeprefix("tiers.*.")
            out[fam.name] = made.per_tier(fam, {n: getattr(t, field) for n, t in s.tiers.items()})
        p = s.primary
        gauges: dict[str, dict[str, float | None]] = {
            "kvtier_inflight_jobs": {"primary": p.inflight_jobs if p else None}
            | {n: t.inflight_jobs for n, t in s.tiers.items()},
            "kvtier_tier_used_bytes": {"primary": p.resident * p.row_stride if p else None}
            | {n: t.used_bytes for n, t in s.tiers.items()},
            "kvtier_tier_max_bytes": {"primary": p.num_slots * p.row_stride if p else None}
            | {n: self._tier_max(n, t) for n, t in s.tiers.items()},
        }
        for name, values in gauges.items():
            out[name] = made.per_tier(BY_NAME[name], values)
        for fam, stat in ROOT_FAMILIES:
            samples = [
                (tier, root, values[stat])
                for tier, t in s.tiers.items()
                for root, values in t.roots.items()
                if stat in values
            ]
            out[fam.name] = made.family(fam, samples)
        return out


def _moved(made: _Families, s: EngineStats) -> dict[str, Any]:
    """Bytes and job seconds per tier and direction, and the latency histograms."""
    nbytes: list[tuple[Any, ...]] = []
    secs: list[tuple[Any, ...]] = []
    for tier, c in _tier_counters(s).items():
        nbytes += [(tier, "read", c["bytes_read"]), (tier, "write", c["bytes_written"])]
        # Only where job times are reported: a constant 0 would read as "infinitely fast".
        timed = s.primary if tier == "primary" else s.tiers[tier]
        if timed is not None and timed.read_seconds is not None:
            secs.append((tier, "read", c["read_seconds"]))
        if timed is not None and timed.write_seconds is not None:
            secs.append((tier, "write", c["write_seconds"]))
    hist = BY_NAME["kvtier_operation_duration_seconds"]
    return {
        "kvtier_bytes_total": made.family(BY_NAME["kvtier_bytes_total"], nbytes),
        "kvtier_transfer_seconds_total": made.family(BY_NAME["kvtier_transfer_seconds_total"], secs),
        hist.name: made.family(hist, list(_histograms(s.latency))),
    }


class _Families:
    """Builds ``prometheus_client`` families of :data:`FAMILIES` entries with the const labels."""

    def __init__(self, core: Any, const_labels: Mapping[str, str]) -> None:
        self.core = core
        self.names = list(const_labels)
        self.values = list(const_labels.values())

    def family(self, fam: Family, samples: list[tuple[Any, ...]]) -> Any:
        """``fam`` with one sample per tuple: its label values, then the value (a histogram: its
        cumulative buckets and sum)."""
        cls = {
            "counter": self.core.CounterMetricFamily,
            "gauge": self.core.GaugeMetricFamily,
            "histogram": self.core.HistogramMetricFamily,
        }[fam.kind]
        out = cls(fam.base, fam.doc, labels=[*self.names, *fam.labels])
        n = len(fam.labels)
        for sample in samples:
            out.add_metric([*self.values, *sample[:n]], *sample[n:])
        return out

    def per_tier(self, fam: Family, values: Mapping[str, float | None]) -> Any:
        """``fam`` with one sample per tier whose value is known (``None``: no series)."""
        return self.family(fam, [(tier, v) for tier, v in values.items() if v is not None])


def register_collector(
    source: StatsSource | StatsFn, registry: Any = None, const_labels: Mapping[str, str] | None = None
) -> EngineCollector:
    """Add ``source``'s families to ``registry`` (default: ``prometheus_client.REGISTRY``).

    For a process that already serves ``/metrics`` — vLLM's API server serves the default
    registry — this puts kvtier's series next to the host's without a second port. Unregister with
    ``registry.unregister(collector)`` before the engine closes. Names never collide with another
    collector's (every name starts with ``kvtier_``).
    """
    pc = require_prometheus()
    collector = EngineCollector(source, const_labels)
    (pc.REGISTRY if registry is None else registry).register(collector)
    return collector
