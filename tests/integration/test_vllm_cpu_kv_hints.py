"""vLLM's ``kv_hints`` on a running engine (vLLM's CPU build): a pinned prompt survives a flood.

One engine process (``vllm_cpu_driver.py``) with kvtier's whole engine as vLLM's offloading manager
(``KvtierCPUOffloadingSpec``) and a primary tier of 200 chunks. Prompt A is submitted through
``LLMEngine.add_request(..., kv_hints=KvHintsEnvelope(...))`` with kvtier's ``kvtier.pin`` action;
prompt D, the control, without. Three more prompts then need more chunks than D and the free room
hold. After vLLM's own (GPU-side) prefix cache is reset, only kvtier's primary tier can serve a
prompt: A comes back whole, D does not. Nothing is faked: request path, scheduler, connector,
manager and worker are vLLM's (its CPU build); the model is a random-weight Llama.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from vllm_cpu import BLOCK_TOKENS, kv_config, kvtier_defects, prompt, run_driver, shared_model, shm_leftovers

pytestmark = pytest.mark.slow

TOKENS = 2000
FULL_BLOCKS = TOKENS // BLOCK_TOKENS  # 62
CHUNK_BYTES = 65536  # one 32-token block of the tiny model (test_vllm_cpu_race.py checks it)
CHUNKS = 200
HINTS = {
    "protocol_version": "0.1",
    "message_id": "keep-a",
    "actions": [
        {
            "action_id": "pin-a",
            "action_type": "kvtier.pin",
            "action_version": "1.0",
            "payload": {"ttl_s": 600},
        }
    ],
}
A, D = prompt(21, TOKENS), prompt(22, TOKENS)
FLOOD = [prompt(seed, TOKENS) for seed in (23, 24, 25)]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], str, str]:
    tmp = tmp_path_factory.mktemp("kv-hints")
    model = shared_model(tmp_path_factory.mktemp("model"))
    engine_id = f"kvtier-hints-{uuid.uuid4().hex[:8]}"
    extra = {
        "spec_name": "KvtierCPUOffloadingSpec",
        "spec_module_path": "kvtier.integrations.vllm",
        "cpu_bytes_to_use": CHUNKS * CHUNK_BYTES,
        "kvtier": {"eviction_policy": "prefix", "pin_share": 0.5},
    }
    steps: list[dict[str, Any]] = [
        {"op": "generate_hinted", "prompts": [A], "kv_hints": HINTS},
        {"op": "settle"},
        {"op": "generate", "prompts": [D]},
        {"op": "settle"},
    ]
    for p in FLOOD:
        steps += [{"op": "generate", "prompts": [p]}, {"op": "settle"}]
    steps += [
        {"op": "stats"},
        {"op": "reset", "connector": False},  # vLLM's GPU-side prefix cache only
        {"op": "generate", "prompts": [A, D]},
    ]
    scenario = {
        "model": str(model),
        "engine": {"kv_transfer_config": kv_config(extra, engine_id)},
        "steps": steps,
    }
    results, log = run_driver(scenario, tmp)
    return results, log, engine_id


def test_a_kv_hints_pin_keeps_a_prompt_in_kvtiers_primary_through_a_flood(
    run: tuple[list[dict[str, Any]], str, str],
) -> None:
    results, log, engine_id = run
    (stats,) = [r["result"] for r in results if r["op"] == "stats"]
    assert stats["manager"] == "KvtierOffloadingManager"
    engine = stats["engine"]
    assert engine["evictions"] >= FULL_BLOCKS, engine  # the flood did push blocks out
    generated = [r["result"] for r in results if r["op"] in ("generate", "generate_hinted")]
    first_a, again = generated[0][0], generated[-1]
    assert first_a["num_cached_tokens"] == 0
    served_a, served_d = again
    # A's blocks were pinned for 600 s: served from kvtier's primary tier after vLLM forgot them.
    assert served_a["num_cached_tokens"] >= (FULL_BLOCKS - 1) * BLOCK_TOKENS, served_a
    assert served_a["token_ids"] == first_a["token_ids"]
    # D, stored the same way with no hint, was evicted by the flood.
    assert served_d["num_cached_tokens"] < FULL_BLOCKS * BLOCK_TOKENS // 2, served_d
    assert not kvtier_defects(log), "\n".join(kvtier_defects(log)[:20])
    assert shm_leftovers(engine_id) == []
