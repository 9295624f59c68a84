"""A kvtier p2p peer for the vLLM tests: a real kvtier ``Engine`` holding blocks, served by kvtier's
real ``BlockServer`` on 127.0.0.1 in the test's process.

The server presents whatever namespace the test sets on :attr:`Peer.namespace` (a kvtier engine's
own namespace comes from its config; the vLLM side's from vLLM's layout, known once its stack
exists), so a test can point a vLLM instance, or ``kvtier check``, at it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from vllm_helpers import ROW_BYTES, payload

from kvtier.engine import Engine
from kvtier.keys import BlockKey
from kvtier.tiers.p2p.server import BlockServer

__all__ = ["Peer"]


class Peer:
    """An engine holding ``payload(key)`` for each of ``keys``, and its block server.

    The server reads ``namespace``, ``block_bytes``, ``primary_kv_view``, ``serving`` and
    ``complete_load`` of this object (kvtier's ``ServedEngine``); all but ``namespace`` are the
    engine's own.
    """

    def __init__(self, keys: Sequence[bytes], secret: str, *, block_bytes: int = ROW_BYTES) -> None:
        self.engine = Engine({"block_bytes": block_bytes, "cpu_bytes_to_use": block_bytes * (len(keys) + 8)})
        self.namespace = self.engine.namespace
        self.block_bytes = block_bytes
        self.primary_kv_view = self.engine.primary_kv_view
        self.serving = self.engine.serving
        try:
            if keys:
                data = np.stack([payload(k, block_bytes) for k in keys])
                assert self.engine.store_blocks([BlockKey(k) for k in keys], data) == len(keys)
            self.server = BlockServer(self, secret=secret.encode(), io_timeout=2.0)  # type: ignore[arg-type]
        except BaseException:
            self.engine.close()
            raise

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def complete_load(self, handle: Any) -> None:
        self.engine.complete_load(handle)

    def close(self) -> None:
        self.server.close()
        self.engine.close()
