"""One-pass LRU hit-ratio curve: the hit ratio of every capacity from one pass over the trace.

LRU has the *inclusion property* (Mattson et al., 1970): a reference hits an LRU cache of ``C``
blocks exactly when its **stack distance** — the number of distinct other blocks referenced since
the previous reference to the same block — is below ``C``. So one pass that computes every
reference's stack distance gives the hit count of every capacity at once: a histogram of distances,
cumulated.

The distances are computed without a per-reference Python loop. For the reference at position
``t`` whose previous reference is at ``p``, the distinct blocks seen strictly between them are the
positions ``j`` in ``(p, t)`` that are the *last* reference of their block before ``t``, i.e. whose
next reference ``next[j]`` is at or after ``t``::

    d(t) = (t - p - 1) - #{j in (p, t) : next[j] < t}
         = (t - p - 1) - (#{j : next[j] < t} - #{j < p : next[j] < t})

The first count is one ``searchsorted`` over the sorted ``next`` array. The second is a 2-D
dominance count; the prefix ``[0, p)`` splits into at most ``log2(N)`` aligned power-of-two blocks
(the ones a Fenwick tree would visit); at each level every block's ``next`` values are sorted (a
row sort that merges the previous level's sorted halves), so each query is one ``searchsorted``
per level.
Cost: ``O(N log^2 N)`` in numpy, a fraction of a second for the shipped trace's 288,500 references.

This is the **flat** view (every block its own request, in trace order: what libCacheSim sees). The
engine's request-level semantics (lookup a whole request, then store its misses) differ slightly;
docs/plan.md gives the difference on the shipped trace. The planner uses the curve to estimate and
prune its grid, and simulates the candidates through the real engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LruCurve", "lru_curve", "stack_distances"]

#: Stack distance of a first reference (a compulsory miss at every capacity).
COLD = -1


def _prev_next(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position: index of the previous reference to the same block (-1) and of the next (N)."""
    n = flat.size
    order = np.argsort(flat, kind="stable")
    ids = flat[order]
    same = ids[1:] == ids[:-1]
    prev = np.full(n, -1, dtype=np.int64)
    nxt = np.full(n, n, dtype=np.int64)
    prev[order[1:][same]] = order[:-1][same]
    nxt[order[:-1][same]] = order[1:][same]
    return prev, nxt


def stack_distances(flat: np.ndarray) -> np.ndarray:
    """LRU stack distance of every reference of ``flat`` (``-1`` for first references).

    ``flat`` is the block-id sequence (any integer dtype). A reference hits an LRU cache of ``C``
    blocks iff ``0 <= distance < C``.
    """
    seq = np.asarray(flat)
    n = int(seq.size)
    out = np.full(n, COLD, dtype=np.int64)
    if n == 0:
        return out
    prev, nxt = _prev_next(seq)
    q = np.flatnonzero(prev >= 0)  # positions t with a previous reference
    if q.size == 0:
        return out
    p = prev[q]
    before_t = np.searchsorted(np.sort(nxt), q, side="left")  # #{j : next[j] < t}
    before_p = np.zeros(q.size, dtype=np.int64)  # #{j < p : next[j] < t}
    block_of = np.arange(n, dtype=np.int64)
    stride = np.int64(n + 1)
    # vals: next[] with every aligned block of 2**level positions sorted in place. A level's blocks
    # are pairs of the previous level's (already sorted) blocks, so each level is a row sort of
    # short rows, not a sort of the whole array.
    vals = nxt.copy()
    level = 0
    while (1 << level) <= n:
        size = 1 << level
        if level:
            full = (n // size) * size
            vals[:full].reshape(-1, size).sort(axis=1, kind="stable")
            vals[full:].sort(kind="stable")
        bit = ((p >> level) & 1).astype(bool)
        if bit.any():
            # A query with this bit of p set counts the block just left of p's block, which lies
            # entirely in [0, p); block ids prefixed to the values make one sorted array to search.
            keys = (block_of >> level) * stride + vals
            blk = (p[bit] >> level) - 1
            found = np.searchsorted(keys, blk * stride + q[bit], side="left")
            before_p[bit] += found - (blk << level)
        level += 1
    out[q] = (q - p - 1) - (before_t - before_p)
    return out


@dataclass(frozen=True)
class LruCurve:
    """Hits of a flat LRU cache at every capacity, from :func:`stack_distances`.

    Attributes:
        refs: references in the sequence.
        unique: distinct blocks.
        cum_hits: ``cum_hits[c]`` = hits of an LRU cache of ``c`` blocks (``cum_hits[0] = 0``), for
            ``c`` up to ``unique`` (beyond it nothing changes).
    """

    refs: int
    unique: int
    cum_hits: np.ndarray

    def hits(self, capacity: int) -> int:
        """Hits of a flat LRU cache of ``capacity`` blocks."""
        c = max(0, min(int(capacity), self.cum_hits.size - 1))
        return int(self.cum_hits[c])

    def hit_ratio(self, capacity: int) -> float:
        return self.hits(capacity) / self.refs if self.refs else 0.0

    def hit_ratios(self, capacities: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`hit_ratio`."""
        c = np.clip(np.asarray(capacities, dtype=np.int64), 0, self.cum_hits.size - 1)
        return self.cum_hits[c] / max(self.refs, 1)


def lru_curve(flat: np.ndarray, distances: np.ndarray | None = None) -> LruCurve:
    """The :class:`LruCurve` of a block sequence (``distances`` when already computed)."""
    d = stack_distances(flat) if distances is None else distances
    unique = int((d == COLD).sum())
    warm = d[d >= 0]
    hist = (
        np.bincount(warm, minlength=unique + 1)[: unique + 1] if warm.size else np.zeros(unique + 1, np.int64)
    )
    # A reference at distance k hits every capacity > k: cum_hits[c] = #{k < c}.
    cum = np.concatenate(([0], np.cumsum(hist)[:unique])).astype(np.int64)
    return LruCurve(int(d.size), unique, cum)
