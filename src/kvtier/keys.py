"""Block keys and lookup outcomes.

A :data:`BlockKey` names one KV block *and its whole prefix*: ``key_i = H(key_{i-1}, tokens_i, extra)``
seeded by a namespace (model/layout fingerprint + tenant salt). Keys are plain ``bytes`` so engines that
already hash their blocks (vLLM's offload keys are bytes) can pass theirs through unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NewType

__all__ = ["BlockInfo", "BlockKey", "LookupResult"]

BlockKey = NewType("BlockKey", bytes)
"""Opaque identifier of one KV block and its prefix. Compared and hashed as bytes."""


class LookupResult(enum.Enum):
    """Outcome of asking a tier (or the engine) whether a key is available."""

    MISS = "miss"
    """Not held; the engine must recompute the block."""
    HIT = "hit"
    """Held and readable now."""
    HIT_PENDING = "hit_pending"
    """Held in a slower tier; a promotion into the primary tier is in flight. Ask again later."""
    RETRY = "retry"
    """Unknown yet (index still warming, backend slow to answer); ask again next step."""


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """What a KV cache knows about a block that a generic cache does not.

    Passed to :meth:`kvtier.policies.base.CachePolicy.insert` so prefix-aware policies can weigh a
    block by its place in its prefix chain. Every field is optional knowledge: policies must work
    when the engine passes ``None`` instead of a ``BlockInfo``.

    Attributes:
        parent: key of the previous block in the same prefix chain (``None`` for the first block).
        depth: 0-based position of the block in its chain.
        tenant: tenant identifier (used for per-tenant quotas), ``None`` when single-tenant.
    """

    parent: BlockKey | None = None
    depth: int = 0
    tenant: str | None = None
