"""A candidate tier stack and the kvtier config that builds it: the one place kinds map to tiers.

A :class:`Stack` is a size in blocks per menu kind: ``ram`` is the primary tier (its slots), every
other kind a secondary tier in menu order (fastest first). :func:`stack_config` turns it into the
config mapping that ``kvtier replay --simulate --config`` (and the planner, through
:func:`kvtier.sim.replay.replay`) runs, with a ``cost_model`` section holding the menu's speeds so
that the engine's promotion cost gate and the replay's saving use the same figures.

Kind -> tier type (:data:`TIER_TYPES`):

* ``ram``   -> the primary tier (``cpu_bytes_to_use`` = blocks x row stride);
* ``nvme``  -> an ``fs`` tier with ``max_bytes`` (block files of a 4 KiB header + the block); when
  the menu gives the kind ``drives`` > 1, a striped ``fs`` tier instead: ``root_dirs`` with one root
  per drive (``<root_dir><i>``), each with its own ``max_bytes`` (the blocks split as evenly as
  whole blocks allow, so the roots together hold exactly the stack's blocks);
* ``redis`` -> **modelled as an ``fs`` tier** of the same capacity for now;
* ``s3``    -> **modelled as an ``fs`` tier** of the same capacity for now.

In simulate mode a secondary tier is only its capacity and eviction policy (LRU), so an ``fs``
stand-in gives the same hits as a capacity-bounded remote tier would; the speed of each kind comes
from the menu, not from the tier type. When the ``redis`` and ``obj`` tier types are registered,
switching is one line per kind in :data:`TIER_TYPES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtier.plan.menu import Menu

__all__ = ["FS_HEADER_BYTES", "TIER_TYPES", "Stack", "max_blocks", "stack_config", "tier_bytes"]

#: Tier type (and fixed options) per secondary kind; ``ram`` is the primary tier.
#: Switch ``redis`` to ``{"type": "redis", ...}`` and ``s3`` to ``{"type": "obj", ...}`` once those
#: tier types are registered (their simulate-mode model is capacity + policy, like fs).
TIER_TYPES: Mapping[str, Mapping[str, Any]] = {
    "nvme": {"type": "fs", "root_dir": "/var/lib/kvtier/nvme"},
    "redis": {"type": "fs", "root_dir": "/var/lib/kvtier/redis-standin"},
    "s3": {"type": "fs", "root_dir": "/var/lib/kvtier/s3-standin"},
}
#: Bytes an ``fs`` tier spends per block file besides the block: the codec header, 4 KiB-aligned.
FS_HEADER_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Stack:
    """Sizes in blocks per kind, in stack order (``ram`` first); a kind of 0 blocks is absent."""

    sizes: tuple[tuple[str, int], ...]

    @property
    def kinds(self) -> list[str]:
        return [k for k, b in self.sizes if b > 0]

    def blocks(self, kind: str) -> int:
        return dict(self.sizes).get(kind, 0)

    def label(self) -> str:
        return " + ".join(f"{k} {b:,}" for k, b in self.sizes if b > 0)


def _row_stride(block_bytes: int) -> int:
    return -(-block_bytes // 4096) * 4096


def tier_bytes(kind: str, blocks: int, block_bytes: int) -> int:
    """Bytes the config provisions for ``blocks`` blocks of ``kind`` (what is priced)."""
    if kind == "ram":
        return blocks * _row_stride(block_bytes)
    if TIER_TYPES[kind]["type"] == "fs":
        return blocks * (FS_HEADER_BYTES + block_bytes)
    return blocks * block_bytes


def max_blocks(kind: str, menu: Menu, block_bytes: int) -> int | None:
    """Most blocks of ``kind`` its drives hold (``drives x`` block files per drive), ``None`` when
    the menu gives no drive size."""
    k = menu.kind(kind)
    if kind == "ram" or k.drive_bytes is None:
        return None
    return k.drives * (k.drive_bytes // tier_bytes(kind, 1, block_bytes))


def _tier_entry(kind: str, blocks: int, menu: Menu, block_bytes: int, fenced: bool) -> dict[str, Any]:
    """The secondary-tier entry of ``blocks`` blocks of ``kind``; striped over the kind's drives
    (``fenced``: its first root modelled as failed, ``simulate_fenced``)."""
    base = {k: v for k, v in TIER_TYPES[kind].items() if k != "root_dir"}
    drives = min(menu.kind(kind).drives, blocks)
    if TIER_TYPES[kind]["type"] != "fs" or drives <= 1:
        entry = {**TIER_TYPES[kind], "name": kind, "max_bytes": tier_bytes(kind, blocks, block_bytes)}
    else:
        root = str(TIER_TYPES[kind]["root_dir"])
        share, extra = divmod(blocks, drives)
        roots = [
            {"path": f"{root}{i}", "max_bytes": tier_bytes(kind, share + (i < extra), block_bytes)}
            for i in range(drives)
        ]
        entry = {**base, "name": kind, "root_dirs": roots}
        if fenced:
            entry["simulate_fenced"] = [0]
    entry.setdefault("eviction_policy", "lru")
    return entry


def stack_config(
    stack: Stack,
    menu: Menu,
    *,
    block_bytes: int,
    tokens_per_block: int,
    kv_bytes_per_token: int,
    policy: str = "lru",
    write_policy: str = "write_through",
    fenced: str | None = None,
) -> dict[str, Any]:
    """The kvtier config mapping of ``stack`` (blocks of ``block_bytes``), cost model included;
    ``fenced`` names a striped kind whose first drive the simulation models as failed."""
    tiers: list[dict[str, Any]] = []
    speeds: dict[str, dict[str, float]] = {}
    ram = menu.kind("ram")
    speeds["primary"] = {"load_bandwidth": ram.load_bandwidth, "load_latency": ram.load_latency}
    for kind, blocks in stack.sizes:
        if kind == "ram" or blocks <= 0:
            continue
        tiers.append(_tier_entry(kind, blocks, menu, block_bytes, fenced == kind))
        k = menu.kind(kind)
        speeds[kind] = {"load_bandwidth": k.load_bandwidth, "load_latency": k.load_latency}
    cfg: dict[str, Any] = {
        "block_bytes": block_bytes,
        "cpu_bytes_to_use": tier_bytes("ram", max(stack.blocks("ram"), 1), block_bytes),
        "eviction_policy": policy,
        "write_policy": write_policy,
        "cost_model": {
            "prefill_seconds_per_token": menu.gpu.prefill_seconds_per_token,
            "tokens_per_block": tokens_per_block,
            "kv_bytes_per_token": kv_bytes_per_token,
            "tiers": speeds,
        },
    }
    if tiers:
        cfg["secondary_tiers"] = tiers
    return cfg
