"""Files kvtier reads that are hostile or mistaken (issue 28): a FIFO, ``/dev/zero``, a YAML alias
bomb, a file that contains itself, a 100k-deep model config. Each is refused in one line (exit 2)
within seconds, never a hang, a 14 GB read or a ``RecursionError``.

The CLI runs as a real subprocess with a timeout, so a regression shows as a failed test, not a
hung suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 30.0  # seconds any of these may take (each should take about one interpreter start)


def kvtier(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    full = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kvtier", *args], capture_output=True, text=True, timeout=LIMIT, env=full
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"kvtier {' '.join(args)} ran past {LIMIT:.0f} s")
    return proc.returncode, proc.stderr, time.monotonic() - t0


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("WARNING")]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "RecursionError" not in err
    return lines[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "cfg.yaml"
    os.mkfifo(path)
    return path


def test_a_fifo_as_the_config_file_is_refused_not_waited_on(fifo: Path) -> None:
    code, err, _ = kvtier("check", str(fifo))
    assert code == 2 and "not a regular file" in one_line(err) and str(fifo) in err


def test_dev_zero_as_the_config_file_is_refused_not_read_forever() -> None:
    code, err, _ = kvtier("check", "/dev/zero")
    assert code == 2 and "/dev/zero" in one_line(err)


def test_a_fifo_in_kvtier_config_is_refused(fifo: Path) -> None:
    code, err, _ = kvtier("check", env={"KVTIER_CONFIG": str(fifo)})
    line = one_line(err)
    assert code == 2 and "KVTIER_CONFIG" in line and "not a regular file" in line


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_a_password_file_that_is_no_regular_file_is_refused(tmp_path: Path, fifo: Path, target: str) -> None:
    path = str(fifo) if target == "fifo" else target
    env = {
        "KVTIER_SECONDARY_TIERS__0__TYPE": "redis",
        "KVTIER_SECONDARY_TIERS__0__PASSWORD_FILE": path,
    }
    code, err, _ = kvtier("check", '{"cpu_bytes_to_use": 65536, "block_bytes": 4096}', env=env)
    line = one_line(err)
    assert code == 2 and "PASSWORD_FILE" in line and path in line


def test_a_large_password_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    big = tmp_path / "pw"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB of zeros that costs no disk
    env = {"KVTIER_SECONDARY_TIERS__0__TYPE": "redis", "KVTIER_SECONDARY_TIERS__0__PASSWORD_FILE": str(big)}
    code, err, _ = kvtier("check", '{"cpu_bytes_to_use": 65536, "block_bytes": 4096}', env=env)
    assert code == 2 and "larger than" in one_line(err)


BOMB = """\
a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def test_a_yaml_alias_bomb_is_refused_in_seconds(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)  # 10^9 strings once the aliases are expanded
    code, err, took = kvtier("check", str(bomb))
    assert code == 2 and "YAML aliases expanded" in one_line(err), err
    assert took < 15, f"{took:.1f} s"


def test_a_yaml_file_that_contains_itself_is_refused(tmp_path: Path) -> None:
    loop = tmp_path / "loop.yaml"
    loop.write_text("a: &a [1, *a]\n")
    code, err, _ = kvtier("check", str(loop))
    assert code == 2 and "contains itself" in one_line(err)


def test_plan_model_config_fifo_and_deep_nesting_are_one_line_errors(tmp_path: Path, fifo: Path) -> None:
    code, err, _ = kvtier("plan", "--model-config", str(fifo))
    assert code == 2 and "--model-config" in one_line(err) and "not a regular file" in err
    deep = tmp_path / "config.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    code, err, _ = kvtier("plan", "--model-config", str(deep))
    assert code == 2 and "nested deeper" in one_line(err)
    code, err, _ = kvtier("plan", "--model-config", "/dev/zero")
    assert code == 2 and "/dev/zero" in one_line(err)


@pytest.mark.parametrize("command", ["replay", "plan"])
def test_a_fifo_or_a_device_as_the_trace_is_refused(command: str, tmp_path: Path) -> None:
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    for trace in (str(fifo), "/dev/zero"):
        code, err, _ = kvtier(command, trace, "--no-progress")
        line = one_line(err)
        assert code == 2 and trace in line and "not a regular file" in line, err


@pytest.mark.parametrize("key", ["tls_ca", "serve.tls_cert"])
def test_a_fifo_as_a_tls_file_is_refused_not_waited_on(key: str, fifo: Path) -> None:
    tier: dict[str, object] = {"type": "p2p", "secret_env": "KVTIER_P2P_SECRET", "serve": {"port": 0}}
    if key == "tls_ca":
        tier["tls_ca"] = str(fifo)
    else:
        tier["serve"] = {"port": 0, "tls_cert": str(fifo)}
    cfg = {"cpu_bytes_to_use": 65536, "block_bytes": 4096, "secondary_tiers": [tier]}
    # An Engine starts the block server (kvtier check does not), so it is what loads the files.
    code = f"from kvtier import Engine; Engine({cfg!r})"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "KVTIER_P2P_SECRET": "s"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=LIMIT, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"an Engine with {key} on a FIFO ran past {LIMIT:.0f} s")
    # Refused in one line: a ConfigError (tls_ca, checked when the tier is built) or, for the block
    # server the engine starts, the warning it logs before running on without serving.
    assert key in proc.stderr and "not a regular file" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr or "ConfigError" in proc.stderr.strip().splitlines()[-1]
