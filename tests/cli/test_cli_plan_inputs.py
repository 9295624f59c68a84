"""``kvtier plan`` on careless input and on a pipe (issue 28): non-finite or negative prices and
rates are refused in one line, a tiny simulation budget no longer divides by zero, ``--plot``
without matplotlib fails before simulating, and a piped stderr gets a progress line every few
seconds (never ``\\r``)."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.cli.main import main
from kvtier.cli.progress import ProgressLine
from kvtier.plan.search import _spread

ROOT = Path(__file__).resolve().parents[2]


def kvtier(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "kvtier", *args], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpu-price", "nan"],
        ["--gpu-price", "-1"],
        ["--gpu-price", "inf"],
        ["--gpu-price", "0"],
        ["--prefill-tokens-per-second", "nan"],
        ["--trace-seconds", "-5"],
        ["--kv-bytes-per-token", "0"],
        ["--jobs", "0"],
        ["--simulations", "0"],
        ["--refine", "-1"],
        ["--target-hit", "nan"],
        ["--target-hit", "150%"],
        ["--budget", "-10"],
        ["--budget", "inf"],
    ],
)
def test_bad_numbers_are_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["plan", *argv])
    except SystemExit as exc:  # argparse's own refusal
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("ConfigError: --"), err
    assert argv[0] in err


def test_two_simulations_on_one_job_do_not_divide_by_zero() -> None:
    proc = kvtier("plan", "--limit", "200", "--simulations", "2", "--jobs", "1", "--json")
    assert proc.returncode in (0, 1), proc.stderr
    assert "ZeroDivisionError" not in proc.stderr


@given(n=st.integers(0, 50), k=st.integers(0, 60))
def test_spread_picks_min_n_k_distinct_points_of_the_front(n: int, k: int) -> None:
    front: list[Any] = list(range(n))
    got = _spread(front, k)
    assert len(got) == min(n, k) and len(set(got)) == len(got) and set(got) <= set(front)
    if 2 <= k < n:
        assert got[0] == front[0] and got[-1] == front[-1]


def test_plot_without_matplotlib_fails_before_simulating(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a)
    )
    import kvtier.plan as plan_pkg

    def no_simulation(*a: Any, **kw: Any) -> Any:
        raise AssertionError("simulated before checking --plot")

    monkeypatch.setattr(plan_pkg, "plan", no_simulation)
    assert main(["plan", "--plot", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "ConfigError: --plot: needs matplotlib: pip install 'kvtier[plot]'"


def test_a_piped_stderr_gets_whole_progress_lines() -> None:
    proc = kvtier("plan", "--limit", "300", "--simulations", "2", "--jobs", "1")
    assert proc.returncode in (0, 1), proc.stderr
    assert "\r" not in proc.stderr
    assert not any(ln.startswith("simulating") and "/" not in ln for ln in proc.stderr.splitlines())
    quiet = kvtier("plan", "--limit", "300", "--simulations", "2", "--jobs", "1", "--no-progress")
    assert "simulating" not in quiet.stderr


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@given(steps=st.lists(st.floats(0, 5), min_size=1, max_size=200))
def test_on_a_pipe_progress_is_at_most_one_line_per_interval_plus_the_last(steps: list[float]) -> None:
    clock, out = Clock(), io.StringIO()
    bar = ProgressLine(out, terminal=False, interval=3.0, clock=clock)
    total = len(steps)
    for i, dt in enumerate(steps, 1):
        clock.now += dt
        bar.update("work", i, total)
    lines = out.getvalue().splitlines()
    assert len(lines) <= clock.now / 3.0 + 1
    if clock.now < 3.0:
        assert lines == []  # a quick run stays silent on a pipe
    elif lines:
        assert lines[-1].startswith(f"work: {total}/{total}")  # once shown, the end is shown too
    if sum(steps[:-1]) >= 3.0:
        assert lines, "a run longer than the interval showed no progress"
    assert "\r" not in out.getvalue()


def test_on_a_pipe_a_heartbeat_repeats_the_state_during_a_long_step() -> None:
    out = io.StringIO()
    with ProgressLine(out, terminal=False, interval=0.3) as bar:
        bar.update("simulating grid", 0, 2)
        import time

        time.sleep(1.0)  # one long simulation that reports nothing
    assert out.getvalue().count("simulating grid: 0/2") >= 3
