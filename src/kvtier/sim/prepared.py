"""A trace turned into engine keys once (:class:`PreparedTrace`), shared by every replay of a sweep.

:func:`prepare_trace` hashes each distinct block id of a trace once (``namespace.trace_keys``) and
records each block's prefix info, tokens of the last block, timestamps and tenants; the replay
driver (:mod:`kvtier.sim.replay`) and its loops (:mod:`kvtier.sim.replay_loops`) read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvtier.keys import BlockInfo, BlockKey, KeyNamespace
from kvtier.sim.trace import TraceRequest, flatten

__all__ = ["PreparedTrace", "prepare_trace"]


@dataclass(frozen=True, slots=True)
class PreparedTrace:
    """A trace turned into engine keys once, so every replay of a sweep reuses the work.

    Attributes:
        name: label for reports (file name).
        keys: per request, its block keys in prefix order.
        infos: per request, a :class:`BlockInfo` per block (parent, depth, tenant) for prefix-aware and
            per-tenant policies.
        last_tokens: per request, tokens in its last block (``tokens_per_block`` when unknown).
        timestamps: per request, arrival time in seconds (the simulate clock).
        tenants: per request, its tenant or ``None``.
        flat: every block id of every request, in order (the flat sequence OPT and libCacheSim see).
        tokens_per_block: tokens per full block (512 in the Mooncake traces).
        ceiling: infinite-cache hit ratios and the unique block count, computed once by
            :func:`prepare_trace`.
        dense: ``ids`` (int32, one per block reference, ``0..n-1`` per distinct key) and ``offsets``
            (int64, request ``r`` is ``ids[offsets[r]:offsets[r+1]]``) for the fast simulate core
            (:mod:`kvtier.sim.fastcore`); filled by :func:`prepare_trace` or on first use.
    """

    name: str
    keys: list[list[BlockKey]]
    infos: list[list[BlockInfo]]
    last_tokens: list[int]
    timestamps: list[float]
    tenants: list[str | None]
    flat: np.ndarray
    tokens_per_block: int
    ceiling: dict[str, float] = field(default_factory=dict)
    dense: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return len(self.keys)

    @property
    def block_refs(self) -> int:
        return int(self.flat.size)

    @property
    def unique_blocks(self) -> int:
        if "unique_blocks" in self.ceiling:
            return int(self.ceiling["unique_blocks"])
        return int(np.unique(self.flat).size)

    @property
    def tokens(self) -> int:
        tpb = self.tokens_per_block
        return sum(
            (len(k) - 1) * tpb + last for k, last in zip(self.keys, self.last_tokens, strict=True) if k
        )

    def dense_ids(self) -> tuple[np.ndarray, np.ndarray, int]:
        """``(ids, offsets, distinct keys)``: each key as a dense int32 id, requests as offsets."""
        if "ids" not in self.dense:
            id_of: dict[BlockKey, int] = {}
            ids = [id_of.setdefault(k, len(id_of)) for ks in self.keys for k in ks]
            self.dense["ids"] = np.asarray(ids, dtype=np.int32)
            self.dense["nuniq"] = np.asarray(len(id_of))
        if "offsets" not in self.dense:
            offs = np.zeros(len(self.keys) + 1, dtype=np.int64)
            np.cumsum([len(k) for k in self.keys], out=offs[1:])
            self.dense["offsets"] = offs
        return self.dense["ids"], self.dense["offsets"], int(self.dense["nuniq"])

    def infinite(self) -> dict[str, float]:
        """Hit ratios of an unbounded cache (every re-reference hits): ``block`` and ``token``."""
        if "block" in self.ceiling:
            return {"block": self.ceiling["block"], "token": self.ceiling["token"]}
        seen: set[BlockKey] = set()
        hits = tok_hits = tokens = 0
        tpb = self.tokens_per_block
        for keys, last in zip(self.keys, self.last_tokens, strict=True):
            n = len(keys)
            for j, k in enumerate(keys):
                t = last if j == n - 1 else tpb
                tokens += t
                if k in seen:
                    hits += 1
                    tok_hits += t
                else:
                    seen.add(k)
        refs = max(self.block_refs, 1)
        return {"block": hits / refs, "token": tok_hits / max(tokens, 1)}


def prepare_trace(
    requests: Sequence[TraceRequest],
    namespace: KeyNamespace,
    *,
    name: str = "trace",
    tokens_per_block: int = 512,
) -> PreparedTrace:
    """Map each request's block ids to engine keys (``namespace.trace_keys``) and prefix infos.

    Each distinct id is hashed once; a block's ``BlockInfo`` names its predecessor in the request as
    parent and its position as depth (the same for every request sharing the prefix, since ids chain).
    """
    ids = flatten(requests)
    uniq, inverse = np.unique(ids, return_inverse=True)
    key_of = dict(zip(uniq.tolist(), namespace.trace_keys(uniq.tolist()), strict=True))
    info_of: dict[tuple[int, str | None], BlockInfo] = {}
    keys: list[list[BlockKey]] = []
    infos: list[list[BlockInfo]] = []
    last_tokens: list[int] = []
    timestamps: list[float] = []
    tenants: list[str | None] = []
    for r in requests:
        rk = [key_of[b] for b in r.blocks]
        ri: list[BlockInfo] = []
        parent: BlockKey | None = None
        for depth, (b, k) in enumerate(zip(r.blocks, rk, strict=True)):
            info = info_of.get((b, r.tenant))
            if info is None:
                info = BlockInfo(parent=parent, depth=depth, tenant=r.tenant)
                info_of[(b, r.tenant)] = info
            ri.append(info)
            parent = k
        keys.append(rk)
        infos.append(ri)
        last = tokens_per_block
        if r.input_length is not None and r.blocks:
            rest = r.input_length - (len(r.blocks) - 1) * tokens_per_block
            if 0 < rest <= tokens_per_block:
                last = rest
        last_tokens.append(last)
        timestamps.append(r.timestamp_ms / 1000.0)
        tenants.append(r.tenant)
    prepared = PreparedTrace(name, keys, infos, last_tokens, timestamps, tenants, ids, tokens_per_block)
    prepared.ceiling.update(prepared.infinite())
    prepared.ceiling["unique_blocks"] = float(uniq.size)
    # Keys are one per distinct id (trace_keys is injective), so the id's rank is a dense key id.
    prepared.dense["ids"] = inverse.astype(np.int32).reshape(-1)
    prepared.dense["nuniq"] = np.asarray(uniq.size)
    return prepared
