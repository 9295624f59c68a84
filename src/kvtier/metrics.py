"""Prometheus metrics for an engine and every tier behind it.

The engine never imports this module: metrics are read from ``engine.stats()`` at scrape time by a
custom collector, so the exported counters are the engine's own counters (no second count that could
drift, no cost on the hot path), and ``replay`` reports and Prometheus agree by construction.
``prometheus_client`` is imported only when a collector or exporter is created (extra ``metrics``).

Exported families (``tier`` is ``"primary"`` or a secondary tier's name). :data:`FAMILIES` declares
them once (name, type, labels, help text and the ``stats()`` fields that feed each; :data:`METRICS`
is its (name, type, labels) view, and a test holds this table to it); a family whose source a tier
does not report has no samples but keeps its name, so dashboards and alerts never change.

==========================================  =========  ==============================================
name                                         type       labels / meaning
==========================================  =========  ==============================================
``kvtier_build_info``                        gauge      ``version``, ``python``: always 1
``kvtier_lookups_total``                    counter    block keys looked up in the engine
``kvtier_tier_lookups_total``               counter    ``tier``: keys asked of that tier
``kvtier_hits_total``                       counter    ``tier``: keys found in that tier
``kvtier_bytes_total``                      counter    ``tier``, ``direction`` = ``read`` (tier →
                                                       primary) or ``write`` (primary → tier)
``kvtier_transfer_seconds_total``           counter    ``tier``, ``direction``: time spent in jobs
                                                       (tiers whose job times the engine reports)
``kvtier_operation_duration_seconds``       histogram  ``tier``, ``operation``: latency of each
                                                       operation (from ``stats()["latency"]``)
``kvtier_evictions_total``                  counter    ``tier``
``kvtier_corrupt_blocks_total``             counter    ``tier``: blocks that failed verification
``kvtier_dropped_stores_total``             counter    ``tier``: stores given up (full, pinned, error)
``kvtier_failed_jobs_total``                counter    ``tier``
``kvtier_store_gate_state``                  gauge      ``tier``: back-pressure gate, 0 open, 1
                                                       throttled, 2 dropping (tiers with a gate)
``kvtier_store_gate_throttled_total``        counter    ``tier``: stores the gate refused (slow medium)
``kvtier_tier_errors_total``                counter    ``tier``: tier calls that raised (per tier)
``kvtier_promotions_total``                 counter    ``tier``: blocks promoted from that tier
``kvtier_inflight_jobs``                    gauge      ``tier``: jobs submitted, not reported
                                                       (primary: ``submit_*_kv`` copies)
``kvtier_tier_used_bytes``                  gauge      ``tier``: bytes held (primary: resident slots)
``kvtier_tier_max_bytes``                   gauge      ``tier``: capacity in bytes
``kvtier_primary_resident_blocks``          gauge      blocks held in the primary tier
``kvtier_primary_slots``                    gauge      primary tier capacity in blocks
``kvtier_engine_inflight_jobs``             gauge      all tier jobs in flight (admission budget)
``kvtier_engine_inflight_promotions``       gauge      promotion jobs in flight
``kvtier_engine_deferred_stores``           gauge      store jobs waiting for the in-flight budget
``kvtier_engine_throttled_stores_total``    counter    stores to tiers given up by the budget
``kvtier_engine_tier_errors_total``         counter    tier calls that raised, all tiers
``kvtier_engine_promotions_total``          counter    ``result`` = ``started``, ``failed``,
                                                       ``rejected`` (budget), ``skipped_cost``
==========================================  =========  ==============================================

Start an exporter with :func:`start_exporter` (``kvtier serve --metrics-port``, ``kvtier replay
--metrics-port``, or config ``metrics_port`` via :func:`exporter_from_config`). It binds 127.0.0.1
unless told otherwise. To add kvtier's families to a process's existing ``/metrics`` (vLLM's
serves ``prometheus_client.REGISTRY``), call :func:`register_collector` with that registry.
"""

from __future__ import annotations

import logging
import platform
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kvtier.errors import KvtierError
from kvtier.netaddr import warn_if_exposed

if TYPE_CHECKING:
    from kvtier.config import KvtierConfig

__all__ = [
    "FAMILIES",
    "METRICS",
    "EngineCollector",
    "Family",
    "MetricsExporter",
    "StatsSource",
    "exporter_from_config",
    "register_collector",
    "start_exporter",
    "tier_counters",
]

log = logging.getLogger("kvtier.metrics")


