"""Prometheus metrics for an engine and every tier behind it.

The engine never imports this module: metrics are read from ``engine.stats()`` at scrape time by a
custom collector, so the exported counters are the engine's own counters (no second count that could
drift, no cost on the hot path), and ``replay`` reports and Prometheus agree by construction.
``prometheus_client`` is imported only when a collector or exporter is created (extra ``metrics``).

Exported families (``tier`` is ``"primary"`` or a secondary tier's name). :data:`METRICS` lists them
(name, type, labels); a family whose source the engine does not report has no samples but keeps its
name, so dashboards and alerts never change when the engine starts reporting it.

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
``kvtier_root_used_bytes``                  gauge      ``tier``, ``root``: bytes on each disk of a
                                                       tier over several roots (fs ``root_dirs``)
``kvtier_root_max_bytes``                   gauge      ``tier``, ``root``: each root's limit
``kvtier_root_fenced``                      gauge      ``tier``, ``root``: 1 while fenced (failed)
``kvtier_root_errors_total``                counter    ``tier``, ``root``: failed jobs counted
``kvtier_root_timeouts_total``              counter    ``tier``, ``root``: jobs past their deadline
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
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from kvtier.errors import KvtierError
from kvtier.netaddr import warn_if_exposed

if TYPE_CHECKING:
    from kvtier.config import KvtierConfig

__all__ = [
    "METRICS",
    "EngineCollector",
    "MetricsExporter",
    "StatsSource",
    "exporter_from_config",
    "register_collector",
    "start_exporter",
    "tier_counters",
]

log = logging.getLogger("kvtier.metrics")

#: Every exported family: (name as exposed, type, labels besides const labels). Final names.
METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("kvtier_build_info", "gauge", ("version", "python")),
    ("kvtier_lookups_total", "counter", ()),
    ("kvtier_tier_lookups_total", "counter", ("tier",)),
    ("kvtier_hits_total", "counter", ("tier",)),
    ("kvtier_bytes_total", "counter", ("tier", "direction")),
    ("kvtier_transfer_seconds_total", "counter", ("tier", "direction")),
    ("kvtier_operation_duration_seconds", "histogram", ("tier", "operation")),
    ("kvtier_evictions_total", "counter", ("tier",)),
    ("kvtier_corrupt_blocks_total", "counter", ("tier",)),
    ("kvtier_dropped_stores_total", "counter", ("tier",)),
    ("kvtier_failed_jobs_total", "counter", ("tier",)),
    ("kvtier_store_gate_state", "gauge", ("tier",)),
    ("kvtier_store_gate_throttled_total", "counter", ("tier",)),
    ("kvtier_tier_errors_total", "counter", ("tier",)),
    ("kvtier_promotions_total", "counter", ("tier",)),
    ("kvtier_inflight_jobs", "gauge", ("tier",)),
    ("kvtier_tier_used_bytes", "gauge", ("tier",)),
    ("kvtier_tier_max_bytes", "gauge", ("tier",)),
    ("kvtier_root_used_bytes", "gauge", ("tier", "root")),
    ("kvtier_root_max_bytes", "gauge", ("tier", "root")),
    ("kvtier_root_fenced", "gauge", ("tier", "root")),
    ("kvtier_root_errors_total", "counter", ("tier", "root")),
    ("kvtier_root_timeouts_total", "counter", ("tier", "root")),
    ("kvtier_primary_resident_blocks", "gauge", ()),
    ("kvtier_primary_slots", "gauge", ()),
    ("kvtier_engine_inflight_jobs", "gauge", ()),
    ("kvtier_engine_inflight_promotions", "gauge", ()),
    ("kvtier_engine_deferred_stores", "gauge", ()),
    ("kvtier_engine_throttled_stores_total", "counter", ()),
    ("kvtier_engine_tier_errors_total", "counter", ()),
    ("kvtier_engine_promotions_total", "counter", ("result",)),
)

StatsFn = Callable[[], Mapping[str, Any]]

#: (type, name, ``root<N>_`` stat, help) of the per-root families.
_ROOT_FAMILIES = (
    ("gauge", "kvtier_root_used_bytes", "used_bytes", "Bytes held on each root (disk) of a tier"),
    ("gauge", "kvtier_root_max_bytes", "max_bytes", "Capacity of each root of a tier in bytes"),
    ("gauge", "kvtier_root_fenced", "fenced", "1 while a root is fenced (failed: its blocks are misses)"),
    ("counter", "kvtier_root_errors", "errors", "Failed jobs counted against each root"),
    ("counter", "kvtier_root_timeouts", "timeouts", "Jobs past their deadline on each root (stalls)"),
)
_ROOT_STAT = re.compile(r"root(\d+)_(\w+)")


def _per_root(t: Mapping[str, Any], stat: str) -> Iterator[tuple[str, float]]:
    """``(root index, value)`` of a tier's ``root<N>_<stat>`` entries."""
    for key, value in t.items():
        m = _ROOT_STAT.fullmatch(str(key))
        if m is not None and m.group(2) == stat:
            yield m.group(1), _num(value)


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
        reported = _tier_gauge(t, "max_bytes", "capacity_bytes")
        return reported if reported is not None else self._max_bytes.get(name)

    def describe(self) -> list[Any]:
        # Returning nothing keeps registration from calling stats() (the engine may not be ready).
        return []

    def collect(self) -> Iterator[Any]:
        pc = _require_prometheus()
        try:
            stats = self._stats()
        except Exception:
            return
        fams = pc.metrics_core
        ln = list(self._labels)
        lv = list(self._labels.values())
        tiers = tier_counters(stats)
        secondary = _secondary(stats)
        primary = stats.get("primary", {})
        primary = primary if isinstance(primary, Mapping) else {}

        from kvtier import __version__

        build = fams.GaugeMetricFamily(
            "kvtier_build_info",
            "kvtier version and Python version (always 1)",
            labels=[*ln, "version", "python"],
        )
        build.add_metric([*lv, __version__, platform.python_version()], 1.0)
        yield build

        def single(kind: str, name: str, doc: str, value: float) -> Any:
            cls = fams.CounterMetricFamily if kind == "counter" else fams.GaugeMetricFamily
            fam = cls(name, doc, labels=ln)
            fam.add_metric(lv, value)
            return fam

        yield single(
            "counter", "kvtier_lookups", "Block keys looked up in the engine", _num(stats.get("lookups"))
        )

        def per_tier(kind: str, name: str, doc: str, values: Mapping[str, float | None]) -> Any:
            cls = fams.CounterMetricFamily if kind == "counter" else fams.GaugeMetricFamily
            fam = cls(name, doc, labels=[*ln, "tier"])
            for tier, v in values.items():
                if v is not None:
                    fam.add_metric([*lv, tier], v)
            return fam

        def column(key: str) -> dict[str, float | None]:
            return {tier: c[key] for tier, c in tiers.items()}

        yield per_tier("counter", "kvtier_tier_lookups", "Keys asked of each tier", column("lookups"))
        yield per_tier("counter", "kvtier_hits", "Keys found in each tier", column("hits"))
        yield per_tier("counter", "kvtier_evictions", "Blocks evicted from each tier", column("evictions"))
        yield per_tier(
            "counter", "kvtier_corrupt_blocks", "Blocks that failed verification", column("corrupt")
        )
        yield per_tier("counter", "kvtier_dropped_stores", "Stores given up", column("dropped_stores"))
        yield per_tier("counter", "kvtier_failed_jobs", "Transfer jobs that failed", column("failed_jobs"))
        # Every I/O tier (AsyncTier) carries its StoreGate's counters; others have no series.
        yield per_tier(
            "gauge",
            "kvtier_store_gate_state",
            "Store back-pressure gate of each tier: 0 open, 1 throttled, 2 dropping",
            {n: _tier_gauge(t, "gate_state") for n, t in secondary.items()},
        )
        yield per_tier(
            "counter",
            "kvtier_store_gate_throttled",
            "Stores refused by each tier's back-pressure gate (store latency over its marks)",
            {n: _tier_gauge(t, "gate_throttled") for n, t in secondary.items()},
        )
        yield per_tier(
            "counter",
            "kvtier_tier_errors",
            "Tier calls that raised (each answered as a miss)",
            {n: _tier_gauge(t, "errors", "tier_errors") for n, t in secondary.items()},
        )
        yield per_tier(
            "counter",
            "kvtier_promotions",
            "Blocks promoted into the primary tier from each tier",
            {n: _tier_gauge(t, "promotions", "loads") for n, t in secondary.items()},
        )
        yield per_tier(
            "gauge",
            "kvtier_inflight_jobs",
            "Transfer jobs submitted to each tier and not yet reported",
            {"primary": _tier_gauge(primary, "inflight_jobs")}
            | {n: _tier_gauge(t, "inflight_jobs", "in_flight_jobs") for n, t in secondary.items()},
        )
        used, cap = _primary_bytes(primary)
        yield per_tier(
            "gauge",
            "kvtier_tier_used_bytes",
            "Bytes held by each tier (primary: resident slots x row stride)",
            {"primary": used if primary else None}
            | {n: _tier_gauge(t, "used_bytes", "index_bytes") for n, t in secondary.items()},
        )
        yield per_tier(
            "gauge",
            "kvtier_tier_max_bytes",
            "Capacity of each tier in bytes",
            {"primary": cap if primary else None} | {n: self._tier_max(n, t) for n, t in secondary.items()},
        )

        # Tiers over several disks report ``root<N>_<stat>`` (the fs tier's root_dirs).
        for kind, name, stat, doc in _ROOT_FAMILIES:
            cls = fams.CounterMetricFamily if kind == "counter" else fams.GaugeMetricFamily
            fam = cls(name, doc, labels=[*ln, "tier", "root"])
            for tier, t in secondary.items():
                for root, value in _per_root(t, stat):
                    fam.add_metric([*lv, tier, root], value)
            yield fam

        nbytes = fams.CounterMetricFamily(
            "kvtier_bytes", "Bytes moved per tier and direction", labels=[*ln, "tier", "direction"]
        )
        secs = fams.CounterMetricFamily(
            "kvtier_transfer_seconds",
            "Seconds spent in transfer jobs per tier and direction",
            labels=[*ln, "tier", "direction"],
        )
        for tier, c in tiers.items():
            nbytes.add_metric([*lv, tier, "read"], c["bytes_read"])
            nbytes.add_metric([*lv, tier, "write"], c["bytes_written"])
            # Only where job times are reported: a constant 0 would read as "infinitely fast".
            raw = primary if tier == "primary" else secondary.get(tier, {})
            if _tier_gauge(raw, "read_seconds", "load_seconds") is not None:
                secs.add_metric([*lv, tier, "read"], c["read_seconds"])
            if _tier_gauge(raw, "write_seconds", "store_seconds") is not None:
                secs.add_metric([*lv, tier, "write"], c["write_seconds"])
        yield nbytes
        yield secs

        hist = fams.HistogramMetricFamily(
            "kvtier_operation_duration_seconds",
            "Latency of each operation per tier",
            labels=[*ln, "tier", "operation"],
        )
        for tier, op, buckets, total in _histograms(stats):
            hist.add_metric([*lv, tier, op], buckets, total)
        yield hist

        yield single(
            "gauge", "kvtier_primary_resident_blocks", "Blocks held in the primary tier",
            _first(primary, "resident", "resident_blocks", "used_slots"),
        )  # fmt: skip
        yield single(
            "gauge", "kvtier_primary_slots", "Primary tier capacity in blocks",
            _first(primary, "num_slots", "slots", "capacity"),
        )  # fmt: skip
        yield single(
            "gauge", "kvtier_engine_inflight_jobs", "Tier jobs in flight, all tiers (the admission budget)",
            _num(stats.get("jobs_inflight", stats.get("inflight_jobs"))),
        )  # fmt: skip
        yield single(
            "gauge", "kvtier_engine_inflight_promotions", "Promotion jobs in flight",
            _num(stats.get("promotions_inflight")),
        )  # fmt: skip
        yield single(
            "gauge", "kvtier_engine_deferred_stores", "Store jobs waiting for the in-flight budget",
            _num(stats.get("deferred_stores")),
        )  # fmt: skip
        yield single(
            "counter", "kvtier_engine_throttled_stores", "Blocks whose tier store the job budget gave up",
            _num(stats.get("tier_stores_dropped")),
        )  # fmt: skip
        yield single(
            "counter", "kvtier_engine_tier_errors", "Tier calls that raised, all tiers",
            _num(stats.get("tier_errors")),
        )  # fmt: skip
        promos = fams.CounterMetricFamily(
            "kvtier_engine_promotions", "Promotions by result", labels=[*ln, "result"]
        )
        for result, key in (
            ("started", "promotions"),
            ("failed", "promotions_failed"),
            ("rejected", "promotions_rejected"),
            ("skipped_cost", "promotions_skipped_cost"),
        ):
            promos.add_metric([*lv, result], _num(stats.get(key)))
        yield promos


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
