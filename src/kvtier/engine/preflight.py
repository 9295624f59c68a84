"""Checks of a whole config that need the machine or every part at once, run before anything is
built or written: by :class:`~kvtier.engine.Engine` (first thing in its constructor) and by
``kvtier check``, so both refuse exactly the same configs.

* **The primary buffer against the machine's memory**: ``cpu_bytes_to_use`` larger than the
  physical memory would end in a bare numpy ``MemoryError`` (or the OOM killer) much later; it is
  a one-line :class:`~kvtier.errors.ConfigError` showing both numbers. Simulation
  (``primary_backing: none``) allocates no buffer and is not limited.
* **The cost model's keys at every level**, including ``tiers.<name>`` naming a configured tier
  (:func:`~kvtier.costmodel.check_cost_model_keys`, with a did-you-mean).
* **The write policy** name.

The secondary tiers' own options are checked by the spec before it builds any of them
(:func:`kvtier.plugins.check_tier`).
"""

from __future__ import annotations

import os

from kvtier.config import KvtierConfig
from kvtier.engine.writes import write_policy_type
from kvtier.errors import ConfigError

__all__ = ["machine_memory", "preflight"]


def machine_memory() -> int | None:
    """Bytes of physical memory of this machine (``None`` when the system does not say)."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX systems
        return None
    return pages * page if pages > 0 and page > 0 else None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB"


def check_primary_memory(config: KvtierConfig) -> None:
    """Refuse a primary buffer larger than the machine's physical memory (see the module doc)."""
    if config.primary_backing == "none":
        return
    total = machine_memory()
    need = config.num_primary_slots * config.row_stride
    if total is not None and need > total:
        raise ConfigError(
            "cpu_bytes_to_use",
            f"{config.cpu_bytes_to_use} bytes ({_gib(config.cpu_bytes_to_use)}) is more than this "
            f"machine's {total} bytes of memory ({_gib(total)}); lower it",
        )


def preflight(config: KvtierConfig, *, tiers_given: bool = False) -> None:
    """Every whole-config check (see the module doc); ``tiers_given``: the caller passes its own
    tier instances, so ``cost_model.tiers`` names are not checked against the configured ones."""
    write_policy_type(config.write_policy)
    check_primary_memory(config)
    if config.cost_model:
        from kvtier.costmodel import check_cost_model_keys
        from kvtier.plugins import tier_name

        names = None if tiers_given else [tier_name(tc) for tc in config.secondary_tiers]
        check_cost_model_keys(config.cost_model, names)
