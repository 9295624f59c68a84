"""What every kvtier tier must do inside vLLM 0.33, written once and run against each backend.

Each scenario takes one ``secondary_tiers`` entry (``{"type": "KvtierTier", "module_path":
"kvtier.integrations.vllm", "tier": ..., options}``) and builds vLLM's own spec, factory and
``TieringOffloadingManager`` around it (:mod:`vllm_helpers`), so vLLM's factory creates the tier from
``module_path`` and vLLM's manager drives it. vLLM's manager itself checks exactly-once reporting:
it asserts on a job id it does not know (a duplicate) and keeps a job it never hears of pending,
which :meth:`~vllm_helpers.VllmStack.settle` turns into a ``TimeoutError``.

Backends differ only in how a server is taken away, so the failure scenario takes ``kill`` and
``restore`` callables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from vllm_helpers import ADAPTER, VllmStack, assert_exact, offload_keys, vllm_stack

__all__ = [
    "load_until_hit",
    "remote_entry",
    "run_sharing_processes",
    "scenario_round_trip",
    "scenario_server_gone",
    "scenario_two_managers",
]

_CHILD = Path(__file__).with_name("vllm_share_proc.py")


def remote_entry(tier: str, **options: Any) -> dict[str, Any]:
    """A ``secondary_tiers`` entry loading kvtier tier ``tier`` through vLLM's factory."""
    return {**ADAPTER, "tier": tier, **options}


def load_until_hit(
    stack: VllmStack, keys: Sequence[bytes], timeout: float = 30.0
) -> dict[bytes, np.ndarray | None]:
    """Load ``keys`` again until all HIT or ``timeout`` passes (the last answers are returned).

    A remote tier answers MISS for a key it has not seen yet while it asks its server on a worker
    (vLLM reads MISS as "do not wait"); a later request finds it, as a later vLLM request would.
    """
    deadline = time.monotonic() + timeout
    while True:
        out = stack.load(keys)
        if all(v is not None for v in out.values()) or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


def scenario_round_trip(entry: Mapping[str, Any], *, salt: bytes, n: int = 6) -> None:
    """Store -> lookup HIT -> load into freshly overwritten chunks, byte for byte."""
    keys = offload_keys(n, salt=salt)
    with vllm_stack(tiers=[entry]) as stack:
        assert type(stack.tier).__name__ == "KvtierTier"
        assert stack.store(keys) == keys
        # Never held in a local: a live reference to the tier keeps vLLM's region mapped at close.
        assert stack.tier.kvtier_tier.get_stats()["stores"] == n, stack.tier.kvtier_tier.get_stats()
        stack.wipe_primary()  # vLLM's primary is empty and every chunk overwritten
        _assert_secondary_hit(stack, keys)
        assert_exact(load_until_hit(stack, keys), keys)
        assert stack.tier.kvtier_tier.get_stats()["loads"] == n


def _assert_secondary_hit(stack: VllmStack, keys: Sequence[bytes]) -> None:
    """The kvtier tier itself answers HIT for each stored key (what vLLM's manager asks it)."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    ctx = ReqContext(req_id="direct-lookup")
    with stack.manager.lock:
        answers = [stack.tier.lookup(k, ctx) for k in keys]
    assert answers == [LookupResult.HIT] * len(keys), answers


def scenario_two_managers(
    entry_a: Mapping[str, Any], entry_b: Mapping[str, Any] | None = None, *, salt: bytes, n: int = 4
) -> None:
    """Two vLLM managers alive at once on one store: each loads the other's blocks byte for byte."""
    mine, theirs = offload_keys(n, salt=salt + b"/a"), offload_keys(n, salt=salt + b"/b")
    with vllm_stack(tiers=[entry_a]) as a, vllm_stack(tiers=[entry_b or entry_a]) as b:
        assert a.config.engine_id != b.config.engine_id
        a.store(mine)
        b.store(theirs)
        assert_exact(load_until_hit(a, theirs), theirs)
        assert_exact(load_until_hit(b, mine), mine)


def scenario_server_gone(
    entry: Mapping[str, Any],
    kill: Callable[[], None],
    restore: Callable[[], None] | None,
    *,
    salt: bytes,
    bound_s: float = 20.0,
) -> dict[str, int]:
    """The server goes away between a store and a load, then comes back.

    While it is gone: lookups of stored keys end as MISS (a failed promotion or the tier's open
    breaker), new stores are failed jobs; every job is reported exactly once (vLLM's manager checks)
    and each request finishes within ``bound_s``. After ``restore`` a new block round-trips again.
    Returns the kvtier tier's counters seen while the server was gone.
    """
    keys = offload_keys(4, salt=salt)
    later = offload_keys(3, salt=salt + b"/later")
    with vllm_stack(tiers=[entry]) as stack:
        stack.store(keys)
        stack.wipe_primary()
        kill()
        t0 = time.monotonic()
        out = stack.load(keys, timeout=bound_s)
        assert out == {k: None for k in keys}, "a block served while its server was gone"
        stack.store(later)  # settles: every store job reported (vLLM asserts on a duplicate)
        assert stack.manager._jobs == {}
        stack.wipe_primary()  # vLLM's primary holds them; only the (failed) tier could serve them now
        assert stack.load(later, timeout=bound_s) == {k: None for k in later}
        assert time.monotonic() - t0 < bound_s, "requests did not finish while the server was gone"
        stats = dict(stack.tier.kvtier_tier.get_stats())
        if restore is not None:
            restore()
            again = offload_keys(2, salt=salt + b"/again")
            deadline = time.monotonic() + 30
            while True:  # the breaker lets a store through once its reset interval has passed
                stack.store(again)
                stack.wipe_primary()
                out = load_until_hit(stack, again, timeout=3)
                if all(v is not None for v in out.values()) or time.monotonic() > deadline:
                    break
            assert_exact(out, again)
    return stats


def run_sharing_processes(
    tiers: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]],
    sync_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    n: int = 5,
    timeout: float = 280.0,
) -> list[dict[str, Any]]:
    """Two processes, each its own vLLM stack on ``tiers``, hit each other's blocks byte for byte.

    Both are alive at once, as two vLLM instances would be (``vllm_share_proc.py``; ``sync_dir``
    holds their rendezvous files). ``tiers`` may map each process (``"a"``, ``"b"``) to its own
    list. Returns each process's report (``exact``; ``blocks_sent`` by its p2p block server).
    """
    path = os.pathsep.join([str(Path(__file__).parent), *sys.path])
    child_env = {**os.environ, **(env or {}), "PYTHONPATH": path}
    per = tiers if isinstance(tiers, Mapping) else {"a": tiers, "b": tiers}
    procs = [
        subprocess.Popen(
            [sys.executable, str(_CHILD), json.dumps(list(per[me])), str(sync_dir), me, other, str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env,
        )
        for me, other in (("a", "b"), ("b", "a"))
    ]
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            proc.kill()
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for result in results:
        assert result["exact"] == [True] * n, "a process missed or misread the other's blocks"
    return results
