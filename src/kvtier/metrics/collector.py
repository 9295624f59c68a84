"""The ``prometheus_client`` collector: :data:`~kvtier.metrics.families.FAMILIES` read from an
engine's ``stats()`` at each scrape (no second count, nothing on the hot path)."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from kvtier.errors import KvtierError
from kvtier.metrics.families import BY_NAME, FAMILIES, SCALAR_FAMILIES, SECONDARY_FAMILIES, Family

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


def _num(value: Any) -> float:
    """A counter value from a stats entry; missing or non-numeric values read as 0."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return 0.0


def _first(d: Mapping[str, Any], *names: str) -> float:
    for n in names:
        if n in d:
            return _num(d[n])
    return 0.0


def tier_counters(stats: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per-tier counters from an ``engine.stats()`` snapshot, keyed by tier name.

    The primary tier is ``"primary"``; its counters come from ``stats["primary"]`` with the engine's
    top-level totals as fallback (``evictions``, ``dropped_stores``). Every tier gets the same keys:
    ``lookups, hits, bytes_read, bytes_written, read_seconds, write_seconds, evictions, corrupt,
    dropped_stores, failed_jobs``. ``replay`` builds its per-tier report from this same function.
    """
    out: dict[str, dict[str, float]] = {}
    primary = stats.get("primary", {})
    if not isinstance(primary, Mapping):
        primary = {}
    out["primary"] = {
        "lookups": _first(primary, "lookups") or _num(stats.get("lookups")),
        "hits": _first(primary, "hits") or _num(stats.get("hits")),
        # Primary "read" = blocks copied out to the inference engine (loads), "write" = stored in.
        "bytes_read": _first(primary, "bytes_read") or _num(stats.get("bytes_loaded")),
        "bytes_written": _first(primary, "bytes_written") or _num(stats.get("bytes_stored")),
        "read_seconds": _first(primary, "read_seconds", "load_seconds"),
        "write_seconds": _first(primary, "write_seconds", "store_seconds"),
        "evictions": _first(primary, "evictions") or _num(stats.get("evictions")),
        "corrupt": _first(primary, "corrupt"),
        "dropped_stores": _first(primary, "dropped_stores") or _num(stats.get("dropped_stores")),
        "failed_jobs": _first(primary, "failed_jobs"),
    }
    tiers = stats.get("tiers", {})
    if isinstance(tiers, Mapping):
        for name, t in tiers.items():
            if not isinstance(t, Mapping):
                continue
            out[str(name)] = {
                "lookups": _first(t, "lookups"),
                "hits": _first(t, "hits"),
                "bytes_read": _first(t, "bytes_read"),
                "bytes_written": _first(t, "bytes_written"),
                "read_seconds": _first(t, "read_seconds", "load_seconds"),
                "write_seconds": _first(t, "write_seconds", "store_seconds"),
                "evictions": _first(t, "evictions"),
                "corrupt": _first(t, "corrupt"),
                "dropped_stores": _first(t, "dropped_stores"),
                "failed_jobs": _first(t, "failed_jobs"),
            }
    return out


def _tier_gauge(t: Mapping[str, Any], *names: str) -> float | None:
    """The first of ``names`` present in a tier's stats, else ``None`` (the series is left out)."""
    for n in names:
        if n in t:
            return _num(t[n])
    return None


def _secondary(stats: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    tiers = stats.get("tiers", {})
    if not isinstance(tiers, Mapping):
        return {}
    return {str(k): v for k, v in tiers.items() if isinstance(v, Mapping)}


def _histograms(stats: Mapping[str, Any]) -> Iterator[tuple[str, str, list[tuple[str, float]], float]]:
    """``(tier, operation, cumulative buckets, sum)`` from ``stats["latency"]``.

    The engine reports ``latency = {tier: {operation: {"buckets": [[upper_bound_seconds,
    cumulative_count], ...], "sum": seconds, "count": n}}}``; the ``+Inf`` bucket is ``count``. A
    malformed entry is skipped (a scrape never fails on one).
    """
    latency = stats.get("latency", {})
    if not isinstance(latency, Mapping):
        return
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


def _primary_bytes(primary: Mapping[str, Any]) -> tuple[float, float]:
    stride = _first(primary, "row_stride", "block_bytes")
    return _first(primary, "resident") * stride, _first(primary, "num_slots") * stride


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

    def _tier_max(self, name: str, t: Mapping[str, Any]) -> float | None:
        reported = _tier_gauge(t, "max_bytes")
        return reported if reported is not None else self._max_bytes.get(name)

    def describe(self) -> list[Any]:
        # Returning nothing keeps registration from calling stats() (the engine may not be ready).
        return []

    def collect(self) -> Iterator[Any]:
        """Every family of :data:`FAMILIES`, read from one ``stats()`` snapshot, in its order."""
        pc = require_prometheus()
        try:
            stats = self._stats()
        except Exception:
            return
        made = _Families(pc.metrics_core, self._labels)
        primary = stats.get("primary", {})
        primary = primary if isinstance(primary, Mapping) else {}
        out = {
            **self._engine_families(made, stats),
            **self._tier_families(made, stats, primary),
            **self._moved_families(made, stats, primary),
        }
        for fam in FAMILIES:
            yield out[fam.name]

    def _engine_families(self, made: _Families, stats: Mapping[str, Any]) -> dict[str, Any]:
        """The build info, the single-sample engine families and promotions by result."""
        from kvtier import __version__

        out = {
            "kvtier_build_info": made.family(
                BY_NAME["kvtier_build_info"], [(__version__, platform.python_version(), 1.0)]
            )
        }
        primary = stats.get("primary", {})
        for fam in SCALAR_FAMILIES:
            path = fam.fields[0].split(".")
            src = primary if path[0] == "primary" and isinstance(primary, Mapping) else stats
            out[fam.name] = made.family(fam, [(_num(src.get(path[-1])),)])
        promos = BY_NAME["kvtier_engine_promotions_total"]
        results = ("started", "failed", "rejected", "skipped_cost")
        out[promos.name] = made.family(
            promos, [(r, _num(stats.get(k))) for r, k in zip(results, promos.fields, strict=True)]
        )
        return out

    def _tier_families(
        self, made: _Families, stats: Mapping[str, Any], primary: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The per-tier counters and gauges (``tier`` label): primary and every secondary tier."""
        tiers = tier_counters(stats)
        secondary = _secondary(stats)
        out: dict[str, Any] = {}
        for name, key in (
            ("kvtier_tier_lookups_total", "lookups"), ("kvtier_hits_total", "hits"),
            ("kvtier_evictions_total", "evictions"), ("kvtier_corrupt_blocks_total", "corrupt"),
            ("kvtier_dropped_stores_total", "dropped_stores"), ("kvtier_failed_jobs_total", "failed_jobs"),
        ):  # fmt: skip
            out[name] = made.family(BY_NAME[name], [(tier, c[key]) for tier, c in tiers.items()])
        for fam in SECONDARY_FAMILIES:
            field = fam.fields[0].removeprefix("tiers.*.")
            out[fam.name] = made.per_tier(fam, {n: _tier_gauge(t, field) for n, t in secondary.items()})
        used, cap = _primary_bytes(primary)
        gauges: dict[str, dict[str, float | None]] = {
            "kvtier_inflight_jobs": {"primary": _tier_gauge(primary, "inflight_jobs")}
            | {n: _tier_gauge(t, "inflight_jobs") for n, t in secondary.items()},
            "kvtier_tier_used_bytes": {"primary": used if primary else None}
            | {n: _tier_gauge(t, "used_bytes") for n, t in secondary.items()},
            "kvtier_tier_max_bytes": {"primary": cap if primary else None}
            | {n: self._tier_max(n, t) for n, t in secondary.items()},
        }
        for name, values in gauges.items():
            out[name] = made.per_tier(BY_NAME[name], values)
        return out

    def _moved_families(
        self, made: _Families, stats: Mapping[str, Any], primary: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Bytes and job seconds per tier and direction, and the latency histograms."""
        secondary = _secondary(stats)
        nbytes: list[tuple[Any, ...]] = []
        secs: list[tuple[Any, ...]] = []
        for tier, c in tier_counters(stats).items():
            nbytes += [(tier, "read", c["bytes_read"]), (tier, "write", c["bytes_written"])]
            # Only where job times are reported: a constant 0 would read as "infinitely fast".
            raw = primary if tier == "primary" else secondary.get(tier, {})
            if _tier_gauge(raw, "read_seconds", "load_seconds") is not None:
                secs.append((tier, "read", c["read_seconds"]))
            if _tier_gauge(raw, "write_seconds", "store_seconds") is not None:
                secs.append((tier, "write", c["write_seconds"]))
        hist = BY_NAME["kvtier_operation_duration_seconds"]
        return {
            "kvtier_bytes_total": made.family(BY_NAME["kvtier_bytes_total"], nbytes),
            "kvtier_transfer_seconds_total": made.family(BY_NAME["kvtier_transfer_seconds_total"], secs),
            hist.name: made.family(hist, [(t, op, b, total) for t, op, b, total in _histograms(stats)]),
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
