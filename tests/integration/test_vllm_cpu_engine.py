"""A running vLLM engine (vLLM's CPU build) serving real requests from kvtier's tiers.

Each scenario is one engine process (``vllm_cpu_driver.py``) whose results several tests read, so a
module starts as few engines as it can. The model is a random-weight Llama built at test time
(``examples/make_tiny_llama.py``); prompts are token ids, 2,000 tokens = 62 full 32-token blocks.

What "served by kvtier" means here: after ``reset_prefix_cache(reset_connector=True)`` vLLM's GPU-side
prefix cache and its CPU primary tier are empty, so cached tokens can only come from the secondary
tier, and kvtier's own counters say it loaded them. The reference output is the same process's
prefix-cache hit (a full prefill differs from any cached path by one bf16 rounding step).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from vllm_cpu import (
    BLOCK_TOKENS,
    kv_config,
    kvtier_defects,
    prompt,
    run_driver,
    shared_model,
    shm_leftovers,
)

pytestmark = pytest.mark.slow

TOKENS = 2000
FULL_BLOCKS = TOKENS // BLOCK_TOKENS  # 62
PRIMARY_BYTES = 64 << 20
ADAPTER = {"type": "KvtierTier", "module_path": "kvtier.integrations.vllm", "tier": "fs", "max_bytes": "1GiB"}
PROMPT = prompt(1, TOKENS)


def _eviction_steps() -> list[dict[str, Any]]:
    """Cold prefill; the same prompt again (vLLM's own prefix-cache hit: the reference); the stores'
    cascade to the secondary tier finished; both of vLLM's caches reset; the prompt again (only the
    secondary tier can serve it); kvtier's counters."""
    return [
        {"op": "generate", "prompts": [PROMPT]},
        {"op": "generate", "prompts": [PROMPT]},
        {"op": "settle"},
        {"op": "reset", "connector": True},
        {"op": "generate", "prompts": [PROMPT]},
        {"op": "stats"},
    ]


class Run:
    """One finished engine process: its step results by op, its log, its engine id."""

    def __init__(self, results: list[dict[str, Any]], log: str, engine_id: str) -> None:
        self.results, self.log, self.engine_id = results, log, engine_id

    def generated(self) -> list[dict[str, Any]]:
        return [r for step in self.results if step["op"] == "generate" for r in step["result"]]

    def stats(self) -> list[dict[str, Any]]:
        return [step["result"] for step in self.results if step["op"] == "stats"]


def _run(tmp: Path, model: Path, extra: dict[str, Any], steps: list[dict[str, Any]]) -> Run:
    engine_id = f"kvtier-test-{uuid.uuid4().hex[:12]}"
    scenario = {
        "model": str(model),
        "engine": {"kv_transfer_config": kv_config(extra, engine_id)},
        "steps": steps,
    }
    results, log = run_driver(scenario, tmp)
    return Run(results, log, engine_id)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def fs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kvtier-fs")


@pytest.fixture(scope="module")
def tiering_run(model: Path, fs_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """vLLM's tiering (its CPU primary tier) with kvtier's fs tier behind it, on vLLM's CPU backend."""
    extra = {
        "spec_name": "KvtierCPUTieringSpec",
        "spec_module_path": "kvtier.integrations.vllm",
        "cpu_bytes_to_use": PRIMARY_BYTES,
        "secondary_tiers": [{**ADAPTER, "root_dir": str(fs_root)}],
    }
    return _run(tmp_path_factory.mktemp("tiering"), model, extra, _eviction_steps())


@pytest.fixture(scope="module")
def spec_run(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """kvtier's whole engine as vLLM's offloading manager, fs tier behind it, on vLLM's CPU backend."""
    root = tmp_path_factory.mktemp("kvtier-spec-fs")
    extra = {
        "spec_name": "KvtierCPUOffloadingSpec",
        "spec_module_path": "kvtier.integrations.vllm",
        "cpu_bytes_to_use": PRIMARY_BYTES,
        "kvtier": {"secondary_tiers": [{"type": "fs", "root_dir": str(root), "max_bytes": "1GiB"}]},
    }
    return _run(tmp_path_factory.mktemp("spec"), model, extra, _eviction_steps())


def _assert_served_by_kvtier(run: Run, loads: int) -> None:
    cold, reference, served = run.generated()
    assert cold["num_cached_tokens"] == 0, "the first request has nothing cached"
    assert reference["num_cached_tokens"] >= FULL_BLOCKS * BLOCK_TOKENS - BLOCK_TOKENS
    # Both of vLLM's caches were reset: these cached tokens came through the connector from kvtier.
    assert served["num_cached_tokens"] >= FULL_BLOCKS * BLOCK_TOKENS - BLOCK_TOKENS, served
    assert loads >= FULL_BLOCKS - 1, f"kvtier loaded {loads} blocks"
    assert served["token_ids"] == reference["token_ids"]
    assert served["logprobs"].keys() == reference["logprobs"].keys()
    for token, logprob in reference["logprobs"].items():
        assert served["logprobs"][token] == pytest.approx(logprob, abs=1e-6), token


def _assert_clean_shutdown(run: Run) -> None:
    assert run.results[-1]["op"] == "shutdown"
    defects = kvtier_defects(run.log)
    assert not defects, "\n".join(defects[:20])
    assert shm_leftovers(run.engine_id) == []


def test_kvtier_tier_serves_a_repeated_prompt_after_vllm_evicted_it(tiering_run: Run) -> None:
    (stats,) = tiering_run.stats()
    assert stats["manager"] == "TieringOffloadingManager"
    _assert_served_by_kvtier(tiering_run, stats["tiers"]["kvtier-fs"]["loads"])


def test_kvtier_spec_serves_a_repeated_prompt_after_vllm_evicted_it(spec_run: Run) -> None:
    (stats,) = spec_run.stats()
    assert stats["manager"] == "KvtierOffloadingManager"
    (fs,) = stats["tiers"].values()
    _assert_served_by_kvtier(spec_run, fs["loads"])


def test_engine_shutdown_is_clean(tiering_run: Run, spec_run: Run) -> None:
    _assert_clean_shutdown(tiering_run)
    _assert_clean_shutdown(spec_run)


def test_warm_restart_hits_on_the_first_request(
    tiering_run: Run, model: Path, fs_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A new engine process on the fs root the first one filled: its very first request is served."""
    extra = {
        "spec_name": "KvtierCPUTieringSpec",
        "spec_module_path": "kvtier.integrations.vllm",
        "cpu_bytes_to_use": PRIMARY_BYTES,
        "secondary_tiers": [{**ADAPTER, "root_dir": str(fs_root)}],
    }
    reference = tiering_run.generated()[1]
    run = _run(
        tmp_path_factory.mktemp("restart"),
        model,
        extra,
        [{"op": "generate", "prompts": [PROMPT]}, {"op": "stats"}],
    )
    (first,) = run.generated()
    assert first["num_cached_tokens"] >= FULL_BLOCKS * BLOCK_TOKENS - BLOCK_TOKENS
    assert run.stats()[0]["tiers"]["kvtier-fs"]["loads"] >= FULL_BLOCKS - 1
    assert first["token_ids"] == reference["token_ids"]
    for token, logprob in reference["logprobs"].items():
        assert first["logprobs"][token] == pytest.approx(logprob, abs=1e-6), token
    _assert_clean_shutdown(run)
