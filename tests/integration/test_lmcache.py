"""kvtier as an LMCache L2 adapter, through LMCache 0.5.6's own code on CPU.

Every scenario runs in the LMCache venv (``KVTIER_TEST_LMCACHE_PYTHON``, built by ``.ci/run``):
LMCache's argument parser reads the exact ``--l2-adapter`` JSON and its plug-in factory builds the
adapter; the ``manager_*`` scenarios run LMCache's ``StorageManager`` (L1, store and prefetch
controllers) over it, the ``adapter_*`` ones make the controllers' calls directly to observe task
ids, eventfds, bitmaps and locks (see ``lmcache_scenarios.py``). Loopback only: the Redis tests
start their own redis-server on 127.0.0.1.
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
    return engine_python("LMCACHE")


def l2(tier: dict[str, Any], **params: Any) -> str:
    return json.dumps({
        "type": "plugin", "module_path": "kvtier.integrations.lmcache", "class_name": "KvtierL2Adapter",
        "adapter_params": {"tier": tier, **params},
    })  # fmt: skip


@pytest.mark.parametrize("kind", ["fs", "redis"])
def test_lmcache_storage_manager_round_trip_is_byte_exact(py: str, tmp_path: Path, kind: str) -> None:
    def go(raw: str) -> dict[str, Any]:
        return run_scenario(py, "lmcache_scenarios.py", "manager_round_trip", raw)

    if kind == "fs":
        out = go(l2({"type": "fs", "root_dir": str(tmp_path)}))
    else:
        with redis_server(tmp_path / "redis") as server:
            out = go(l2({"type": "redis", "url": server.url, "unknown_keys": "wait"}))
    assert out["stored"] == 4 and out["deleted"] == 4  # LMCache stored to L2, then dropped L1
    assert out["bits"] == [1, 1, 1, 1, 0]  # the prefetch loaded the 4 from kvtier, not the 5th
    assert out["exact"]
    assert out["usage_bytes"] == 4 * 32 * 1024  # _notify_keys_stored once per key, exact sizes
    assert out["locked"] == 0  # LMCache unlocked what its lookup locked
    assert out["tiers"] == [str(32 * 1024)]  # in place in LMCache's L1 arena: nothing staged


def test_adapter_task_model(py: str, tmp_path: Path) -> None:
    out = run_scenario(
        py, "lmcache_scenarios.py", "adapter_tasks", l2({"type": "fs", "root_dir": str(tmp_path)})
    )
    assert out["distinct_fds"]
    assert out["results"] == {"1": [True, 65536], "2": [True, 65536]}
    assert out["store_signals"] == 2 and out["popped_again"] == 0  # each task reported once, signalled once
    assert out["usage"] == 4 * 32 * 1024
    assert out["lookup_bits"] == [1, 0, 1] and out["lookup_signals"] == 1 and not out["lookup_again"]
    assert out["locks"] == [1, 0, 1] and out["locks_after_unlock"] == [0, 0, 0]
    assert out["load_bits"] == [1, 1, 1, 1, 0] and out["load_signals"] == 1
    assert out["exact"]


def test_one_task_with_two_cache_salts_keeps_them_apart(py: str, tmp_path: Path) -> None:
    raw = l2({"type": "fs", "root_dir": str(tmp_path)})
    out = run_scenario(py, "lmcache_scenarios.py", "mixed_salts", raw)
    assert out["store_ok"] and out["exact"] and out["batch_is_single"]
    assert out["lookup_bits"] == [0, 0, 1, 1]  # a stored hash under the other salt misses
    assert out["load_bits"] == [1, 1]


@pytest.mark.parametrize("kind", ["fs", "redis"])
def test_two_processes_share_blocks(py: str, tmp_path: Path, kind: str) -> None:
    def both(raw: str) -> tuple[dict[str, Any], dict[str, Any]]:
        w = run_scenario(py, "lmcache_scenarios.py", "manager_writer", raw, "31")
        return w, run_scenario(py, "lmcache_scenarios.py", "manager_reader", raw, "31")

    if kind == "fs":
        w, r = both(l2({"type": "fs", "root_dir": str(tmp_path)}))
    else:
        with redis_server(tmp_path / "redis") as server:
            w, r = both(l2({"type": "redis", "url": server.url, "unknown_keys": "wait"}))
    assert w["stored"] == 3
    assert r["bits"] == [1, 1, 1] and r["digest"] == w["digest"]


def test_two_tenants_never_share(py: str, tmp_path: Path) -> None:
    tier = {"type": "fs", "root_dir": str(tmp_path)}
    w = run_scenario(py, "lmcache_scenarios.py", "manager_writer", l2(tier, tenant="acme"), "32")
    other = run_scenario(py, "lmcache_scenarios.py", "manager_reader", l2(tier, tenant="globex"), "32")
    salted = run_scenario(
        py, "lmcache_scenarios.py", "manager_reader", l2(tier, tenant="acme"), "32", "user7"
    )
    same = run_scenario(py, "lmcache_scenarios.py", "manager_reader", l2(tier, tenant="acme"), "32")
    assert w["stored"] == 3
    assert other["bits"] == [0, 0, 0] and salted["bits"] == [0, 0, 0]  # another tenant, another cache_salt
    assert same["bits"] == [1, 1, 1] and same["digest"] == w["digest"]


def test_tier_down_means_misses_within_the_deadline(py: str, tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        url = server.url
    raw = l2({"type": "redis", "url": url, "op_timeout": 0.3, "unknown_keys": "wait"}, deadline=1.0)
    out = run_scenario(py, "lmcache_scenarios.py", "adapter_down", raw)
    assert out["store_ok"] is False and out["lookup_bits"] == [0, 0] and out["load_bits"] == [0, 0]
    assert out["seconds"] < 10
