"""kvtier as SGLang HiCache's storage backend, through SGLang 0.5.23's own code on CPU.

Every scenario runs in the SGLang venv (``KVTIER_TEST_SGLANG_PYTHON``, built by ``.ci/run``):
SGLang's argument parser reads the exact ``--hicache-storage-backend-extra-config`` JSON, SGLang's
``StorageBackendFactory`` builds the backend, and the calls are the cache controller's, on SGLang's
own host KV pool (see ``sglang_scenarios.py`` for what is and is not run). Loopback only: the Redis
tests start their own redis-server on 127.0.0.1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_venvs import engine_python, run_scenario
from remote_servers import redis_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def py() -> str:
    return engine_python("SGLANG")


def extra(tier: dict[str, Any], **more: Any) -> str:
    cfg = {
        "backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
        "class_name": "KvtierHiCacheStorage", "interface_v1": 1, "tier": tier, **more,
    }  # fmt: skip
    return json.dumps(cfg)


def test_fs_round_trip_is_byte_exact(py: str, tmp_path: Path) -> None:
    out = run_scenario(
        py, "sglang_scenarios.py", "round_trip", extra({"type": "fs", "root_dir": str(tmp_path)})
    )
    assert out["stored"] == [True] * 6 and out["loaded"] == [True] * 6
    assert out["hit"] == 6  # the 7th key was never stored: the leading run stops there
    assert out["exact"]
    assert out["parts"] == 2  # page_first MHA: one K and one V row per page, each one block
    assert out["backup_pgs"] == 6 and out["prefetch_pgs"] == 6  # SGLang's StorageMetrics
    assert out["kvtier"]["stored_blocks"] == 12 and out["kvtier"]["failed_blocks"] == 0


def test_host_indices_outside_the_pool_move_nothing(py: str, tmp_path: Path) -> None:
    raw = extra({"type": "fs", "root_dir": str(tmp_path)})
    out = run_scenario(py, "sglang_scenarios.py", "foreign_indices", raw)
    assert out["past_end"] == [[False, False], [False, False]]
    assert out["unaligned"] == [[False, False], [False, False]]
    assert out["stored_before"] == 0 and out["hit_before"] == 0
    assert out["stored"] == [True, True] and out["loaded"] == [True, True] and out["exact"]


def test_layer_first_pool_round_trip(py: str, tmp_path: Path) -> None:
    raw = extra({"type": "fs", "root_dir": str(tmp_path)})
    out = run_scenario(py, "sglang_scenarios.py", "round_trip", raw, "layer_first")
    assert out["exact"] and out["hit"] == 6 and out["parts"] == 4  # 2 layers x (K, V)


def test_redis_round_trip_is_byte_exact(py: str, tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        raw = extra({"type": "redis", "url": server.url, "unknown_keys": "wait"})
        out = run_scenario(py, "sglang_scenarios.py", "round_trip", raw)
    assert out["exact"] and out["hit"] == 6 and out["loaded"] == [True] * 6


def test_batch_exists_is_the_leading_run(py: str, tmp_path: Path) -> None:
    out = run_scenario(
        py, "sglang_scenarios.py", "leading_run", extra({"type": "fs", "root_dir": str(tmp_path)})
    )
    assert out == {"run": 2, "first_missing": 0}


@pytest.mark.parametrize("kind", ["fs", "redis"])
def test_two_processes_share_blocks(py: str, tmp_path: Path, kind: str) -> None:
    def both(raw: str) -> tuple[dict[str, Any], dict[str, Any]]:
        w = run_scenario(py, "sglang_scenarios.py", "writer", raw, "77")
        return w, run_scenario(py, "sglang_scenarios.py", "reader", raw, "77")

    if kind == "fs":
        w, r = both(extra({"type": "fs", "root_dir": str(tmp_path)}))
    else:
        with redis_server(tmp_path / "redis") as server:
            w, r = both(extra({"type": "redis", "url": server.url, "unknown_keys": "wait"}))
    assert w["stored"] == [True] * 5
    assert r["hit"] == 5 and r["loaded"] == [True] * 5 and r["digest"] == w["digest"]


def test_two_tenants_never_share(py: str, tmp_path: Path) -> None:
    tier = {"type": "fs", "root_dir": str(tmp_path)}
    w = run_scenario(py, "sglang_scenarios.py", "writer", extra(tier, tenant="acme"), "78")
    other = run_scenario(py, "sglang_scenarios.py", "reader", extra(tier, tenant="globex"), "78")
    same = run_scenario(py, "sglang_scenarios.py", "reader", extra(tier, tenant="acme"), "78")
    assert w["stored"] == [True] * 5
    assert other["hit"] == 0 and other["loaded"] == []
    assert same["hit"] == 5 and same["digest"] == w["digest"]


def test_tier_down_means_misses_within_the_deadline(py: str, tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        url = server.url
    # The server is gone: nothing listens on the port any more.
    raw = extra({"type": "redis", "url": url, "op_timeout": 0.3, "unknown_keys": "wait"}, deadline=1.0)
    out = run_scenario(py, "sglang_scenarios.py", "down", raw)
    assert out["stored"] == [False] * 3 and out["hit"] == 0 and out["loaded"] == [False] * 3
    assert out["seconds"] < 10  # build + three calls, each bounded by the 1 s deadline


@pytest.mark.parametrize(("mla", "rank1_hits"), [("0", 0), ("1", 3)])
def test_keys_follow_sglangs_tp_rank_rule(py: str, tmp_path: Path, mla: str, rank1_hits: int) -> None:
    """MHA KV differs per TP rank (never shared); MLA KV is replicated, so rank 1 reads rank 0's."""
    out = run_scenario(
        py, "sglang_scenarios.py", "ranks", extra({"type": "fs", "root_dir": str(tmp_path)}), mla
    )
    assert out["rank0"] == 3 and out["rank1"] == rank1_hits


def test_hybrid_pools_are_refused_with_the_reason(py: str, tmp_path: Path) -> None:
    out = run_scenario(
        py, "sglang_scenarios.py", "refuse_v2", extra({"type": "fs", "root_dir": str(tmp_path)})
    )
    assert out["refused"] and "v2 interface" in out["refused"]


def test_legacy_path_round_trips(py: str, tmp_path: Path) -> None:
    out = run_scenario(py, "sglang_scenarios.py", "legacy", extra({"type": "fs", "root_dir": str(tmp_path)}))
    assert out == {"stored": True, "exact": True}
