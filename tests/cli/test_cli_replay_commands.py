"""``kvtier replay``/``bench``/``serve`` as a user runs them: real subprocesses, real files, real HTTP."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from needs import need_module

need_module("rich", "cli")  # `kvtier replay` prints with rich

KVTIER = [sys.executable, "-m", "kvtier.cli.main"]


def kvtier(*args: str, cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KVTIER, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
    )


def test_real_replay_json_has_documented_keys() -> None:
    proc = kvtier("replay", "--limit", "300", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["mode"] == "real" and out["requests"] == 300
    for key in ("requests", "block_refs", "hit_ratio", "tiers", "verify_mismatches"):
        assert key in out
    assert set(out["hit_ratio"]) >= {"block", "prefix", "token"}
    assert [t["name"] for t in out["tiers"]] == ["primary", "fs0"]
    assert [t["type"] for t in out["tiers"]] == ["primary/heap", "fs"]
    for t in out["tiers"]:
        assert set(t) >= {"name", "type", "hits", "hit_ratio", "bytes_read", "bytes_written", "evictions",
                          "corrupt", "dropped_stores"}  # fmt: skip
    assert out["verify_mismatches"] == 0
    assert out["verified_blocks"] == sum(t["hits"] for t in out["tiers"]) > 0
    assert out["latency"]["lookup"]["count"] == 300
    assert out["opt"] is None  # not asked for in real mode


def test_sweep_json_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "sweep.png"
    proc = kvtier(
        "replay", "--sweep", "--capacity", "1%,5%", "--policy", "lru,sieve", "--limit", "2000",
        "--plot", str(png), "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    points = json.loads(proc.stdout)
    assert [(p["capacity"], p["policy"]) for p in points] == [
        ("1%", "lru"), ("1%", "sieve"), ("5%", "lru"), ("5%", "sieve"),
    ]  # fmt: skip
    assert all(p["mode"] == "simulate" for p in points)
    for p in points:
        assert p["hit_ratio"]["block"] <= p["opt"]["block"] + 0.01 <= p["infinite"]["block"] + 0.01
    assert points[2]["opt"]["block"] >= points[0]["opt"]["block"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_human_output_and_forced_progress_bar() -> None:
    proc = kvtier("replay", "--simulate", "--limit", "1000", "--progress")
    assert proc.returncode == 0, proc.stderr
    assert "block hit ratio" in proc.stdout and "per tier" in proc.stdout
    assert "replay (simulate)" in proc.stderr  # the rich progress bar's label


@pytest.mark.parametrize(
    ("args", "prefix"),
    [
        (["--simulate", "--capacity", "0%"], "ConfigError: --capacity"),
        (["--simulate", "--capacity", "lots"], "ConfigError: --capacity"),
        (["--simulate", "--policy", "lru,arc"], "ConfigError: --policy: several policies need --sweep"),
        (["--simulate", "--policy", "no-such-policy"], "UnknownPluginError"),
        (["/nonexistent/trace.jsonl"], "TraceError: /nonexistent/trace.jsonl"),
        (["--config", '{"cpu_bytes": 1}'], "ConfigError: cpu_bytes"),
        (["--limit", "0"], "ConfigError: --limit"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], prefix: str) -> None:
    proc = kvtier("replay", "--limit", "50", *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), proc.stderr


def test_simulate_with_a_two_tier_config_models_the_fs_tier(tmp_path: Path) -> None:
    config = tmp_path / "stack.json"
    config.write_text(json.dumps({
        "block_bytes": 4096, "cpu_bytes_to_use": 500 * 4096,
        "secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path / "never-created"),
                             "max_bytes": "40MiB"}],
    }))  # fmt: skip
    proc = kvtier("replay", "--simulate", "--config", str(config), "--limit", "2000", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [t["type"] for t in out["tiers"]] == ["primary/none", "fs/simulated"]
    assert out["tiers"][1]["hits"] > 0
    assert any("models secondary tiers" in n for n in out["notes"])
    assert not (tmp_path / "never-created").exists()


def test_generic_trace_format(tmp_path: Path) -> None:
    trace = tmp_path / "generic.jsonl"
    rows = [{"timestamp": i, "blocks": [1, 2, 3 + i % 3], "tenant": "acme"} for i in range(30)]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    proc = kvtier("replay", str(trace), "--simulate", "--capacity", "100", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # 3 + 2 first references miss, then every block hits: 90 refs, 5 unique.
    assert out["block_refs"] == 90 and out["unique_blocks"] == 5
    assert out["hits"]["block"] == 85


def test_bench_reports_ratios_against_references() -> None:
    proc = kvtier("bench", "--blocks", "32", "--repeats", "1", "--block-bytes", "65536", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    names = [t["name"] for t in out["tiers"]]
    assert names == ["primary", "fs0"]
    assert {t["reference"]["kind"] for t in out["tiers"]} == {"memcpy", "file_io"}
    assert set(out["ratios"]) == {"primary.store", "primary.load", "fs0.store", "fs0.load"}
    assert all(r > 0 for r in out["ratios"].values())
    assert all(t["verified"] for t in out["tiers"])
    assert all(t["load_latency_s"] > 0 for t in out["tiers"])


def test_serve_exports_metrics_until_terminated(tmp_path: Path) -> None:
    config = tmp_path / "kv.json"
    config.write_text(json.dumps({"block_bytes": 4096, "cpu_bytes_to_use": 64 * 4096}))
    proc = subprocess.Popen(
        [*KVTIER, "serve", "--config", str(config), "--metrics-port", "0", "--duration", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), url
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        assert "kvtier_lookups_total 0.0" in text
        assert 'kvtier_hits_total{tier="primary"} 0.0' in text
        assert "kvtier_primary_slots 64.0" in text
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_serve_without_port_is_config_error() -> None:
    proc = subprocess.run([*KVTIER, "serve"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("ConfigError: metrics_port")
