"""Construction helpers of :class:`kvtier.engine.Engine`: the namespace and the secondary tiers."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvtier.config import KvtierConfig
from kvtier.errors import MisuseError
from kvtier.tiers.base import SecondaryTier

if TYPE_CHECKING:
    from kvtier.engine import Engine

__all__ = ["build_tiers", "config_namespace"]

log = logging.getLogger("kvtier.engine")


def config_namespace(config: KvtierConfig) -> str:
    """Stable hex fingerprint of what a block's bytes mean (model, block size) and the salt."""
    raw = f"{config.model}\0{config.block_bytes}\0{config.cache_salt}".encode()
    return hashlib.blake2b(raw, digest_size=16, person=b"kvtier-ns").hexdigest()


def build_tiers(
    engine: Engine, spec: Any, tiers: Sequence[Any] | None, simulate: bool
) -> list[SecondaryTier]:
    """The engine's secondary tiers: the ``tiers`` override (instances or factories), else the spec's.

    An override instance built on another view of the same shape is attached to the engine's
    buffer (its ``primary_kv_view`` and ``rows`` are replaced). In simulation configured tiers are
    not built.
    """
    if tiers is not None:
        built: list[SecondaryTier] = []
        view = engine.primary_kv_view
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
                t.rows = engine.primary.rows
            built.append(t)
        return built
    if not engine.config.secondary_tiers:
        return []
    if simulate:
        log.info("kvtier: primary_backing 'none' (simulation): secondary_tiers are not built")
        return []
    from kvtier.plugins import tier_contexts

    contexts = tier_contexts(engine.config, namespace=engine.namespace, clock=engine._clock)
    return list(spec.create_tiers(engine.primary_kv_view, contexts))
