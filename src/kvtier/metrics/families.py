"""The exported families, declared once (see :mod:`kvtier.metrics` for the table).

The collector builds exactly these, in this order, with this help text; the dashboard test, the
exposition tests and the docs table are held to it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BY_NAME", "FAMILIES", "METRICS", "ROOT_FAMILIES", "SCALAR_FAMILIES", "SECONDARY_FAMILIES", "Family",
]  # fmt: skip


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
    # Tiers over several disks report ``root<N>_<stat>`` (the fs tier's root_dirs): TierReport.roots.
    Family(
        "kvtier_root_used_bytes",
        "gauge",
        ("tier", "root"),
        "Bytes held on each root (disk) of a tier",
        ("tiers.*.roots",),
    ),
    Family(
        "kvtier_root_max_bytes",
        "gauge",
        ("tier", "root"),
        "Capacity of each root of a tier in bytes",
        ("tiers.*.roots",),
    ),
    Family(
        "kvtier_root_fenced",
        "gauge",
        ("tier", "root"),
        "1 while a root is fenced (failed: its blocks are misses)",
        ("tiers.*.roots",),
    ),
    Family(
        "kvtier_root_errors_total",
        "counter",
        ("tier", "root"),
        "Failed jobs counted against each root",
        ("tiers.*.roots",),
    ),
    Family(
        "kvtier_root_timeouts_total",
        "counter",
        ("tier", "root"),
        "Jobs past their deadline on each root (stalls)",
        ("tiers.*.roots",),
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
SCALAR_FAMILIES = tuple(f for f in FAMILIES if not f.labels and len(f.fields) == 1)
#: Per-tier families of secondary tiers only, each read from its one ``tiers.*`` field.
SECONDARY_FAMILIES = tuple(
    f for f in FAMILIES if f.labels == ("tier",) and len(f.fields) == 1 and f.fields[0].startswith("tiers.*.")
)
BY_NAME = {f.name: f for f in FAMILIES}
#: The per-root families and the ``root<N>_<stat>`` stat each reads.
ROOT_FAMILIES = (
    (BY_NAME["kvtier_root_used_bytes"], "used_bytes"),
    (BY_NAME["kvtier_root_max_bytes"], "max_bytes"),
    (BY_NAME["kvtier_root_fenced"], "fenced"),
    (BY_NAME["kvtier_root_errors_total"], "errors"),
    (BY_NAME["kvtier_root_timeouts_total"], "timeouts"),
)

#: Every exported family: (name as exposed, type, labels besides const labels). Final names.
METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = tuple((f.name, f.kind, f.labels) for f in FAMILIES)
