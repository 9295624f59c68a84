"""The three plug-in kinds (secondary tiers, eviction policies, specs): their registries and built-ins.

Each kind is one :class:`~kvtier.plugins.registry.Registry` with its base class, entry-point group,
config keys and built-in table (lazy ``"module:Class"`` strings, so importing this module imports no
tier, policy or spec). ``register_*`` add names at run time; :func:`list_plugins` lists every kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from kvtier.plugins.registry import PluginInfo, Registry, _notice_lock, _noticed_kinds

if TYPE_CHECKING:
    from kvtier.policies.base import CachePolicy
    from kvtier.tiers.base import SecondaryTier

__all__ = [
    "POLICIES",
    "SPECS",
    "TIERS",
    "get_registry",
    "list_plugins",
    "register_policy",
    "register_spec",
    "register_tier",
    "restore_state",
    "snapshot_state",
]


# Built-ins, mirrored in pyproject.toml's entry-point groups (a test keeps the two in step).
_BUILTIN_TIERS = {
    "example": "kvtier.tiers.example:ExampleTier",
    "fs": "kvtier.tiers.fs:FsTier",
    "redis": "kvtier.tiers.redis:RedisTier",
    "obj": "kvtier.tiers.obj:ObjTier",
    # The issue and AWS users say "s3"; the seed's tier list says "obj".
    "s3": "kvtier.tiers.obj:ObjTier",
    "p2p": "kvtier.tiers.p2p:P2PTier",
    "mooncake": "kvtier.tiers.mooncake:MooncakeTier",
}
_BUILTIN_POLICIES = {
    "lru": "kvtier.policies.lru:LRUPolicy",
    "arc": "kvtier.policies.arc:ARCPolicy",
    "s3fifo": "kvtier.policies.s3fifo:S3FIFOPolicy",
    "sieve": "kvtier.policies.sieve:SIEVEPolicy",
    "prefix": "kvtier.policies.prefix:PrefixAwarePolicy",
}
_BUILTIN_SPECS = {
    "tiering": "kvtier.specs.tiering:TieringSpec",
    # vLLM users write spec_name "TieringOffloadingSpec"; accept it unchanged.
    "TieringOffloadingSpec": "kvtier.specs.tiering:TieringSpec",
}

TIERS: Registry[SecondaryTier] = Registry(
    "tier",
    "kvtier.tiers.base:SecondaryTier",
    "kvtier.tiers",
    _BUILTIN_TIERS,
    name_key="type",
    module_key="module_path",
)
POLICIES: Registry[CachePolicy] = Registry(
    "policy",
    "kvtier.policies.base:CachePolicy",
    "kvtier.policies",
    _BUILTIN_POLICIES,
    name_key="eviction_policy",
    module_key="cache_policy_module_path",
)
#: A spec class (any OffloadingSpec subclass) as given to register_spec.
SpecT = TypeVar("SpecT")

# Specs sit above this package (the built-in spec builds through kvtier.plugins' factories), so the
# spec contract is named by string only, here and in the registry's type: callers annotate.
SPECS: Registry[Any] = Registry(
    "spec",
    "kvtier.specs.base:OffloadingSpec",
    "kvtier.specs",
    _BUILTIN_SPECS,
    name_key="spec_name",
    module_key="spec_module_path",
)
_REGISTRIES: dict[str, Registry[Any]] = {"tier": TIERS, "policy": POLICIES, "spec": SPECS}


def get_registry(kind: str) -> Registry[Any]:
    """The registry of ``kind`` (``"tier"``, ``"policy"`` or ``"spec"``)."""
    try:
        return _REGISTRIES[kind]
    except KeyError:
        raise ValueError(f"unknown plug-in kind {kind!r}; expected one of {', '.join(_REGISTRIES)}") from None


def register_tier(name: str, cls: type[SecondaryTier], *, replace: bool = False) -> type[SecondaryTier]:
    """Make a :class:`~kvtier.tiers.base.SecondaryTier` subclass available as ``type: name``."""
    return TIERS.register(name, cls, replace=replace)


def register_policy(name: str, cls: type[CachePolicy], *, replace: bool = False) -> type[CachePolicy]:
    """Make a :class:`~kvtier.policies.base.CachePolicy` subclass available as ``eviction_policy: name``."""
    return POLICIES.register(name, cls, replace=replace)


def register_spec(name: str, cls: type[SpecT], *, replace: bool = False) -> type[SpecT]:
    """Make an :class:`~kvtier.specs.base.OffloadingSpec` subclass available as ``spec_name: name``."""
    return SPECS.register(name, cls, replace=replace)


def list_plugins(kind: str | None = None) -> list[PluginInfo]:
    """Every known plug-in (all kinds, or one), with its source and import target. Imports nothing."""
    kinds = [kind] if kind is not None else list(_REGISTRIES)
    return [info for k in kinds for info in get_registry(k).infos()]


def snapshot_state() -> object:
    """Opaque copy of every registry (and the notice flags), for :func:`restore_state` in tests."""
    with _notice_lock:
        noticed = set(_noticed_kinds)
    return {k: r._snapshot() for k, r in _REGISTRIES.items()}, noticed


def restore_state(state: object) -> None:
    """Put the registries back as :func:`snapshot_state` saw them."""
    regs: dict[str, Any]
    noticed: set[str]
    regs, noticed = state  # type: ignore[misc]
    for k, r in _REGISTRIES.items():
        r._restore(regs[k])
    with _notice_lock:
        _noticed_kinds.clear()
        _noticed_kinds.update(noticed)
