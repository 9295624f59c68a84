"""How ``replay --simulate`` and ``kvtier plan`` model a striped fs tier (``root_dirs``).

Each root holds what a one-root tier of its share of ``max_bytes`` holds (the one-root tier's own
simulation hook answers for it), the roots listed in ``simulate_fenced`` hold nothing (a "what if
this disk fails" run), and the tier holds the sum. Pure: no ``statvfs``, so roots without their own
``max_bytes`` share the total equally here, where the real tier splits it by free space.
Approximate: one policy orders every root's blocks, where the real tier evicts per root (with
rendezvous placement the roots fill evenly, so the difference is small).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvtier.config import parse_size
from kvtier.errors import ConfigError
from kvtier.tiers.base import UNBOUNDED_BLOCKS, PolicyFactory, SimulationProfile, whole_job
from kvtier.tiers.fs.roots import RootClass, check_fenced

__all__ = ["simulate_striped"]


def simulate_striped(
    options: Mapping[str, Any],
    *,
    block_bytes: int,
    policy_factory: PolicyFactory,
    key_path: str,
    root_cls: RootClass,
    medium: str,
) -> SimulationProfile:
    """The striped tier's :class:`~kvtier.tiers.base.SimulationProfile` (see the module doc)."""
    roots = options.get("root_dirs") or []
    where = f"{key_path}.root_dirs" if key_path else "root_dirs"
    if isinstance(roots, str) or not isinstance(roots, Sequence) or not roots:
        raise ConfigError(where, "expected a non-empty list of directories")
    fenced = check_fenced(options.get("simulate_fenced"), len(roots))
    raw_total = options.get("max_bytes")
    total = (
        None
        if raw_total is None
        else parse_size(raw_total, f"{key_path}.max_bytes" if key_path else "max_bytes")
    )
    own: list[int | None] = []
    for i, r in enumerate(roots):
        size = r.get("max_bytes") if isinstance(r, Mapping) else None
        own.append(None if size is None else parse_size(size, f"{where}[{i}].max_bytes"))
    shared = [i for i, s in enumerate(own) if s is None]
    if total is not None and shared:
        left = max(total - sum(s for s in own if s is not None), 0)
        for i in shared:
            own[i] = left // len(shared)
    base = {k: v for k, v in options.items() if k not in ("root_dirs", "max_bytes", "simulate_fenced")}
    capacity: int | None = 0
    for i, size in enumerate(own):
        if i in fenced:
            continue
        if size is None:
            capacity = None
            break
        one = root_cls.simulation(
            {**base, "max_bytes": size}, block_bytes=block_bytes, policy_factory=policy_factory,
            key_path=key_path,
        )  # fmt: skip
        capacity = (capacity or 0) + (one.capacity_blocks or 0)
    held = None if capacity is None else max(capacity, 1)
    policy = policy_factory(
        str(options.get("eviction_policy", "lru")),
        UNBOUNDED_BLOCKS if held is None else held + 1,
        options.get("policy_options") or {},
        key_path=key_path,
    )
    return SimulationProfile(held, policy, whole_job, medium)
