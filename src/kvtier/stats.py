"""Typed views of ``Engine.stats()``: what the metrics exporter and the reports read, field by field.

``Engine.stats()`` stays a plain mapping (JSON-ready; vLLM's adapter, ``replay`` and ``kvtier serve``
print it). :meth:`EngineStats.from_mapping` reads it into these dataclasses, whose field names are
the mapping's keys, so a reader that names a field the engine does not report is a type error, not a
silent 0. Reading is tolerant, as a scrape must be: a missing or non-numeric counter reads as 0; a
gauge only some tiers report (``used_bytes``, ``gate_state``...) or a direction never timed
(``read_seconds``) reads as ``None``, and its series is left out rather than faked.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["EngineStats", "PrimaryStats", "TierReport"]

_D = TypeVar("_D")
_ROOT_STAT = re.compile(r"root(\d+)_(\w+)")


def _num(value: Any) -> float:
    """A number from a stats entry; anything else (missing, text, a mapping) reads as 0."""
    return float(value) if isinstance(value, int | float) else 0.0


def _roots(raw: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``{root index: {stat: value}}`` from a tier's ``root<N>_<stat>`` entries."""
    out: dict[str, dict[str, float]] = {}
    for key, value in raw.items():
        m = _ROOT_STAT.fullmatch(str(key))
        if m is not None:
            out.setdefault(m.group(1), {})[m.group(2)] = _num(value)
    return out


def _read(cls: type[_D], raw: Any) -> _D:
    """``cls`` from the mapping ``raw``: every numeric field by its name (see the module doc)."""
    raw = raw if isinstance(raw, Mapping) else {}
    values: dict[str, float | None] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.type not in ("float", "float | None"):  # nested views: the caller reads those
            continue
        if f.default is None:  # a gauge or a timing some sources do not report
            values[f.name] = _num(raw[f.name]) if f.name in raw else None
        else:
            values[f.name] = _num(raw.get(f.name))
    return cls(**values)


@dataclass(frozen=True, slots=True)
class PrimaryStats:
    """``stats()["primary"]``: slot counts (``Primary.counts``) and the timed copies."""

    num_slots: float = 0.0
    resident: float = 0.0
    free: float = 0.0
    writing: float = 0.0
    ready: float = 0.0
    flushing: float = 0.0
    pinned: float = 0.0
    row_stride: float = 0.0
    #: ``submit_*_kv`` copies queued or running (``None``: not reported, no series).
    inflight_jobs: float | None = None
    #: Seconds of copies out of (read) / into (write) the primary tier; ``None``: never timed.
    read_seconds: float | None = None
    write_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class TierReport:
    """``stats()["tiers"][name]``: the tier's own counters (``TierStats``) plus the engine's totals
    of it (``TierIo``), and the gauges only some tiers report."""

    lookups: float = 0.0
    hits: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    evictions: float = 0.0
    corrupt: float = 0.0
    dropped_stores: float = 0.0
    failed_jobs: float = 0.0
    promotions: float = 0.0
    #: Calls to the tier that raised (each answered as a miss).
    errors: float = 0.0
    inflight_jobs: float | None = None
    read_seconds: float | None = None
    write_seconds: float | None = None
    used_bytes: float | None = None
    max_bytes: float | None = None
    #: The store back-pressure gate of an I/O tier: 0 open, 1 throttled, 2 dropping.
    gate_state: float | None = None
    gate_throttled: float | None = None
    #: A tier over several disks (fs ``root_dirs``): ``{root index: {stat: value}}`` from its
    #: ``root<N>_<stat>`` entries (``used_bytes``, ``max_bytes``, ``fenced``, ``errors``, ``timeouts``).
    roots: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One ``Engine.stats()`` snapshot, typed (see the module doc)."""

    lookups: float = 0.0
    hits: float = 0.0
    evictions: float = 0.0
    dropped_stores: float = 0.0
    #: Bytes copied out of (loaded) / into (stored) the primary tier.
    bytes_loaded: float = 0.0
    bytes_stored: float = 0.0
    tier_errors: float = 0.0
    promotions: float = 0.0
    promotions_failed: float = 0.0
    promotions_rejected: float = 0.0
    promotions_skipped_cost: float = 0.0
    jobs_inflight: float = 0.0
    promotions_inflight: float = 0.0
    deferred_stores: float = 0.0
    tier_stores_dropped: float = 0.0
    #: ``None`` when the snapshot has no primary entry.
    primary: PrimaryStats | None = None
    tiers: dict[str, TierReport] = field(default_factory=dict)
    #: ``{tier: {operation: {"buckets", "sum", "count"}}}`` (``Latency.snapshot``), as reported.
    latency: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, stats: Mapping[str, Any]) -> EngineStats:
        """The typed view of ``stats`` (an ``Engine.stats()`` result; malformed parts read as empty)."""
        top = _read(cls, stats)
        primary = stats.get("primary")
        tiers = stats.get("tiers")
        latency = stats.get("latency")
        return dataclasses.replace(
            top,
            primary=_read(PrimaryStats, primary) if isinstance(primary, Mapping) else None,
            tiers={
                str(name): dataclasses.replace(_read(TierReport, t), roots=_roots(t))
                for name, t in (tiers.items() if isinstance(tiers, Mapping) else ())
                if isinstance(t, Mapping)
            },
            latency=latency if isinstance(latency, Mapping) else {},
        )
