"""Built-in policies against libCacheSim 0.3.5 on the first 3,000 conversation-trace requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from needs import need_module

from kvtier.policies.arc import ARCPolicy
from kvtier.policies.base import CachePolicy
from kvtier.policies.lru import LRUPolicy
from kvtier.policies.prefix import PrefixAwarePolicy
from kvtier.policies.s3fifo import S3FIFOPolicy
from kvtier.policies.sieve import SIEVEPolicy
from kvtier.sim.evaluate import (
    flat_hits,
    lcs_flat_hit_ratio,
    lcs_prefix_replay,
    prefix_replay,
    write_oracle_general,
)
from kvtier.sim.trace import TraceRequest, flatten, read_trace

need_module("libcachesim", "dev")

TRACE = Path("/work/shared/traces/conversation_trace.jsonl")
if not TRACE.is_file():  # the packaged copy E ships, when the shared folder is absent
    TRACE = Path(__file__).parents[2] / "src" / "kvtier" / "data" / "conversation_trace.jsonl.gz"


@pytest.fixture(scope="module")
def trace3k(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[TraceRequest], np.ndarray, Path]:
    reqs = read_trace(TRACE, limit=3000)
    flat = flatten(reqs)
    path = write_oracle_general(flat, tmp_path_factory.mktemp("lcs") / "trace.oracleGeneral")
    return reqs, flat, path


CASES = [
    (LRUPolicy, "LRU", 0.0),
    (ARCPolicy, "ARC", 1e-4),
    (S3FIFOPolicy, "S3FIFO", 1e-4),
    (SIEVEPolicy, "Sieve", 1e-4),
]


@pytest.mark.parametrize("frac", [0.01, 0.10])
@pytest.mark.parametrize(("cls", "lcs_name", "tol"), CASES, ids=[c[1] for c in CASES])
def test_flat_hit_ratio_matches_libcachesim(
    trace3k: tuple[list[TraceRequest], np.ndarray, Path],
    cls: type[CachePolicy],
    lcs_name: str,
    tol: float,
    frac: float,
) -> None:
    _, flat, path = trace3k
    capacity = int(np.unique(flat).size * frac)
    ours = flat_hits(cls(capacity), flat) / flat.size
    ref = lcs_flat_hit_ratio(lcs_name, path, capacity)
    assert ref > 0.01
    if tol == 0.0:
        assert ours == pytest.approx(ref, rel=0, abs=1e-12)  # LRU: the same hits, exactly
    else:
        assert abs(ours - ref) <= tol


def test_prefix_replay_matches_libcachesim_for_lru(
    trace3k: tuple[list[TraceRequest], np.ndarray, Path],
) -> None:
    """The per-request procedure is the same on both sides: identical LRU figures."""
    reqs, flat, _ = trace3k
    capacity = int(np.unique(flat).size * 0.05)
    ours = prefix_replay(LRUPolicy(capacity), reqs)
    ref = lcs_prefix_replay("LRU", reqs, capacity)
    assert (ours.prefix_hits, ours.block_hits, ours.refs) == (ref.prefix_hits, ref.block_hits, ref.refs)


def test_s3fifo_tiny_cache_documented_difference(
    trace3k: tuple[list[TraceRequest], np.ndarray, Path],
) -> None:
    """libCacheSim's S3FIFO caches nothing below 20 blocks (its small FIFO would hold < 2);
    kvtier keeps a 1-block small FIFO and behaves like a cache. From 20 blocks on they agree."""
    _, flat, path = trace3k
    assert lcs_flat_hit_ratio("S3FIFO", path, 19) == 0.0
    assert flat_hits(S3FIFOPolicy(19), flat) / flat.size > 0.03
    ours20 = flat_hits(S3FIFOPolicy(20), flat) / flat.size
    assert abs(ours20 - lcs_flat_hit_ratio("S3FIFO", path, 20)) <= 1e-4


@pytest.mark.slow
def test_prefix_policy_beats_libcachesim_on_conversation_trace(tmp_path: Path) -> None:
    """Done-when: prefix-hit ratio above the best of six libCacheSim policies at 1 %, 5 %, 10 %.

    libCacheSim's prefix-hit ratio (``lcs_prefix_replay``) never exceeds its flat block-hit ratio: the
    probe has no side effects, so the cache sees exactly the flat sequence, and a prefix hit is a
    block hit. Beating the best *flat* ratio therefore beats the best prefix ratio, and the flat
    runs are ~10x cheaper (the bench reports the exact prefix figures).
    """
    reqs = read_trace(TRACE)
    flat = flatten(reqs)
    og = write_oracle_general(flat, tmp_path / "full.oracleGeneral")
    unique = int(np.unique(flat).size)
    for frac in (0.01, 0.05, 0.10):
        cap = int(unique * frac)
        ours = prefix_replay(PrefixAwarePolicy(cap), reqs).prefix_hit_ratio
        best_name, best = max(
            (
                (name, lcs_flat_hit_ratio(name, og, cap))
                for name in ("LRU", "ARC", "S3FIFO", "Sieve", "LIRS", "WTinyLFU")
            ),
            key=lambda nv: nv[1],
        )
        assert ours > best, f"{frac:.0%}: prefix {ours:.4f} <= libCacheSim {best_name} {best:.4f}"
