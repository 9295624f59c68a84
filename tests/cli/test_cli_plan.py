"""``kvtier plan`` with the defaults on the shipped trace: a recommendation whose hit ratios
``kvtier replay --simulate`` reproduces exactly on the stack it wrote, and both plots."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from needs import need_module

need_module("rich", "cli")
need_module("matplotlib", "cli")


def _kvtier(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "kvtier.cli.main", *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~20 s idle; minutes when the 2 cores are shared
def test_default_plan_recommends_a_stack_that_replay_reproduces(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    proc = _kvtier("plan", "--json", "--write-config", "stack.json", "--plot", "plan", cwd=tmp_path)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rec = doc["recommendation"]
    assert rec["source"] == "simulated" and doc["requests"] == 12031
    print(f"kvtier plan (defaults, shipped trace): {seconds:.1f} s wall, {doc['timings']}")
    for png in ("plan-capacity.png", "plan-pareto.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "stack.json").read_text()) == doc["config"]

    rep = _kvtier("replay", "--simulate", "--config", "stack.json", "--json", "--no-opt", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    replayed = json.loads(rep.stdout)
    assert replayed["hit_ratio"] == rec["hit_ratio"]  # every ratio, every digit
    hits = {("ram" if t["name"] == "primary" else t["name"]): t["hits"] for t in replayed["tiers"]}
    assert hits == {t["kind"]: t["hits"] for t in rec["tiers"]}
    assert replayed["cost"]["saved_seconds"] == rec["prefill_seconds_saved"]


def test_bad_input_is_one_line_with_exit_2(tmp_path: Path) -> None:
    trace = tmp_path / "t16.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i, "input_length": 40, "hash_ids": [0, 1, 2]}) + "\n"
                             for i in range(5)))  # fmt: skip
    proc = _kvtier("plan", str(trace), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "ConfigError: --block-tokens: t16.jsonl: len(hash_ids) matches input_length at 16-token blocks, "
        "not 512; pass --block-tokens 16"
    )
    proc = _kvtier("plan", str(trace), "--block-tokens", "16", "--target-hit", "abc", cwd=tmp_path)
    assert proc.returncode == 2 and "--target-hit" in proc.stderr and len(proc.stderr.splitlines()) == 1
    proc = _kvtier("plan", str(trace), "--kv-dtype", "fp8", cwd=tmp_path)
    assert proc.returncode == 2 and "--kv-dtype" in proc.stderr


def test_small_trace_plan_with_turns_prints_a_table(tmp_path: Path) -> None:
    rows = [{"chat_id": i, "parent_chat_id": i - 1 if i % 3 else -1, "timestamp": float(i), "turn": i % 3 + 1,
             "input_length": 16 * (3 + i % 3), "output_length": 1, "hash_ids": list(range(3 + i % 3))}
            for i in range(60)]  # fmt: skip
    trace = tmp_path / "qwen.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = _kvtier("plan", str(trace), "--block-tokens", "16", "--jobs", "1", "--simulations", "2",
                   "--refine", "1", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Recommended stack (simulated)" in proc.stdout and "Per turn" in proc.stdout
