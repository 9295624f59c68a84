"""What ``kvtier replay`` uses when given nothing: the shipped trace and a two-tier default stack.

The default stack is the smallest honest picture of kvtier: a primary tier in RAM in front of an
``fs`` tier in a temporary directory (removed afterwards), no server. Sizes are chosen so that, on the
shipped conversation trace (182,790 unique 512-token blocks), both tiers matter: the primary tier holds
about 2 % of the unique blocks and the disk tier about 25 %, with 4 KiB synthetic blocks.
"""

from __future__ import annotations

import contextlib
import importlib.resources
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_BLOCK_BYTES", "SHIPPED_TRACE", "default_config", "shipped_trace"]

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

    3,584 primary slots (~2 % of the shipped trace's unique blocks) and an ``fs`` tier of 45,696
    blocks (~25 %) at ``block_bytes`` each (file headers are small; the tier counts payload bytes).
    """
    row_stride = -(-block_bytes // 4096) * 4096
    return {
        "block_bytes": block_bytes,
        "cpu_bytes_to_use": 3584 * row_stride,
        "eviction_policy": "lru",
        "secondary_tiers": [
            {"type": "fs", "root_dir": str(root_dir), "max_bytes": 45696 * block_bytes},
        ],
    }
