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

from kvtier.metrics.collector import EngineCollector, StatsSource, register_collector, tier_counters
from kvtier.metrics.exporter import MetricsExporter, exporter_from_config, start_exporter
from kvtier.metrics.families import FAMILIES, METRICS, Family

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
