"""The one-root fs tier's capacity as the simulator models it (the striped tier's model, built
from this one per root, is :mod:`kvtier.tiers.fs.striped_sim`)."""

from __future__ import annotations

from kvtier.tiers.base import SimulationRequest
from kvtier.tiers.fs.layout import SIM_KEY_BYTES, block_file_size
from kvtier.tiers.fs.options import SMALL_BLOCK_DEFAULT, segment_cap, small_block_limit
from kvtier.tiers.fs.segment_index import SEAL_BYTES, idx_bytes
from kvtier.tiers.fs.segments import record_size

__all__ = ["capacity_blocks"]


def capacity_blocks(request: SimulationRequest) -> int | None:
    """Blocks ``max_bytes`` holds (``None``: unbounded): ``max_bytes // file_size`` block files
    (header of a 16-byte key aligned to 4 KiB, then the payload), or on the small-block path as
    many records as the segments hold."""
    max_bytes, block_bytes, options = request.size("max_bytes"), request.block_bytes, request.options
    if max_bytes is None:
        return None
    per_file = block_file_size(SIM_KEY_BYTES, block_bytes)
    small = options.get("small_block_bytes", SMALL_BLOCK_DEFAULT)
    if block_bytes <= small_block_limit(small):
        # Small blocks live in segments: as many records as the segments hold. Approximate:
        # eviction there is by segment (live blocks copied), not block by block.
        rec = record_size(SIM_KEY_BYTES, block_bytes, bool(options.get("shared_root", False)))
        rec += idx_bytes(SIM_KEY_BYTES)
        cap = segment_cap(options.get("segment_bytes"), max_bytes, rec)
        if cap is not None:
            per_seg = max(1, (cap - SEAL_BYTES) // rec)
            return max((max_bytes // cap) * per_seg, 1)
    return max(max_bytes // per_file, 1)
