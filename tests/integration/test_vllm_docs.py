"""Every ``vllm serve ... --kv-transfer-config '{...}'`` block in docs/vllm.md works as written.

Each config passes ``kvtier check`` and is built by vLLM's own ``TieringOffloadingSpec`` (vLLM's
factory creates every tier in it, vLLM's fs tier included), then a request's blocks are stored and
loaded back byte for byte through vLLM's manager. Only ``root_dir`` (a temporary directory per
entry), ``max_bytes`` (64 MiB: kvtier refuses more than the file system holds) and
``cpu_bytes_to_use`` (16 chunks instead of gigabytes of /dev/shm) are changed. vLLM's
``OffloadingConfig`` is built by the test (vLLM derives it from a model and a GPU KV cache), so
top-level keys vLLM reads there (``block_size``) are not exercised by vLLM here.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_helpers import ROW_BYTES, VllmStack, offload_keys, offloading_config, payload

from kvtier.cli.check import check_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "vllm.md"
_SERVE = re.compile(r"^vllm serve \S+ --kv-transfer-config '(\{.*\})'$", re.MULTILINE)


def _configs() -> list[dict[str, Any]]:
    return [json.loads(m) for m in _SERVE.findall(DOC.read_text(encoding="utf-8"))]


def _localised(raw: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    extra = raw["kv_connector_extra_config"]
    for i, tier in enumerate(extra["secondary_tiers"]):
        if "root_dir" in tier:
            tier["root_dir"] = str(tmp_path / f"tier{i}")
        if "max_bytes" in tier:
            # The fs tier refuses a capacity larger than the file system holding its root; the
            # documented NVMe sizes exceed this machine's temporary directory.
            tier["max_bytes"] = "64MiB"
    return raw


def test_the_doc_has_configs_and_each_is_kvtier() -> None:
    configs = _configs()
    assert len(configs) >= 3
    for raw in configs:
        tiers = raw["kv_connector_extra_config"]["secondary_tiers"]
        assert any(t.get("module_path") == "kvtier.integrations.vllm" for t in tiers)


@pytest.mark.parametrize("index", range(len(_configs())))
def test_doc_config_passes_kvtier_check(index: int, tmp_path: Path) -> None:
    report = check_config(_localised(_configs()[index], tmp_path))
    assert report["ok"], report
    assert report["tiers"], "every doc config has a kvtier tier to check"


@pytest.mark.parametrize("index", range(len(_configs())))
def test_doc_config_runs_in_vllm(index: int, tmp_path: Path) -> None:
    from vllm_helpers import need_vllm

    need_vllm()
    raw = _localised(_configs()[index], tmp_path)
    extra = dict(raw["kv_connector_extra_config"], cpu_bytes_to_use=16 * ROW_BYTES)
    stack = VllmStack(offloading_config(extra))
    try:
        keys = offload_keys(3, salt=f"doc{index}".encode())
        stack.store(keys)
        kvtier_tiers = [t for t in stack.manager.secondary_tiers if type(t).__name__ == "KvtierTier"]
        assert kvtier_tiers and all(t.kvtier_tier.get_stats()["stores"] == 3 for t in kvtier_tiers)
        stack.wipe_primary()
        out = stack.load(keys)
        for key in keys:
            got = out[key]
            assert got is not None and np.array_equal(got, payload(key, got.size))
    finally:
        stack.close()