@dataclass(frozen=True, slots=True)
class Family:
    """One exported family, declared once: what :meth:`EngineCollector.collect` yields and the
    documentation, dashboard and tests check.

    ``name`` is the name as exposed (counters end in ``_total``); ``labels`` are those besides the
    const labels; ``fields`` are the ``engine.stats()`` entries that feed it, as dotted paths where
    ``tiers.*`` is every secondary tier's entry (``tests/unit/test_metrics_exposition.py`` checks
    that a real engine reports every one).
    """

    name: str
    kind: str
    labels: tuple[str, ...]
    doc: str
    fields: tuple[str, ...] = ()

    @property
    def base(self) -> str:
        """The name ``prometheus_client`` families take (without a counter's ``_total``)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


#: Every exported family, in exposition order.
FAMILIES: tuple[Family, ...] = (
    Family(
        "kvtier_build_info", "gauge", ("version", "python"), "kvtier version and Python version (always 1)"
    ),
    Family("kvtier_lookups_total", "counter", (), "Block keys looked up in the engine", ("lookups",)),
    Family(
        "kvtier_tier_lookups_total",
        "counter",
        ("tier",),
        "Keys asked of each tier",
        ("lookups", "tiers.*.lookups"),
    ),
    Family("kvtier_hits_total", "counter", ("tier",), "Keys found in each tier", ("hits", "tiers.*.hits")),
    Family(
        "kvtier_bytes_total",
        "counter",
        ("tier", "direction"),
        "Bytes moved per tier and direction",
        ("bytes_loaded", "bytes_stored", "tiers.*.bytes_read", "tiers.*.bytes_written"),
    ),
    Family(
        "kvtier_transfer_seconds_total",
        "counter",
        ("tier", "direction"),
        "Seconds spent in transfer jobs per tier and direction",
        ("tiers.*.read_seconds", "tiers.*.write_seconds"),
    ),
    Family(
        "kvtier_operation_duration_seconds",
        "histogram",
        ("tier", "operation"),
        "Latency of each operation per tier",
        ("latency",),
    ),
    Family(
        "kvtier_evictions_total",
        "counter",
        ("tier",),
        "Blocks evicted from each tier",
        ("evictions", "tiers.*.evictions"),
    ),
    Family(
        "kvtier_corrupt_blocks_total",
        "counter",
        ("tier",),
        "Blocks that failed verification",
        ("tiers.*.corrupt",),
    ),
    Family(
        "kvtier_dropped_stores_total",
        "counter",
        ("tier",),
        "Stores given up",
        ("dropped_stores", "tiers.*.dropped_stores"),
    ),
    Family(
        "kvtier_failed_jobs_total",
        "counter",
        ("tier",),
        "Transfer jobs that failed",
        ("tiers.*.failed_jobs",),
    ),
    Family(
        "kvtier_store_gate_state",
        "gauge",
        ("tier",),
        "Store back-pressure gate of each tier: 0 open, 1 throttled, 2 dropping",
        ("tiers.*.gate_state",),
    ),
    Family(
        "kvtier_store_gate_throttled_total",
        "counter",
        ("tier",),
        "Stores refused by each tier's back-pressure gate (store latency over its marks)",
        ("tiers.*.gate_throttled",),
    ),
    Family(
        "kvtier_tier_errors_total",
        "counter",
        ("tier",),
        "Tier calls that raised (each answered as a miss)",
        ("tiers.*.errors",),
    ),
    Family(
        "kvtier_promotions_total",
        "counter",
        ("tier",),
        "Blocks promoted into the primary tier from each tier",
        ("tiers.*.promotions",),
    ),
    Family(
        "kvtier_inflight_jobs",
        "gauge",
        ("tier",),
        "Transfer jobs submitted to each tier and not yet reported",
        ("primary.inflight_jobs", "tiers.*.inflight_jobs"),
    ),
    Family(
        "kvtier_tier_used_bytes",
        "gauge",
        ("tier",),
        "Bytes held by each tier (primary: resident slots x row stride)",
        ("primary.resident", "primary.row_stride", "tiers.*.used_bytes"),
    ),
    Family(
        "kvtier_tier_max_bytes",
        "gauge",
        ("tier",),
        "Capacity of each tier in bytes",
        ("primary.num_slots", "primary.row_stride", "tiers.*.max_bytes"),
    ),
    Family(
        "kvtier_primary_resident_blocks",
        "gauge",
        (),
        "Blocks held in the primary tier",
        ("primary.resident",),
    ),
    Family("kvtier_primary_slots", "gauge", (), "Primary tier capacity in blocks", ("primary.num_slots",)),
    Family(
        "kvtier_engine_inflight_jobs",
        "gauge",
        (),
        "Tier jobs in flight, all tiers (the admission budget)",
        ("jobs_inflight",),
    ),
    Family(
        "kvtier_engine_inflight_promotions", "gauge", (), "Promotion jobs in flight", ("promotions_inflight",)
    ),
    Family(
        "kvtier_engine_deferred_stores",
        "gauge",
        (),
        "Store jobs waiting for the in-flight budget",
        ("deferred_stores",),
    ),
    Family(
        "kvtier_engine_throttled_stores_total",
        "counter",
        (),
        "Blocks whose tier store the job budget gave up",
        ("tier_stores_dropped",),
    ),
    Family(
        "kvtier_engine_tier_errors_total",
        "counter",
        (),
        "Tier calls that raised, all tiers",
        ("tier_errors",),
    ),
    Family(
        "kvtier_engine_promotions_total",
        "counter",
        ("result",),
        "Promotions by result",
        ("promotions", "promotions_failed", "promotions_rejected", "promotions_skipped_cost"),
    ),
)

#: The engine-wide single-sample families: read straight from their one field.
_SCALARS = tuple(f for f in FAMILIES if not f.labels and len(f.fields) == 1)
#: Per-tier families of secondary tiers only, each read from its one ``tiers.*`` field.
_SECONDARY_ONLY = tuple(
    f for f in FAMILIES if f.labels == ("tier",) and len(f.fields) == 1 and f.fields[0].startswith("tiers.*.")
)
_BY_NAME = {f.name: f for f in FAMILIES}

#: Every exported family: (name as exposed, type, labels besides const labels). Final names.
METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = tuple((f.name, f.kind, f.labels) for f in FAMILIES)

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


def _require_prometheus() -> Any:
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
        pc = _require_prometheus()
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
                _BY_NAME["kvtier_build_info"], [(__version__, platform.python_version(), 1.0)]
            )
        }
        primary = stats.get("primary", {})
        for fam in _SCALARS:
            path = fam.fields[0].split(".")
            src = primary if path[0] == "primary" and isinstance(primary, Mapping) else stats
            out[fam.name] = made.family(fam, [(_num(src.get(path[-1])),)])
        promos = _BY_NAME["kvtier_engine_promotions_total"]
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
            out[name] = made.family(_BY_NAME[name], [(tier, c[key]) for tier, c in tiers.items()])
        for fam in _SECONDARY_ONLY:
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
            out[name] = made.per_tier(_BY_NAME[name], values)
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
        hist = _BY_NAME["kvtier_operation_duration_seconds"]
        return {
            "kvtier_bytes_total": made.family(_BY_NAME["kvtier_bytes_total"], nbytes),
            "kvtier_transfer_seconds_total": made.family(_BY_NAME["kvtier_transfer_seconds_total"], secs),
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
    pc = _require_prometheus()
    collector = EngineCollector(source, const_labels)
    (pc.REGISTRY if registry is None else registry).register(collector)
    return collector


class MetricsExporter:
    """An HTTP ``/metrics`` endpoint for one engine, on its own registry and thread.

    Use :func:`start_exporter`. ``port`` is the bound port (useful when started with port 0).
    ``close()`` stops the server; idempotent; also a context manager.
    """

    def __init__(self, source: StatsSource | StatsFn, port: int = 0, addr: str = "127.0.0.1",
                 const_labels: Mapping[str, str] | None = None) -> None:  # fmt: skip
        pc = _require_prometheus()
        warn_if_exposed(
            log, "the metrics exporter", addr,
            "anyone on the network can read this engine's /metrics (use 127.0.0.1 unless intended)",
        )  # fmt: skip
        self.registry = pc.CollectorRegistry(auto_describe=False)
        self.collector = EngineCollector(source, const_labels)
        self.registry.register(self.collector)
        try:
            self._server, self._thread = pc.start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise KvtierError(
                f"metrics_port: cannot listen on {addr}:{port} ({exc.strerror or exc}); pick a free port or 0"
            ) from exc
        self.addr = addr
        self.port: int = int(self._server.server_port)
        self._closed = False
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_exporter(
    source: StatsSource | StatsFn,
    port: int = 0,
    addr: str = "127.0.0.1",
    const_labels: Mapping[str, str] | None = None,
) -> MetricsExporter:
    """Serve ``source``'s metrics on ``http://addr:port/metrics`` (port 0 picks a free port)."""
    return MetricsExporter(source, port, addr, const_labels)


def exporter_from_config(source: StatsSource | StatsFn, config: KvtierConfig) -> MetricsExporter | None:
    """Start an exporter on ``config.metrics_port`` (127.0.0.1) if it is set, else return ``None``.

    The engine (or any owner of one) calls this after construction and closes the result with it.
    """
    if config.metrics_port is None:
        return None
    return start_exporter(source, config.metrics_port)
