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
from dataclasses import replace

from kvtier.config import parse_size
from kvtier.errors import ConfigError
from kvtier.tiers.base import UNBOUNDED_BLOCKS, SimulationProfile, SimulationRequest, whole_job
from kvtier.tiers.fs.roots import RootClass, check_fenced

__all__ = ["simulate_striped"]


def simulate_striped(request: SimulationRequest, root_cls: RootClass, medium: str) -> SimulationProfile:
    """The striped tier's :class:`~kvtier.tiers.base.SimulationProfile` for ``request`` (its
    ``options`` the striped ones, :func:`~kvtier.tiers.fs.forms.as_striped`; see the module doc)."""
    options = request.options
    roots = options.get("root_dirs") or []
    where = request.key("root_dirs")
    if isinstance(roots, str) or not isinstance(roots, Sequence) or not roots:
        raise ConfigError(where, "expected a non-empty list of directories")
    fenced = check_fenced(options.get("simulate_fenced"), len(roots))
    total = request.size("max_bytes")
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
        one = root_cls.simulate(replace(request, options={**base, "max_bytes": size}))
        capacity = (capacity or 0) + (one.capacity_blocks or 0)
    held = None if capacity is None else max(capacity, 1)
    policy = request.policy(UNBOUNDED_BLOCKS if held is None else held + 1)
    return SimulationProfile(held, policy, whole_job, medium)
