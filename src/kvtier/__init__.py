"""kvtier: tiered, pluggable KV-cache offloading for LLM inference engines.

The public API is what ``__all__`` lists; everything else is internal. Importing :mod:`kvtier` is
cheap: names are imported on first use (module ``__getattr__``), so ``import kvtier`` pulls in
neither numpy nor the engine until they are needed.

    import kvtier

    config = {"cpu_bytes_to_use": "8GiB", "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/kv"}]}
    engine = kvtier.Engine(config)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it. Engine lives in kvtier.engine (imported only when asked for).
_EXPORTS: dict[str, str] = {
    "BlockInfo": "kvtier.keys",
    "BlockKey": "kvtier.keys",
    "CachePolicy": "kvtier.policies.base",
    "ConfigError": "kvtier.errors",
    "Engine": "kvtier.engine",
    "JobResult": "kvtier.jobs",
    "KvtierConfig": "kvtier.config",
    "KvtierError": "kvtier.errors",
    "LookupResult": "kvtier.keys",
    "MisuseError": "kvtier.errors",
    "OffloadingSpec": "kvtier.specs.base",
    "PluginError": "kvtier.errors",
    "PluginImportError": "kvtier.errors",
    "PluginInfo": "kvtier.plugins",
    "PluginNotAllowedError": "kvtier.errors",
    "PluginTypeError": "kvtier.errors",
    "PluginsConfig": "kvtier.config",
    "RequestContext": "kvtier.engine",
    "SecondaryTier": "kvtier.tiers.base",
    "TierConfig": "kvtier.config",
    "TierContext": "kvtier.tiers.base",
    "TierError": "kvtier.errors",
    "TierStats": "kvtier.tiers.base",
    "TierUnavailableError": "kvtier.errors",
    "TransferJob": "kvtier.jobs",
    "UnknownPluginError": "kvtier.errors",
    "create_policy": "kvtier.plugins",
    "create_spec": "kvtier.plugins",
    "create_tier": "kvtier.plugins",
    "list_plugins": "kvtier.plugins",
    "load_config": "kvtier.config",
    "parse_size": "kvtier.config",
    "register_policy": "kvtier.plugins",
    "register_spec": "kvtier.plugins",
    "register_tier": "kvtier.plugins",
}

__all__ = [
    "BlockInfo",
    "BlockKey",
    "CachePolicy",
    "ConfigError",
    "Engine",
    "JobResult",
    "KvtierConfig",
    "KvtierError",
    "LookupResult",
    "MisuseError",
    "OffloadingSpec",
    "PluginError",
    "PluginImportError",
    "PluginInfo",
    "PluginNotAllowedError",
    "PluginTypeError",
    "PluginsConfig",
    "RequestContext",
    "SecondaryTier",
    "TierConfig",
    "TierContext",
    "TierError",
    "TierStats",
    "TierUnavailableError",
    "TransferJob",
    "UnknownPluginError",
    "__version__",
    "create_policy",
    "create_spec",
    "create_tier",
    "list_plugins",
    "load_config",
    "parse_size",
    "register_policy",
    "register_spec",
    "register_tier",
]

if TYPE_CHECKING:
    from kvtier.config import KvtierConfig, PluginsConfig, TierConfig, load_config, parse_size
    from kvtier.errors import (
        ConfigError,
        KvtierError,
        MisuseError,
        PluginError,
        PluginImportError,
        PluginNotAllowedError,
        PluginTypeError,
        TierError,
        TierUnavailableError,
        UnknownPluginError,
    )
    from kvtier.jobs import JobResult, TransferJob
    from kvtier.keys import BlockInfo, BlockKey, LookupResult
    from kvtier.plugins import (
        PluginInfo,
        create_policy,
        create_spec,
        create_tier,
        list_plugins,
        register_policy,
        register_spec,
        register_tier,
    )
    from kvtier.policies.base import CachePolicy
    from kvtier.specs.base import OffloadingSpec
    from kvtier.tiers.base import SecondaryTier, TierContext, TierStats


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvtier' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: the next access does not come through here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
