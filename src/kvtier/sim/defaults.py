"""What ``kvtier replay`` uses when given nothing: the shipped trace and a two-tier default stack.

The default stack is the smallest honest picture of kvtier: a primary tier in RAM in front of an
``fs`` tier in a temporary directory (removed afterwards), no server. Sizes are chosen so that, on the
shipped conversation trace (182,790 unique 512-token blocks), both tiers matter: the primary tier holds
5 % of the unique blocks and the disk tier 25 %, with 4 KiB synthetic blocks.

Blocks go to disk once they have been hit in RAM (``write_policy: after_hits``,
``write_after_hits: 1``): 63 % of this trace's blocks are never reused, and writing each of them
(write-through) is ~180,000 block files, minutes of disk I/O on a small machine, for a demo meant to
finish in well under a minute. Replay any other stack with ``--config``.
"""

from __future__ import annotations

import contextlib
import importlib.resources
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "SHIPPED_TRACE",
    "default_config",
    "default_simulate_config",
    "shipped_trace",
]

#: Payload bytes per block in replays unless ``--block-bytes`` or the config says otherwise.
DEFAULT_BLOCK_BYTES = 4096
#: File name of the trace shipped in ``kvtier/data``.
SHIPPED_TRACE = "conversation_trace.jsonl.gz"


@contextlib.contextmanager
def shipped_trace() -> Iterator[Path]:
    """Path of the shipped conversation trace (a real file for the duration of the ``with``)."""
    ref = importlib.resources.files("kvtier").joinpath("data").joinpath(SHIPPED_TRACE)
    with importlib.resources.as_file(ref) as path:
        yield Path(path)


def default_config(root_dir: str | Path, block_bytes: int = DEFAULT_BLOCK_BYTES) -> dict[str, Any]:
    """The default stack as a config mapping: RAM primary tier + ``fs`` tier under ``root_dir``.

    9,139 primary slots (5 % of the shipped trace's unique blocks) and an ``fs`` tier of 45,697
    blocks (25 %): each block file is a 4 KiB-aligned header plus the payload, and ``max_bytes``
    bounds file bytes. Blocks are written to the ``fs`` tier after their first hit.
    """
    row_stride = -(-block_bytes // 4096) * 4096
    return {
        "block_bytes": block_bytes,
        "cpu_bytes_to_use": 9139 * row_stride,
        "eviction_policy": "lru",
        "write_policy": "after_hits",
        "write_after_hits": 1,
        "secondary_tiers": [
            {
                "type": "fs",
                "root_dir": str(root_dir),
                "max_bytes": 45697 * (4096 + block_bytes),
                # A throw-away directory: the page cache is fine, O_DIRECT would only slow the demo.
                "direct_io": "never",
            },
        ],
    }


def default_simulate_config(block_bytes: int = DEFAULT_BLOCK_BYTES) -> dict[str, Any]:
    """What ``--simulate`` / ``--sweep`` replay without ``--config``: the primary tier alone.

    Simulation answers "how large a cache, which policy": one tier of ``--capacity`` blocks (9,139,
    5 % of the shipped trace's unique blocks, when not given), the setting of the README's reference
    figures. Pass ``--config`` to simulate a whole stack (secondary tiers are modelled).
    """
    row_stride = -(-block_bytes // 4096) * 4096
    return {"block_bytes": block_bytes, "cpu_bytes_to_use": 9139 * row_stride, "eviction_policy": "lru"}
