"""``kvtier replay`` on a pipe and with a metrics port (issue 28): a piped stderr gets whole
progress lines (never ``\\r``), and the metrics endpoint keeps the final values up for
``--metrics-linger`` seconds after the replay, so a scrape interval longer than the replay still
sees them. Real subprocesses, real HTTP scrapes on 127.0.0.1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from needs import need_module

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def test_a_piped_stderr_gets_whole_progress_lines() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier", "replay", "--simulate", "--limit", "500", "--json"],
        capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr and "\x1b[" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("replay (simulate):")]
    if lines:  # a loaded machine took longer than one interval: then the end is shown too
        assert lines[-1].startswith("replay (simulate): 500/500"), proc.stderr


def test_the_metrics_endpoint_outlives_the_replay_by_the_linger(tmp_path: Path) -> None:
    need_module("prometheus_client", "metrics")
    argv = [sys.executable, "-m", "kvtier", "replay", "--simulate", "--limit", "300", "--metrics-port", "0",
            "--metrics-linger", "3", "--no-progress", "--json"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.match(r"metrics: (http://127\.0\.0\.1:\d+/metrics)$", line.strip())
        assert m, line
        t_url = time.monotonic()
        scrapes: list[tuple[float, float]] = []  # (seconds after the URL, kvtier_lookups_total)
        while time.monotonic() - t_url < 60:
            try:
                with urllib.request.urlopen(m[1], timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                break  # the exporter closed
            got = re.search(r"^kvtier_lookups_total(?:\{[^}]*\})? (\S+)$", text, flags=re.M)
            if got:
                scrapes.append((time.monotonic() - t_url, float(got[1])))
            time.sleep(0.1)
        assert scrapes, "nothing was ever served"
        final = max(v for _, v in scrapes)
        assert final > 0
        served_final = [t for t, v in scrapes if v == final]
        # The replay of 300 simulated requests takes well under a second; the final values stayed
        # up for the 3 s linger after it.
        assert served_final[-1] - served_final[0] >= 2.0, scrapes[-5:]
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and out.lstrip().startswith("{")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
