"""Where a block lives on a striped fs tier: weighted rendezvous (highest-random-weight) hashing.

Each root gets a score per key, ``weight / -ln(u)`` with ``u`` a uniform number in (0, 1) drawn from
xxh3-64 of the root's stable id and the key; the key goes to the root with the highest score among
those admitted. Why rendezvous and not ``hash % n``: adding or removing a root moves only the keys
that the new root wins (or that the removed root held), in proportion to its weight, so a restart
with one disk more or less keeps every other block where it is (no rehash storm), and every process
with the same roots computes the same placement without talking to the others. Weights make a root
with twice the capacity receive twice the blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import xxhash

__all__ = ["Placement"]

_TWO64 = float(1 << 64)


class Placement:
    """Rendezvous placement over roots named by stable ids (their absolute paths).

    Args:
        ids: one stable id per root (the same root must keep its id across restarts).
        weights: relative capacity of each root (> 0).
    """

    def __init__(self, ids: Sequence[str], weights: Sequence[float]) -> None:
        if len(ids) != len(weights) or not ids:
            raise ValueError("one weight per root, at least one root")
        if any(not (w > 0 and math.isfinite(w)) for w in weights):
            raise ValueError(f"root weights must be finite and > 0, got {list(weights)}")
        total = float(sum(weights))
        self._seeds = [xxhash.xxh3_64_intdigest(i.encode()) for i in ids]
        self._weights = [w / total for w in weights]

    def score(self, root: int, key: bytes) -> float:
        """The key's score on ``root`` (higher wins)."""
        h = xxhash.xxh3_64_intdigest(key, seed=self._seeds[root])
        u = (h + 0.5) / _TWO64  # in (0, 1), never 0 or 1
        return self._weights[root] / -math.log(u)

    def choose(self, key: bytes, admitted: Sequence[int]) -> int | None:
        """The admitted root with the highest score for ``key`` (``None`` when none is admitted)."""
        return self.choose_two(key, admitted)[0]

    def choose_two(self, key: bytes, admitted: Sequence[int]) -> tuple[int | None, int | None]:
        """The admitted roots with the highest and the second-highest score for ``key``."""
        best, best_score, second, second_score = None, -1.0, None, -1.0
        for r in admitted:
            s = self.score(r, key)
            if s > best_score:
                best, best_score, second, second_score = r, s, best, best_score
            elif s > second_score:
                second, second_score = r, s
        return best, second
