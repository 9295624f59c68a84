"""CLI conventions, as a user meets them: ``python -m kvtier``, size strings, one-line exit-2 errors for
bad ports and durations, ``| head`` exiting 0, the metrics URL of port 0, literal table titles, config
file errors with line and column, ``kvtier check``'s probe namespace, and every command on a core
install (rich, matplotlib and prometheus_client made unimportable in the child process).

Real subprocesses, real pipes, real files, real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from needs import need_module

PY = sys.executable
#: The latency table's title, as it must print (``[t]`` is text, not markup).
LATENCY_TITLE = "latency per request (ms); load[t]: requests whose slowest hits came from t"
# A child process where the optional extras cannot be imported (a core-only install).
CORE_ONLY = (
    "import sys\n"
    "for m in ('rich', 'matplotlib', 'prometheus_client', 'yaml'):\n"
    "    sys.modules[m] = None\n"
    "from kvtier.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def kvtier(*args: str, cwd: Path | None = None, core_only: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [PY, "-c", CORE_ONLY, *args] if core_only else [PY, "-m", "kvtier.cli.main", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=cwd, check=False)


def test_python_dash_m_kvtier() -> None:
    proc = subprocess.run([PY, "-m", "kvtier", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip().startswith("kvtier "), proc.stderr


# -- sizes, ports, durations -----------------------------------------------------------------------


def test_block_bytes_accepts_size_strings() -> None:
    proc = kvtier("replay", "--simulate", "--limit", "50", "--block-bytes", "4KiB", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["requests"] == 50
    proc = kvtier("bench", "--blocks", "4", "--repeats", "1", "--block-bytes", "16KiB", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["block_bytes"] == 16384


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["replay", "--block-bytes", "lots"], "ConfigError: --block-bytes: expected a size such as"),
        (["replay", "--block-bytes", "0"], "ConfigError: --block-bytes: must be at least 1 byte"),
        (["replay", "--metrics-port", "70000"], "ConfigError: --metrics-port: must be in 0..65535"),
        (["replay", "--metrics-port", "http"], "ConfigError: --metrics-port: expected a port number"),
        (["serve", "--metrics-port", "-1"], "ConfigError: --metrics-port: must be in 0..65535"),
        (["serve", "--metrics-port", "0", "--duration", "0"], "ConfigError: --duration: must be a finite"),
        (["serve", "--metrics-port", "0", "--duration", "inf"], "ConfigError: --duration: must be a finite"),
        (["serve", "--metrics-port", "0", "--poll-interval", "-1"], "ConfigError: --poll-interval"),
        (["check", "--timeout", "nan"], "ConfigError: --timeout: must be a finite"),
        (["bench", "--block-bytes", "1.5x"], "ConfigError: --block-bytes"),
        (["replay", "--no-such-flag"], "UsageError: unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_option_values_are_one_line_exit_2(args: list[str], line: str) -> None:
    proc = kvtier(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), proc.stderr


# -- output closed early ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "--simulate", "--limit", "300"],
        ["replay", "--simulate", "--limit", "300", "--json"],
        ["check"],
        ["plugins"],
    ],
)
def test_reader_gone_before_output_exits_0_silently(args: list[str]) -> None:
    # The read end is closed before the command writes anything: every write hits EPIPE, the
    # deterministic form of `kvtier ... | head -1` (which can also win the race and read it all).
    proc = subprocess.Popen(
        [PY, "-m", "kvtier.cli.main", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=240) == 0, err
    assert err == ""


def test_pipe_into_head_with_a_real_shell() -> None:
    cmd = f"set -o pipefail; {PY} -m kvtier.cli.main replay --simulate --limit 300 | head -1"
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("kvtier replay")


# -- metrics port 0 --------------------------------------------------------------------------------


def test_replay_metrics_port_zero_prints_the_url() -> None:
    need_module("prometheus_client", "metrics")
    proc = kvtier(
        "replay", "--simulate", "--limit", "300", "--metrics-port", "0", "--metrics-linger", "0", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"^metrics: http://127\.0\.0\.1:(\d+)/metrics$", proc.stderr, flags=re.M)
    assert m and int(m[1]) > 0, proc.stderr
    json.loads(proc.stdout)  # stdout stays pure JSON


def test_replay_on_listen_url_serves_during_the_replay() -> None:
    need_module("prometheus_client", "metrics")
    from kvtier.config import load_config
    from kvtier.keys import KeyNamespace
    from kvtier.sim.replay import prepare_trace, replay
    from kvtier.sim.trace import TraceRequest

    requests = [TraceRequest(timestamp_ms=i, blocks=(1, 2, 3 + i % 4)) for i in range(600)]
    config = load_config({"cpu_bytes_to_use": 64 * 4096, "block_bytes": 4096})
    trace = prepare_trace(requests, KeyNamespace.from_config(config, block_size=16), name="t")
    urls: list[str] = []
    scraped: list[str] = []

    def hook(engine: object, done: int, exporter: object) -> None:
        if urls and not scraped:
            with urllib.request.urlopen(urls[0], timeout=5) as resp:
                scraped.append(resp.read().decode())

    replay(trace, config, simulate=True, metrics_port=0, on_listen=urls.append, hook=hook)
    assert len(urls) == 1 and re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", urls[0])
    assert scraped and "kvtier_lookups_total" in scraped[0]


# -- literal titles --------------------------------------------------------------------------------


@pytest.mark.parametrize("plain", [True, False])
def test_table_titles_and_cells_are_never_markup(plain: bool) -> None:
    if not plain:
        need_module("rich", "cli")
    from kvtier.cli.output import TextTable, render

    table = TextTable(LATENCY_TITLE, ["operation", "p50"])
    table.add_row("load[fs0]", "1.0")
    text = render([table, "note: [bold]x[/bold]"], plain=plain)
    assert "load[t]: requests whose slowest hits came from t" in text
    assert "load[fs0]" in text and "[bold]x[/bold]" in text


def test_real_replay_prints_the_latency_title_verbatim() -> None:
    need_module("rich", "cli")
    proc = kvtier("replay", "--limit", "200")
    assert proc.returncode == 0, proc.stderr
    assert LATENCY_TITLE in proc.stdout


# -- config file errors ----------------------------------------------------------------------------


def test_yaml_and_json_errors_name_file_line_and_column(tmp_path: Path) -> None:
    need_module("yaml", "cli")
    bad_yaml = tmp_path / "kv.yaml"
    bad_yaml.write_text("block_bytes: 4096\nsecondary_tiers:\n  - type: fs\n    root_dir: [a, b\n")
    bad_json = tmp_path / "kv.json"
    bad_json.write_text('{\n  "block_bytes": 4096,\n  "model": "m",,\n}\n')
    for path, where in ((bad_yaml, r":5:1: invalid YAML: "), (bad_json, r":3:16: invalid JSON: ")):
        proc = kvtier("check", str(path))
        assert proc.returncode == 2, proc.stderr
        assert re.match(rf"ConfigError: {re.escape(str(path))}{where}", proc.stderr), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


# -- kvtier check's probe namespace ----------------------------------------------------------------


def test_check_probes_per_block_size_and_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "kv"
    for block in ("64KiB", "2MiB", "64KiB"):
        config = {"block_bytes": block, "cpu_bytes_to_use": "8MiB",
                  "secondary_tiers": [{"type": "fs", "root_dir": str(root)}]}  # fmt: skip
        proc = kvtier("check", json.dumps(config), "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads(proc.stdout)["tiers"][0]["ok"]
        assert not root.exists(), "the probe namespace (or the root it created) was left behind"


def test_check_leaves_serving_namespaces_alone(tmp_path: Path) -> None:
    root = tmp_path / "kv"
    serving = root / "default"
    serving.mkdir(parents=True)
    (serving / "keep").write_text("x")
    config = {"block_bytes": 4096, "secondary_tiers": [{"type": "fs", "root_dir": str(root)}]}
    assert kvtier("check", json.dumps(config)).returncode == 0
    assert [p.name for p in root.iterdir()] == ["default"] and (serving / "keep").exists()


# -- core install: no rich, no matplotlib, no prometheus_client, no PyYAML ------------------------


def test_every_command_runs_without_the_extras(tmp_path: Path) -> None:
    proc = kvtier("replay", "--simulate", "--limit", "200", core_only=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("kvtier replay — conversation_trace.jsonl.gz (simulate, lru)\n")
    assert "block hit ratio" in proc.stdout and "\u2503" not in proc.stdout  # no rich borders
    proc = kvtier("replay", "--limit", "200", "--progress", core_only=True)
    assert proc.returncode == 0 and LATENCY_TITLE in proc.stdout, proc.stderr
    proc = kvtier("replay", "--simulate", "--sweep", "--limit", "200", "--capacity", "1%,5%",
                  "--policy", "lru", core_only=True)  # fmt: skip
    assert proc.returncode == 0 and "block hit ratio by capacity and policy" in proc.stdout, proc.stderr
    proc = kvtier("bench", "--blocks", "4", "--repeats", "1", core_only=True)
    assert proc.returncode == 0 and "kvtier bench" in proc.stdout and "best of 1" in proc.stdout, proc.stderr
    proc = kvtier("check", core_only=True)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), proc.stderr
    proc = kvtier("plugins", core_only=True)
    assert proc.returncode == 0 and "kvtier.tiers.fs:FsTier" in proc.stdout, proc.stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["replay", "--simulate", "--limit", "50", "--plot", "x.png"], "pip install 'kvtier[plot]'"),
        (["replay", "--simulate", "--limit", "50", "--metrics-port", "0"], "pip install 'kvtier[metrics]'"),
        (["serve", "--metrics-port", "0", "--duration", "1"], "pip install 'kvtier[metrics]'"),
    ],
)
def test_a_missing_extra_is_named_in_one_line(args: list[str], line: str, tmp_path: Path) -> None:
    proc = kvtier(*args, cwd=tmp_path, core_only=True)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and line in proc.stderr, proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_yaml_without_pyyaml_says_what_to_install(tmp_path: Path) -> None:
    cfg = tmp_path / "kv.yaml"
    cfg.write_text("block_bytes: 4096\n")
    proc = kvtier("check", str(cfg), core_only=True)
    assert proc.returncode == 2 and "PyYAML" in proc.stderr and "kvtier[cli]" in proc.stderr, proc.stderr
