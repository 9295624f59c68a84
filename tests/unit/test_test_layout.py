"""The test tree's own rules: ``tests/unit/`` starts no process (those tests live in
``tests/integration/``), and each integration module carries the markers of the services it uses."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PROCESS_MODULES = {"subprocess", "multiprocessing", "concurrent.futures.process"}


def _conftest():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("kvtier_tests_conftest", TESTS / "conftest.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_unit_tests_start_no_process() -> None:
    offenders = []
    for path in sorted((TESTS / "unit").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{path.name}: {n}" for n in names if n in PROCESS_MODULES]
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("fork", "posix_spawn", "system", "popen")
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ):
                offenders.append(f"{path.name}: os.{node.attr}")
    assert offenders == [], "move these tests to tests/integration/"


def test_service_markers_follow_what_a_module_uses() -> None:
    markers = _conftest().service_markers
    integration = TESTS / "integration"
    assert "s3" in markers((integration / "test_obj_contract.py").read_text())
    assert "redis" in markers((integration / "test_redis_contract.py").read_text())
    assert "mooncake" in markers((integration / "test_mooncake_contract.py").read_text())
    assert "vllm" in markers((integration / "test_vllm_spec.py").read_text())
    assert markers((integration / "test_fs_contract.py").read_text()) == []
    # Every module named after a service carries its marker (vLLM's config tests run without vLLM).
    for prefix, marker in (("test_redis_", "redis"), ("test_obj_", "s3"), ("test_mooncake_", "mooncake"),
                           ("test_vllm_", "vllm"), ("test_hf_", "hf")):  # fmt: skip
        for path in integration.glob(f"{prefix}*.py"):
            # vLLM's config and version-check tests run without vLLM; the obj deadline tests need no S3
            # server (their endpoint is a closed loopback port).
            if path.name in ("test_vllm_config.py", "test_vllm_compat.py", "test_obj_deadlines.py"):
                continue
            assert marker in markers(path.read_text()), path.name
