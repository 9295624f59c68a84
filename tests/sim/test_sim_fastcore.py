"""The fast simulate core (kvtier.sim.fastcore) makes exactly the engine's decisions.

Three implementations are compared on random traces (arbitrary ids, repeats inside a request,
requests larger than the cache, partial last blocks): the real engine (``replay(fast=False)``), the
compiled core and its pure-Python twin. Every tally of the report must be equal, counters included.
The compiled core needs a C compiler; without one its cases skip locally (CI has one) and the
Python twin is still compared with the engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import load_config
from kvtier.keys import KeyNamespace
from kvtier.sim import fastcore
from kvtier.sim.replay import fast_path_refusal, prepare_trace, replay
from kvtier.sim.sweep import capacity_config
from kvtier.sim.trace import TraceRequest

SIM = load_config({"block_bytes": 4096, "primary_backing": "none"})
NS = KeyNamespace.from_config(SIM, block_size=512)


def _tallies(rep: object) -> tuple[object, ...]:
    t = rep.tiers[0]  # type: ignore[attr-defined]
    return (
        rep.block_hits,  # type: ignore[attr-defined]
        rep.prefix_hits,  # type: ignore[attr-defined]
        rep.token_hits,  # type: ignore[attr-defined]
        rep.prefix_token_hits,  # type: ignore[attr-defined]
        round(rep.cost["saved_seconds"], 9),  # type: ignore[attr-defined]
        t.name,
        t.type,
        t.hits,
        t.lookups,
        t.evictions,
        t.dropped_stores,
        t.bytes_read,
        t.bytes_written,
    )


def _has_c() -> bool:
    return fastcore.core_name() == "c"


requests_st = st.lists(
    st.tuples(
        st.lists(st.integers(0, 40), min_size=1, max_size=12),  # block ids (repeats allowed)
        st.integers(1, 512),  # tokens in the last block
    ),
    min_size=1,
    max_size=50,
)


@settings(max_examples=120, deadline=None)
@given(reqs=requests_st, capacity=st.integers(1, 25), policy=st.sampled_from(sorted(fastcore.POLICIES)))
def test_fast_cores_equal_the_engine(reqs: list[tuple[list[int], int]], capacity: int, policy: str) -> None:
    trace = prepare_trace(
        [
            TraceRequest(timestamp_ms=float(i), blocks=tuple(b), input_length=(len(b) - 1) * 512 + last)
            for i, (b, last) in enumerate(reqs)
        ],
        NS,
    )
    cfg = capacity_config(SIM, capacity, policy)
    assert fast_path_refusal(cfg, trace, None, None) is None
    engine = replay(trace, cfg, simulate=True, fast=False)
    fast = replay(trace, cfg, simulate=True)
    assert _tallies(fast) == _tallies(engine)
    ids, offs, nuniq = trace.dense_ids()
    py = fastcore.simulate_ids(policy, ids, offs, nuniq, capacity, core="python")
    assert py.evictions == engine.tiers[0].evictions and py.dropped == engine.tiers[0].dropped_stores
    assert int(py.hits.sum()) == engine.block_hits and int(py.prefix.sum()) == engine.prefix_hits
    if _has_c():
        c = fastcore.simulate_ids(policy, ids, offs, nuniq, capacity, core="c")
        assert (c.hits == py.hits).all() and (c.prefix == py.prefix).all()
        assert (c.last_hit == py.last_hit).all() and (c.evictions, c.stores) == (py.evictions, py.stores)


def test_what_the_fast_path_refuses() -> None:
    trace = prepare_trace([TraceRequest(timestamp_ms=0.0, blocks=(1, 2), tenant="a")], NS)
    plain = prepare_trace([TraceRequest(timestamp_ms=0.0, blocks=(1, 2))], NS)
    assert fast_path_refusal(capacity_config(SIM, 4, "lru"), trace, None, None) == "tenants"
    assert "no fast path" in str(fast_path_refusal(capacity_config(SIM, 4, "prefix"), plain, None, None))
    assert fast_path_refusal(capacity_config(SIM, 4, "lru"), plain, None, 0) is not None
    # A refused replay still runs (on the engine) and gives the same answer as an accepted one.
    assert replay(trace, capacity_config(SIM, 4, "lru"), simulate=True).block_hits == 0


def test_no_compiler_falls_back_to_python(tmp_path: Path) -> None:
    """A fresh process with no compiler on PATH and an empty cache runs the Python twin."""
    code = (
        "from kvtier.sim import fastcore; import numpy as np;"
        "r = fastcore.simulate_ids('lru', np.array([0,1,0,1]), np.array([0,2,4]), 2, 2);"
        "print(fastcore.core_name(), r.core, int(r.hits.sum()))"
    )
    env = {**os.environ, "PATH": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"), "CC": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["python", "python", "2"]


def test_compiled_core_is_cached_privately(tmp_path: Path) -> None:
    if not _has_c():
        pytest.skip("no C compiler here: the compiled core cannot be built (the Python twin is tested)")
    code = "from kvtier.sim import fastcore; print(fastcore.core_name())"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "c"
    d = tmp_path / "kvtier"
    assert d.stat().st_mode & 0o777 == 0o700
    libs = list(d.glob("fastcore-*.so"))
    assert len(libs) == 1 and libs[0].stat().st_mode & 0o777 == 0o600
    # A cache directory others can write is not trusted: the core is not loaded from it.
    d.chmod(0o777)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "python"
