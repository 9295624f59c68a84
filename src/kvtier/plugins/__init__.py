"""One generic plug-in registry for secondary tiers, eviction policies and offloading specs.

Every kind is served by the same :class:`Registry` (never a copy per kind). A name resolves in this
order:

1. the built-in table (lazy ``"module:Class"`` strings: nothing is imported until a name is used) and
   names added at run time with :func:`register_tier` / :func:`register_policy` /
   :func:`register_spec`;
2. installed entry points of the kind's group (``kvtier.tiers``, ``kvtier.policies``,
   ``kvtier.specs``);
3. a ``module_path`` from config: the module is imported and the attribute named by the plug-in's
   name (``type``, ``eviction_policy``, ``spec_name``) is taken. ``"pkg.module:Class"`` is accepted
   as well, in ``module_path`` or in the name itself.

``module_path`` runs code named by a config file, so it is a trust boundary: the ``plugins`` section
of the config (``allow_module_path``, ``allowed_modules``) is checked on the *string* before anything
is imported (``importlib.util.find_spec`` would already import parent packages, so it is not used).

Loading anything that is not a built-in logs one fixed-text WARNING per process and kind (the
plug-in API is experimental) and one INFO line per load naming the plug-in and its module.

Factories: :func:`create_tier`, :func:`create_policy`, :func:`create_spec` build instances and turn
constructor-argument mistakes into :class:`~kvtier.errors.ConfigError` naming the config key.

The package: :mod:`~kvtier.plugins.registry` (the generic mechanism), :mod:`~kvtier.plugins.kinds`
(the three registries and their built-ins), :mod:`~kvtier.plugins.factories` (building instances).
Contracts (``tiers/base.py``, ``policies/base.py``) are named by string, never imported at module
level, so tiers and policies may use the factories without an import cycle.
"""

from kvtier.plugins.factories import (
    check_tier,
    create_policy,
    create_spec,
    create_tier,
    tier_contexts,
    tier_name,
)
from kvtier.plugins.kinds import (
    POLICIES,
    SPECS,
    TIERS,
    get_registry,
    list_plugins,
    register_policy,
    register_spec,
    register_tier,
    restore_state,
    snapshot_state,
)
from kvtier.plugins.registry import (
    BUILTIN,
    ENTRY_POINT,
    EXPERIMENTAL_NOTICE,
    MODULE_PATH,
    REGISTERED,
    PluginInfo,
    Registry,
    reset_notices,
    trust_boundary,
)

__all__ = [
    "BUILTIN",
    "ENTRY_POINT",
    "EXPERIMENTAL_NOTICE",
    "MODULE_PATH",
    "POLICIES",
    "REGISTERED",
    "SPECS",
    "TIERS",
    "PluginInfo",
    "Registry",
    "create_policy",
    "create_spec",
    "check_tier",
    "create_tier",
    "get_registry",
    "list_plugins",
    "register_policy",
    "register_spec",
    "register_tier",
    "reset_notices",
    "restore_state",
    "snapshot_state",
    "tier_contexts",
    "tier_name",
    "trust_boundary",
]
