"""Prometheus metrics for an engine and every tier behind it.

The engine never imports this module: metrics are read from ``engine.stats()`` at scrape time by a
custom collector, so the exported counters are the engine's own counters (no second count that could
drift, no cost on the hot path), and ``replay`` reports and Prometheus agree by construction.
``prometheus_client`` is imported only when a collector or exporter is created (extra ``cli``).

Exported families (``tier`` is ``"primary"`` or a secondary tier's name):

=========================================  =======  ==============================================
name                                        type     labels / meaning
=========================================  =======  ==============================================
``kvtier_lookups_total``                   counter  block keys looked up in the engine
``kvtier_tier_lookups_total``              counter  ``tier``: keys asked of that tier
``kvtier_hits_total``                      counter  ``tier``: keys found in that tier
``kvtier_bytes_total``                     counter  ``tier``, ``direction`` = ``read`` (tier →
                                                    primary) or ``write`` (primary → tier)
``kvtier_transfer_seconds_total``          counter  ``tier``, ``direction``: time spent in jobs
``kvtier_evictions_total``                 counter  ``tier``
``kvtier_corrupt_blocks_total``            counter  ``tier``: blocks that failed verification
``kvtier_dropped_stores_total``            counter  ``tier``: stores given up (full, pinned, error)
``kvtier_failed_jobs_total``               counter  ``tier``
``kvtier_inflight_jobs``                   gauge    ``tier`` (or ``all``): submitted, not reported
``kvtier_primary_resident_blocks``         gauge    blocks held in the primary tier
``kvtier_primary_slots``                   gauge    primary tier capacity in blocks
=========================================  =======  ==============================================

Start an exporter with :func:`start_exporter` (``kvtier serve --metrics-port``, ``kvtier replay
--metrics-port``, or config ``metrics_port`` via :func:`exporter_from_config`). It binds 127.0.0.1
unless told otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from kvtier.errors import KvtierError

if TYPE_CHECKING:
    from kvtier.config import KvtierConfig

__all__ = [
    "EngineCollector",
    "MetricsExporter",
    "StatsSource",
    "exporter_from_config",
    "start_exporter",
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


def _inflight(stats: Mapping[str, Any]) -> dict[str, float]:
    raw = stats.get("inflight_jobs", stats.get("jobs_inflight", stats.get("in_flight_jobs")))
    if isinstance(raw, Mapping):
        return {str(k): _num(v) for k, v in raw.items()}
    if raw is not None:
        return {"all": _num(raw)}
    out: dict[str, float] = {}
    tiers = stats.get("tiers", {})
    if isinstance(tiers, Mapping):
        for name, t in tiers.items():
            if isinstance(t, Mapping) and ("inflight_jobs" in t or "in_flight_jobs" in t):
                out[str(name)] = _first(t, "inflight_jobs", "in_flight_jobs")
    return out


def _require_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - installed with the metrics extra
        raise KvtierError("metrics need prometheus_client: pip install 'kvtier[metrics]'") from exc
    return prometheus_client


class EngineCollector:
    """A ``prometheus_client`` collector reading ``stats()`` of one engine at each scrape.

    ``const_labels`` are added to every sample (e.g. ``{"instance": "replay"}``). A stats call that
    raises yields no samples for that scrape (a cache never breaks its scraper).
    """

    def __init__(self, source: StatsSource | StatsFn, const_labels: Mapping[str, str] | None = None) -> None:
        self._stats: StatsFn = source.stats if hasattr(source, "stats") else source
        self._labels = dict(const_labels or {})

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

        lookups = fams.CounterMetricFamily("kvtier_lookups", "Block keys looked up in the engine", labels=ln)
        lookups.add_metric(lv, _num(stats.get("lookups")))
        yield lookups

        def per_tier(name: str, doc: str, key: str) -> Any:
            fam = fams.CounterMetricFamily(name, doc, labels=[*ln, "tier"])
            for tier, c in tiers.items():
                fam.add_metric([*lv, tier], c[key])
            return fam

        yield per_tier("kvtier_tier_lookups", "Keys asked of each tier", "lookups")
        yield per_tier("kvtier_hits", "Keys found in each tier", "hits")
        yield per_tier("kvtier_evictions", "Blocks evicted from each tier", "evictions")
        yield per_tier("kvtier_corrupt_blocks", "Blocks that failed verification", "corrupt")
        yield per_tier("kvtier_dropped_stores", "Stores given up", "dropped_stores")
        yield per_tier("kvtier_failed_jobs", "Transfer jobs that failed", "failed_jobs")

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
            secs.add_metric([*lv, tier, "read"], c["read_seconds"])
            secs.add_metric([*lv, tier, "write"], c["write_seconds"])
        yield nbytes
        yield secs

        inflight = fams.GaugeMetricFamily(
            "kvtier_inflight_jobs", "Transfer jobs submitted and not yet reported", labels=[*ln, "tier"]
        )
        for tier, v in _inflight(stats).items():
            inflight.add_metric([*lv, tier], v)
        yield inflight

        primary = stats.get("primary", {})
        if isinstance(primary, Mapping):
            resident = fams.GaugeMetricFamily(
                "kvtier_primary_resident_blocks", "Blocks held in the primary tier", labels=ln
            )
            resident.add_metric(lv, _first(primary, "resident", "resident_blocks", "used_slots"))
            yield resident
            slots = fams.GaugeMetricFamily(
                "kvtier_primary_slots", "Primary tier capacity in blocks", labels=ln
            )
            slots.add_metric(lv, _first(primary, "num_slots", "slots", "capacity"))
            yield slots


class MetricsExporter:
    """An HTTP ``/metrics`` endpoint for one engine, on its own registry and thread.

    Use :func:`start_exporter`. ``port`` is the bound port (useful when started with port 0).
    ``close()`` stops the server; idempotent; also a context manager.
    """

    def __init__(self, source: StatsSource | StatsFn, port: int = 0, addr: str = "127.0.0.1",
                 const_labels: Mapping[str, str] | None = None) -> None:  # fmt: skip
        pc = _require_prometheus()
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
