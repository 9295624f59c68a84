"""Deterministic synthetic KV payloads for real-mode replay.

Every block's bytes are a pure function of its key, so a replay can store a block, let the tiers move
it around (evict, write to disk, promote back) and check byte for byte that the block it loads is the
block it stored, without keeping a copy. The pattern mixes the key into every 16-byte lane with a
position-dependent mask, so a block served under the wrong key, shifted, truncated or partly zeroed
fails verification.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kvtier.keys import BlockKey

__all__ = ["PayloadFactory"]

U8 = npt.NDArray[np.uint8]


class PayloadFactory:
    """Builds and verifies the payload of blocks of ``block_bytes`` bytes.

    Keys shorter than 16 bytes are zero-padded, longer ones folded (XOR) into 16 bytes: any key works,
    and distinct 16-byte keys give distinct payloads.
    """

    def __init__(self, block_bytes: int) -> None:
        if block_bytes < 1:
            raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
        self.block_bytes = int(block_bytes)
        lanes = -(-self.block_bytes // 16)
        pos = np.arange(lanes * 16, dtype=np.uint32)
        # A multiplicative mask so that equal key bytes at different positions still differ.
        self._mask: U8 = ((pos * 2654435761) >> 13).astype(np.uint8)
        self._lanes = lanes

    def _key_matrix(self, keys: Sequence[BlockKey]) -> U8:
        out = np.zeros((len(keys), 16), dtype=np.uint8)
        for i, k in enumerate(keys):
            raw = np.frombuffer(bytes(k), dtype=np.uint8)
            if raw.size <= 16:
                out[i, : raw.size] = raw
            else:
                pad = np.zeros(-(-raw.size // 16) * 16, dtype=np.uint8)
                pad[: raw.size] = raw
                out[i] = np.bitwise_xor.reduce(pad.reshape(-1, 16), axis=0)
        return out

    def make(self, keys: Sequence[BlockKey], out: U8 | None = None) -> U8:
        """Payloads of ``keys`` as an ``(n, block_bytes)`` uint8 array (written into ``out`` if given)."""
        km = self._key_matrix(keys)
        full = np.tile(km, (1, self._lanes))
        np.bitwise_xor(full, self._mask, out=full)
        result = full[:, : self.block_bytes]
        if out is None:
            return np.ascontiguousarray(result)
        out[...] = result
        return out

    def mismatches(self, keys: Sequence[BlockKey], data: U8) -> list[int]:
        """Indexes ``i`` where ``data[i]`` is not the payload of ``keys[i]``."""
        if len(keys) == 0:
            return []
        expected = self.make(keys)
        bad = np.any(expected != data[: len(keys), : self.block_bytes], axis=1)
        return [int(i) for i in np.flatnonzero(bad)]
