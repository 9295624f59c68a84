"""The fs tier's eviction policy: how large it is and how it is built.

The byte limit (``max_bytes``) is enforced by the shared accounting; the policy only orders blocks
and picks victims, so its capacity (in blocks) just has to hold every block the bytes can hold
(:func:`~kvtier.tiers.base.policy_capacity`, the rule the simulator's default profile uses too).
The policy itself is built by :func:`kvtier.plugins.create_policy`, the one constructor every part
of kvtier uses, so the fs tier accepts exactly the policies and options the engine accepts, checked
the same way. :meth:`FsTier.simulation <kvtier.tiers.fs.tier.FsTier.simulation>` uses both
functions too, so the simulator models the very policy the tier would build.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtier.config import PluginsConfig
from kvtier.errors import ConfigError, PluginError
from kvtier.plugins import create_policy
from kvtier.policies.base import CachePolicy
from kvtier.tiers.base import policy_capacity

__all__ = ["build_policy", "policy_capacity"]


def build_policy(
    name: str,
    capacity: int,
    options: Mapping[str, Any] | None = None,
    *,
    plugins: PluginsConfig | None = None,
    key_path: str = "",
) -> CachePolicy:
    """``create_policy(name, capacity, options)`` with errors on the tier's own keys.

    An unresolvable name is a :class:`ConfigError` on ``eviction_policy`` (the engine anchors a
    tier's errors under ``secondary_tiers[i]``); bad options are ``policy_options.<key>``.
    """
    try:
        return create_policy(name, capacity, options, plugins=plugins, key_path=key_path)
    except PluginError as exc:
        key = f"{key_path}.eviction_policy" if key_path else "eviction_policy"
        raise ConfigError(key, str(exc).removeprefix(f"{key}: ")) from exc
