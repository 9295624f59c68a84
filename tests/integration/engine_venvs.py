"""Run engine-side scenario scripts with another engine's venv python (SGLang, LMCache).

SGLang and LMCache each live in their own virtual environment (their pins clash with vLLM's and
with each other's); ``.ci/run`` builds them and exports ``KVTIER_TEST_SGLANG_PYTHON`` and
``KVTIER_TEST_LMCACHE_PYTHON``. Locally, without them, the tests skip and say how to build them;
under ``CI=true`` they fail (:mod:`tests.integration.needs`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from needs import need

__all__ = ["HERE", "engine_python", "run_scenario"]

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def engine_python(engine: str) -> str:
    """The venv python of ``engine`` (``SGLANG`` or ``LMCACHE``), or skip/fail naming the variable."""
    var = f"KVTIER_TEST_{engine}_PYTHON"
    path = os.environ.get(var, "")
    need(
        bool(path) and os.access(path, os.X_OK),
        f"{var} does not name a python (.ci/run builds the {engine.lower()} venv)",
    )
    return path


def run_scenario(python: str, script: str, *args: str, timeout: float = 120) -> dict[str, Any]:
    """Run ``script`` (next to this file) with ``python`` and the worktree's kvtier; its last
    stdout line is JSON."""
    env = dict(os.environ, PYTHONPATH=str(SRC), PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [python, str(HERE / script), *args], capture_output=True, text=True, timeout=timeout, env=env,
        cwd=str(HERE.parents[1]),
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise AssertionError(f"{script} {args[:1]} exited {proc.returncode}: {proc.stderr.strip()[-600:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result
