"""Building the fs tier's eviction policy by name (through the plug-in registry)."""

from __future__ import annotations

from typing import Any

from kvtier.errors import ConfigError, KvtierError
from kvtier.policies.base import CachePolicy

__all__ = ["make_policy"]


def make_policy(name: str, capacity: int, options: dict[str, Any]) -> CachePolicy:
    """``Policy(capacity, **options)`` for the registered policy ``name`` (``lru``, ``arc``, ...).

    Resolution goes through :data:`kvtier.plugins.POLICIES` (built-ins, ``register_policy``, entry
    points, ``"pkg.mod:Class"``), so any policy the engine can use, the fs tier can use too. Errors
    are :class:`ConfigError` on the tier's ``eviction_policy`` / ``policy_options`` keys.
    """
    from kvtier.plugins import POLICIES

    try:
        cls = POLICIES.resolve(name)
    except KvtierError as exc:
        raise ConfigError("eviction_policy", str(exc)) from exc
    try:
        return cls(capacity, **options)
    except TypeError as exc:
        raise ConfigError("policy_options", f"policy {name!r} rejected its options: {exc}") from exc
