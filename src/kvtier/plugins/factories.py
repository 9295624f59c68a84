"""Factories that build plug-in instances from config through the registries of :mod:`kvtier.plugins.kinds`.

Re-exported by :mod:`kvtier.plugins`. Constructor-argument mistakes become
:class:`~kvtier.errors.ConfigError` naming the config key (``secondary_tiers[1].root_dir``).
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kvtier.errors import ConfigError, KvtierError
from kvtier.numbers import check_numbers
from kvtier.plugins.kinds import POLICIES, SPECS, TIERS
from kvtier.plugins.registry import _target_of, trust_boundary

if TYPE_CHECKING:
    from kvtier.config import KvtierConfig, PluginsConfig, TierConfig
    from kvtier.policies.base import CachePolicy
    from kvtier.tiers.base import SecondaryTier, TierContext

__all__ = [
    "CheckedTier",
    "check_tier",
    "create_policy",
    "create_spec",
    "create_tier",
    "tier_contexts",
    "tier_name",
]

T = TypeVar("T")

# Tier config keys consumed by the factory, never passed to a tier constructor.
_TIER_RESERVED = ("type", "module_path", "name")
# Arguments the factory itself supplies to every tier constructor.
_TIER_SUPPLIED = ("primary_kv_view", "context")


def _check_kwargs(
    cls: type[Any],
    options: Mapping[str, Any],
    supplied: tuple[str, ...],
    key_path: str,
    what: str,
    *,
    positional: int = 0,
) -> None:
    """Turn unexpected or missing constructor arguments into a ConfigError naming the key.

    ``supplied`` are keyword arguments kvtier passes itself; the first ``positional`` parameters are
    passed positionally by kvtier (a policy's capacity), whatever their names.
    """
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):  # pragma: no cover - C extensions without a signature
        return
    params = sig.parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    plist = list(params.values())
    fed = {p.name for p in plist[:positional] if p.kind is not inspect.Parameter.VAR_POSITIONAL}
    by_name = {
        p.name: p
        for p in plist
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        and p.name not in fed
    }
    if not accepts_any:
        # Old names a class still accepts (``renamed_options``: old -> new) are not suggested.
        hidden = {*supplied, *getattr(cls, "renamed_options", {})}
        for key in options:
            if key not in by_name or key in supplied:
                valid = sorted(n for n in by_name if n not in hidden)
                close = difflib.get_close_matches(key, valid, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(
                    f"{key_path}.{key}",
                    f"unexpected option for {what}{hint}; it accepts: {', '.join(valid) or 'no options'}",
                )
    for n, p in by_name.items():
        if p.default is inspect.Parameter.empty and n not in options and n not in supplied:
            raise ConfigError(f"{key_path}.{n}", f"missing; required by {what}")


def _construct(factory: Callable[[], T], key_path: str, what: str) -> T:
    try:
        return factory()
    except ConfigError as exc:
        # A plug-in raises ConfigError("root_dir", ...) about its own option; anchor it in the config.
        if exc.key_path.startswith(key_path):
            raise
        path = f"{key_path}.{exc.key_path}" if exc.key_path else key_path
        raise ConfigError(path, exc.detail) from exc
    except KvtierError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(key_path, f"{what} rejected its options: {type(exc).__name__}: {exc}") from exc


def tier_name(tier_config: TierConfig) -> str:
    """Instance name of a configured tier: its ``name`` option, else ``"<type><index>"``."""
    name = tier_config.options.get("name")
    if name is None:
        # "pkg.mod:Class" as a type names the instance after the class.
        base = tier_config.type.rpartition(":")[2] or tier_config.type
        return f"{base}{tier_config.index}"
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{tier_config.key_path}.name", f"expected a non-empty string, got {name!r}")
    return name


def tier_contexts(
    config: KvtierConfig,
    *,
    namespace: str = "default",
    clock: Callable[[], float] | None = None,
) -> list[TierContext]:
    """One :class:`~kvtier.tiers.base.TierContext` per configured tier; names are unique."""
    from kvtier.tiers.base import TierContext

    contexts: list[TierContext] = []
    seen: dict[str, int] = {}
    roots: dict[str, int] = {}
    for tc in config.secondary_tiers:
        root = tc.options.get("root_dir")
        if isinstance(root, str) and root.strip():
            # Two tiers on one directory would evict each other's blocks (issue 17), also when
            # one names it through a symlink: compare real paths.
            norm = os.path.realpath(os.path.expanduser(root))
            _check_root_is_a_directory(f"{tc.key_path}.root_dir", root, norm)
            if norm in roots:
                raise ConfigError(
                    f"{tc.key_path}.root_dir",
                    f"{root!r} is also the root_dir of secondary_tiers[{roots[norm]}]; give each its own",
                )
            roots[norm] = tc.index
        name = tier_name(tc)
        if name in seen:
            raise ConfigError(
                f"{tc.key_path}.name",
                f"duplicate tier name {name!r} (also secondary_tiers[{seen[name]}]); give each a unique name",
            )
        seen[name] = tc.index
        kw: dict[str, Any] = {"name": name, "block_bytes": config.block_bytes, "namespace": namespace}
        if clock is not None:
            kw["clock"] = clock
        contexts.append(TierContext(**kw))
    return contexts


def _check_root_is_a_directory(key: str, root: str, path: str) -> None:
    """A one-line error when ``path`` or its nearest existing ancestor is not a directory (a
    regular file there would fail later as a raw ``NotADirectoryError``)."""
    p = path
    while not os.path.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            return
        p = parent
    if not os.path.isdir(p):
        where = "is" if p == path else f"is inside {p}, which is"
        raise ConfigError(
            key, f"{root!r} {where} not a directory; give the path of a directory (created if missing)"
        )


def _as_tier_config(tier_config: TierConfig | Mapping[str, Any]) -> TierConfig:
    from kvtier.config import TierConfig, load_config

    if isinstance(tier_config, TierConfig):
        return tier_config
    return load_config({"secondary_tiers": [dict(tier_config)]}).secondary_tiers[0]


def create_tier(
    tier_config: TierConfig | Mapping[str, Any],
    *,
    primary_kv_view: memoryview,
    context: TierContext | None = None,
    plugins: PluginsConfig | None = None,
) -> SecondaryTier:
    """Build the tier one ``secondary_tiers`` entry describes.

    ``type`` and ``module_path`` select the class (never passed on), ``name`` names the instance,
    every other key becomes a constructor keyword argument next to ``primary_kv_view`` and
    ``context``. Without ``context`` one is derived (``block_bytes`` = the full row). ``plugins`` is
    the config's trust boundary for ``module_path``; ``None`` means no restriction (pass
    ``config.plugins`` whenever the tier config comes from a file).

    Raises:
        ConfigError: an option the constructor does not accept (``secondary_tiers[i].<key>``), a
            missing required one, or a value the tier rejected.
        PluginError: the type cannot be resolved (see :meth:`Registry.resolve`).
    """
    from kvtier.tiers.base import TierContext

    tc, cls, options, what = _resolve_tier(tier_config, plugins)
    if context is None:
        row = primary_kv_view.shape[1] if primary_kv_view.ndim == 2 and primary_kv_view.shape else 0
        context = TierContext(name=tier_name(tc), block_bytes=row)
    return CheckedTier(tc, cls, options, what, context, plugins).build(primary_kv_view)


@dataclass(frozen=True, slots=True)
class CheckedTier:
    """A tier entry resolved and checked by :func:`check_tier`, not built yet."""

    config: TierConfig
    cls: type[SecondaryTier]
    options: dict[str, Any]
    what: str
    context: TierContext
    plugins: PluginsConfig | None

    def build(self, primary_kv_view: memoryview) -> SecondaryTier:
        """Construct the tier (errors anchored under the entry's key path, as :func:`create_tier`)."""
        cls, ctx, options = self.cls, self.context, self.options
        with trust_boundary(self.plugins):
            return _construct(
                lambda: cls(primary_kv_view=primary_kv_view, context=ctx, **options),
                self.config.key_path,
                self.what,
            )


def check_tier(
    tier_config: TierConfig | Mapping[str, Any], context: TierContext, plugins: PluginsConfig | None = None
) -> CheckedTier:
    """Every check :func:`create_tier` makes before building, and the class's own
    :meth:`~kvtier.tiers.base.SecondaryTier.check_options`, without building the tier (nothing is
    written); :meth:`CheckedTier.build` builds it later. Raises what :func:`create_tier` would:
    ``ConfigError`` naming the key, ``PluginError``."""
    tc, cls, options, what = _resolve_tier(tier_config, plugins)
    check = getattr(cls, "check_options", None)  # a duck-typed plug-in may not inherit the hook
    if callable(check):
        with trust_boundary(plugins):
            _construct(lambda: check(context, options), tc.key_path, what)
    return CheckedTier(tc, cls, options, what, context, plugins)


def _resolve_tier(
    tier_config: TierConfig | Mapping[str, Any], plugins: PluginsConfig | None
) -> tuple[TierConfig, type[SecondaryTier], dict[str, Any], str]:
    """``(config, class, constructor options, description)`` of a tier entry, options checked
    against the constructor's signature."""
    tc = _as_tier_config(tier_config)
    cls = TIERS.resolve(tc.type, tc.module_path, plugins=plugins, key_path=tc.key_path)
    options = {k: v for k, v in tc.options.items() if k not in _TIER_RESERVED}
    what = f"tier {tc.type!r} ({_target_of(cls)})"
    for key in _TIER_SUPPLIED:
        if key in options:
            raise ConfigError(
                f"{tc.key_path}.{key}", f"is supplied by kvtier and cannot be configured ({what})"
            )
    _check_kwargs(cls, options, _TIER_SUPPLIED, tc.key_path, what)
    # The one numeric check (finite, in range) for every option the class declares, before the
    # class's own checks or constructor see the value.
    check_numbers(options, getattr(cls, "option_ranges", {}), tc.key_path)
    return tc, cls, options, what


def create_policy(
    policy: str | KvtierConfig,
    capacity: int,
    options: Mapping[str, Any] | None = None,
    *,
    module_path: str | None = None,
    plugins: PluginsConfig | None = None,
    key_path: str = "",
) -> CachePolicy:
    """Build ``Policy(capacity, **options)``: the one way every part of kvtier makes a policy.

    The engine passes its config (``eviction_policy``, ``cache_policy_module_path``,
    ``policy_options`` and the ``plugins`` trust boundary are taken from it); a tier or the
    simulator passes the policy name and options from its own config entry, with ``key_path``
    naming that entry (``secondary_tiers[1]``) so errors point at the right keys. Options are
    checked against the constructor's signature, so a typo is a one-line error wherever the
    policy is configured.

    Raises:
        PluginError: the name cannot be resolved (see :meth:`Registry.resolve`).
        ConfigError: an option the policy does not accept (``<key_path>.policy_options.<key>``), or
            a value it rejected.
    """
    if not isinstance(policy, str):
        config = policy
        policy, module_path, plugins = config.eviction_policy, config.cache_policy_module_path, config.plugins
        options = config.policy_options
    cls = POLICIES.resolve(policy, module_path, plugins=plugins, key_path=key_path)
    what = f"policy {policy!r} ({_target_of(cls)})"
    options_key = f"{key_path}.policy_options" if key_path else "policy_options"
    opts = dict(options or {})
    if "capacity" in opts:
        raise ConfigError(f"{options_key}.capacity", "is supplied by kvtier (from the tier's size)")
    _check_kwargs(cls, opts, (), options_key, what, positional=1)
    with trust_boundary(plugins):
        return _construct(lambda: cls(capacity, **opts), options_key, what)


def create_spec(config: KvtierConfig) -> Any:
    """The offloading spec ``config`` names (``spec_name`` + ``spec_module_path``): ``Spec(config)``,
    an :class:`~kvtier.specs.base.OffloadingSpec` (checked when the name is resolved; typed ``Any``
    because ``kvtier.specs`` builds through this package and is not imported by it)."""
    cls = SPECS.resolve(config.spec_name, config.spec_module_path, plugins=config.plugins)
    what = f"spec {config.spec_name!r} ({_target_of(cls)})"
    with trust_boundary(config.plugins):
        return _construct(lambda: cls(config), "spec_name", what)
