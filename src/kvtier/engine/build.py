"""Construction of an :class:`~kvtier.engine.Engine`'s parts from its config.

Owns the decisions made once, before the engine runs: the key namespace, which policy and how many
primary slots (:func:`resolve_policy`, through the configured spec), the secondary tiers (the
caller's override or the spec's, :func:`build_tiers`), the cost model of the promotion gate and the
Prometheus exporter. Each function is given what it reads (config, primary tier, clock, namespace)
and never the engine itself; the exporter gets a :class:`~kvtier.metrics.StatsSource`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvtier.config import KvtierConfig
from kvtier.errors import ConfigError, MisuseError
from kvtier.policies.base import CachePolicy
from kvtier.primary import PrimaryTier
from kvtier.tiers.base import SecondaryTier

if TYPE_CHECKING:
    from kvtier.costmodel import CostModel
    from kvtier.metrics import MetricsExporter, StatsSource

__all__ = [
    "build_cost_model",
    "build_tiers",
    "config_namespace",
    "new_counters",
    "resolve_policy",
    "start_metrics",
    "stop_metrics",
]

log = logging.getLogger("kvtier.engine")

_COUNTERS = (
    "lookup_calls", "lookups", "hits", "pending", "retries", "misses", "stores", "dropped_stores",
    "evictions", "writebacks", "loads", "promotions", "promotions_failed", "promotions_rejected",
    "promotions_skipped_cost", "tier_errors", "bytes_stored", "bytes_loaded", "resets",
)  # fmt: skip


def new_counters() -> dict[str, int]:
    """The engine's counters by name, all zero, in the order :meth:`Engine.stats` lists them."""
    return dict.fromkeys(_COUNTERS, 0)


def config_namespace(config: KvtierConfig) -> str:
    """Stable hex fingerprint of what a block's bytes mean (model, block size) and the salt."""
    raw = f"{config.model}\0{config.block_bytes}\0{config.cache_salt}".encode()
    return hashlib.blake2b(raw, digest_size=16, person=b"kvtier-ns").hexdigest()


def resolve_policy(
    config: KvtierConfig, policy: CachePolicy | None, tiers_given: bool
) -> tuple[Any, CachePolicy, int]:
    """``(spec, policy, num_slots)``: the configured spec (``None`` when not needed), the eviction
    policy (``policy`` when given, else the spec's) and the number of primary slots.

    The spec is resolved (plug-in registry) unless both the policy and the tiers are given, or the
    config simulates (``primary_backing: none``: configured tiers are not built) or has no tiers.
    Raises :class:`~kvtier.errors.ConfigError` when the budget holds no slot and
    :class:`~kvtier.errors.MisuseError` when a given policy's capacity is not the slot count.
    """
    spec = None
    num_slots = config.num_primary_slots
    simulate = config.primary_backing == "none"
    if policy is None or (not tiers_given and not simulate and config.secondary_tiers):
        from kvtier.plugins import create_spec

        spec = create_spec(config)
        num_slots = spec.num_primary_slots
    if num_slots < 1:
        raise ConfigError(
            "cpu_bytes_to_use",
            f"{config.cpu_bytes_to_use} bytes hold no slot of {config.row_stride} bytes; raise it",
        )
    if policy is None:
        assert spec is not None
        policy = spec.create_policy(num_slots)
    elif policy.capacity != num_slots:
        raise MisuseError(
            f"policy capacity {policy.capacity} must equal the primary tier's {num_slots} slots "
            f"(cpu_bytes_to_use {config.cpu_bytes_to_use} // row_stride {config.row_stride})"
        )
    return spec, policy, num_slots


def build_tiers(
    config: KvtierConfig,
    primary: PrimaryTier,
    spec: Any,
    tiers: Sequence[Any] | None,
    *,
    namespace: str,
    clock: Callable[[], float],
) -> list[SecondaryTier]:
    """The secondary tiers: the ``tiers`` override (instances or factories), else the spec's.

    An override instance built on another view of the same shape is attached to ``primary``'s
    buffer (its ``primary_kv_view`` and ``rows`` are replaced). In simulation (``primary_backing:
    none``) configured tiers are not built.
    """
    if tiers is not None:
        built: list[SecondaryTier] = []
        view = primary.primary_kv_view
        for t in tiers:
            if not isinstance(t, SecondaryTier) and callable(t):
                t = t(view)  # a factory: build the tier on this engine's buffer
            if not isinstance(t, SecondaryTier):
                raise MisuseError(
                    f"tiers must be SecondaryTier instances or factories, got {type(t).__name__}"
                )
            if t.primary_kv_view.obj is not view.obj:
                if t.primary_kv_view.shape != view.shape:
                    raise MisuseError(
                        f"tier {t.name!r} was built on a view of shape {t.primary_kv_view.shape}; "
                        f"this engine's primary_kv_view is {view.shape} (pass a factory instead)"
                    )
                # Built on a placeholder of the right shape: attach it to the real buffer.
                t.primary_kv_view = view
                t.rows = primary.rows
            built.append(t)
        return built
    if not config.secondary_tiers:
        return []
    if config.primary_backing == "none":
        log.info("kvtier: primary_backing 'none' (simulation): secondary_tiers are not built")
        return []
    from kvtier.plugins import tier_contexts

    contexts = tier_contexts(config, namespace=namespace, clock=clock)
    return list(spec.create_tiers(primary.primary_kv_view, contexts))


def build_cost_model(config: KvtierConfig, tiers: Sequence[SecondaryTier]) -> CostModel | None:
    """The promotion gate's model: only when ``cost_model`` is configured and there are tiers.

    Tiers the model does not describe get the default speeds of their ``medium``. Raises
    :class:`~kvtier.errors.ConfigError` (naming the ``cost_model.*`` key) on bad values.
    """
    if not config.cost_model or not tiers:
        return None
    from kvtier.costmodel import CostModel  # imported only when configured

    try:
        model = CostModel.from_config(config, tier_media={t.name: t.medium for t in tiers})
    except BaseException:
        for t in tiers:  # the engine is not built: release what the tiers hold (threads, files)
            with contextlib.suppress(Exception):
                t.shutdown()
        raise
    for t in tiers:
        if model.min_blocks_to_load(t.name) is None:
            log.warning(
                "kvtier: cost model: loading from tier %s is never faster than recomputing; "
                "its hits will be recomputed (check cost_model.tiers.%s)",
                t.name,
                t.name,
            )
    return model


def start_metrics(engine: StatsSource, config: KvtierConfig) -> MetricsExporter | None:
    """Serve ``engine``'s Prometheus metrics on 127.0.0.1:``metrics_port`` when it is set.

    Metrics are optional to the cache: when ``prometheus_client`` is missing or the port cannot be
    bound, one warning is logged and the engine runs without an exporter.
    """
    if config.metrics_port is None:
        return None
    try:
        from kvtier.metrics import exporter_from_config  # prometheus_client only when asked for

        return exporter_from_config(engine, config)
    except Exception as exc:  # KvtierError (missing package, port taken) or an import failure
        log.warning(
            "kvtier: metrics_port %d: Prometheus exporter not started, the engine runs without it (%s)",
            config.metrics_port,
            exc,
        )
        return None


def stop_metrics(exporter: MetricsExporter | None) -> None:
    """Stop an exporter from :func:`start_metrics`; a failure is logged, never raised (close must finish)."""
    if exporter is None:
        return
    try:
        exporter.close()
    except Exception as exc:
        log.warning("kvtier: stopping the metrics exporter failed: %s: %s", type(exc).__name__, exc)
