"""Careless and hostile input to the config loader, ``kvtier check`` and ``Engine`` (issue 17):
every bad value is a one-line ``ConfigError`` (exit 2 from the CLI), the same for ``kvtier check``
and ``Engine``, and nothing is written to disk before the whole config validated.

``kvtier check`` runs in-process (:func:`kvtier.cli.main.main`); real files and directories.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from needs import need_module

from kvtier import Engine
from kvtier.cli.main import main
from kvtier.engine.preflight import machine_memory
from kvtier.errors import ConfigError


def check(capsys: pytest.CaptureFixture[str], config: Any) -> tuple[int, str]:
    """``kvtier check CONFIG`` in-process: (exit code, stderr)."""
    text = config if isinstance(config, str) else json.dumps(config)
    code = main(["check", text])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("size", [1e30, "999999999PiB"])
def test_a_primary_buffer_larger_than_the_machine_is_refused_by_check_and_engine(
    capsys: pytest.CaptureFixture[str], size: object
) -> None:
    """``kvtier check`` used to print 9.5e23 slots and exit 0; Engine raised a bare numpy error."""
    total = machine_memory()
    assert total is not None
    code, err = check(capsys, {"cpu_bytes_to_use": size})
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("ConfigError: cpu_bytes_to_use:") and str(total) in err
    with pytest.raises(ConfigError, match=rf"cpu_bytes_to_use: .* more than this machine's {total} bytes"):
        Engine({"cpu_bytes_to_use": size})


@pytest.mark.parametrize(
    ("cost_model", "where", "hint"),
    [
        (
            {"prefil_seconds_per_token": 1e-4},
            "cost_model.prefil_seconds_per_token",
            "prefill_seconds_per_token",
        ),
        ({"tiers": {"exmaple0": {"load_latency": 0.001}}}, "cost_model.tiers.exmaple0", "example0"),
        (
            {"tiers": {"example0": {"load_bandwith": "1GB"}}},
            "cost_model.tiers.example0.load_bandwith",
            "load_bandwidth",
        ),
    ],
)
def test_cost_model_typos_at_every_level_are_refused_with_a_did_you_mean(
    capsys: pytest.CaptureFixture[str], cost_model: dict[str, Any], where: str, hint: str
) -> None:
    """They were accepted silently (``tiers.exmaple0`` described no tier; the default speeds stayed)."""
    cfg = {"block_bytes": 4096, "cpu_bytes_to_use": 8 * 4096, "secondary_tiers": [{"type": "example"}]}
    cfg["cost_model"] = cost_model
    code, err = check(capsys, cfg)
    assert code == 2 and err.startswith(f"ConfigError: {where}:") and f"did you mean {hint!r}" in err, err
    with pytest.raises(ConfigError, match=rf"did you mean {hint!r}"):
        Engine(cfg)
    # Even without a tier (no cost model is built then) the keys are checked.
    if "tiers" not in cost_model:
        with pytest.raises(ConfigError, match=where):
            Engine({"block_bytes": 4096, "cpu_bytes_to_use": 8 * 4096, "cost_model": cost_model})


@pytest.mark.parametrize(
    "second",
    [
        {"type": "fs", "fsync": "yes"},
        {"type": "fs", "threads": 100000},
        {"type": "fs", "root_dir": ""},
        {"type": "example", "bogus": 1},
    ],
    ids=["fs-bad-bool", "fs-threads", "fs-empty-root", "unknown-option"],
)
def test_check_and_engine_write_nothing_when_a_later_tier_is_invalid(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, second: dict[str, Any]
) -> None:
    """``kvtier check`` (and Engine) created the first tier's directories before the second failed."""
    first_root = tmp_path / "first" / "kv"
    entry = dict(second)
    if entry["type"] == "fs" and "root_dir" not in entry:
        entry["root_dir"] = str(tmp_path / "second")
    cfg = {
        "block_bytes": 4096,
        "cpu_bytes_to_use": 8 * 4096,
        "secondary_tiers": [{"type": "fs", "root_dir": str(first_root)}, entry],
    }
    code, err = check(capsys, cfg)
    assert code == 2 and err.startswith("ConfigError: secondary_tiers[1]"), err
    with pytest.raises(ConfigError, match=r"secondary_tiers\[1\]"):
        Engine(cfg)
    assert not (tmp_path / "first").exists()
    assert not (tmp_path / "second").exists()


def _read_only_namespace(tmp_path: Path) -> tuple[Path, str]:
    """A root whose namespace directory exists but cannot be written: a 0500 directory for a
    non-root user; root writes anywhere, so there a file sits where the tier needs a directory
    (``procs``), which fails the same way (an OSError from the tier's first write)."""
    root = tmp_path / "ro"
    cfg = {
        "block_bytes": 4096,
        "cpu_bytes_to_use": 8 * 4096,
        "secondary_tiers": [{"type": "fs", "root_dir": str(root)}],
    }
    Engine(cfg).close()  # creates the namespace directory
    (ns,) = [p for p in root.iterdir() if p.is_dir()]
    if os.geteuid() != 0:
        for p in [root, *root.rglob("*")]:
            if p.is_dir():
                os.chmod(p, stat.S_IRUSR | stat.S_IXUSR)
    else:
        procs = ns / "procs"
        for p in procs.iterdir():
            p.unlink()
        procs.rmdir()
        procs.write_bytes(b"not a directory")
        # kvtier check probes a namespace of its own: break it the same way.
        probe = root / "kvtier-check-4096"
        probe.mkdir(mode=0o700)
        (probe / "procs").write_bytes(b"not a directory")
    return root, json.dumps(cfg)


def test_a_read_only_namespace_is_a_one_line_config_error_naming_the_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """It was a raw OSError (a traceback from Engine, exit 1 from the CLI)."""
    root, cfg = _read_only_namespace(tmp_path)
    try:
        with pytest.raises(ConfigError, match=rf"secondary_tiers\[0\]\.root_dir: cannot write .*{root}"):
            Engine(cfg)
        code, err = check(capsys, cfg)
        assert code == 2 and len(err.strip().splitlines()) == 1 and str(root) in err, err
    finally:
        for p in [root, *root.rglob("*")]:
            if p.is_dir():
                os.chmod(p, 0o700)


# A config given as a string must be a JSON object, so the string case opens with '{' only.
@pytest.mark.parametrize(
    ("opener", "where"),
    [("[", "file"), ("[", "yaml"), ('{"a":', "file"), ('{"a":', "string"), ('{"a":', "yaml")],
)
def test_a_100k_deep_config_is_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, opener: str, where: str
) -> None:
    """It exited 1 with a RecursionError."""
    closer = "]" if opener == "[" else "}"
    text = opener * 100_000 + "1" + closer * 100_000
    if where == "string":
        arg = text
    else:
        path = tmp_path / ("deep.yaml" if where == "yaml" else "deep.json")
        path.write_text(text)
        arg = str(path)
    if where == "yaml":
        need_module("yaml", "cli")  # a skip locally, a failure under CI=true
    code = main(["check", arg])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err[:300]
    assert err.startswith("ConfigError:") and "nested deeper than" in err, err[:300]


def test_a_moderately_deep_config_is_refused_before_anything_recurses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """600 levels parse, but later deep copies of the config would hit the recursion limit."""
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(600):
        node["x"] = {}
        node = node["x"]
    code, err = check(capsys, {"policy_options": deep})
    assert code == 2 and "nested deeper than" in err, err


# -- network surfaces ------------------------------------------------------------------------------

#: TEST-NET-1 (RFC 5737): never assigned to this machine, so binding it fails after the warning and
#: the test opens no port beyond loopback.
NOT_LOOPBACK = "192.0.2.1"


def test_the_metrics_exporter_warns_before_binding_a_non_loopback_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``--metrics-addr 0.0.0.0`` bound every interface without a word."""
    need_module("prometheus_client", "metrics")  # a skip locally, a failure under CI=true
    from kvtier.errors import KvtierError
    from kvtier.metrics import start_exporter

    with (
        caplog.at_level(logging.WARNING, logger="kvtier.metrics"),
        pytest.raises(KvtierError, match=f"cannot listen on {NOT_LOOPBACK}"),
    ):
        start_exporter(lambda: {}, 0, addr=NOT_LOOPBACK)
    assert [r.getMessage() for r in caplog.records if "not loopback" in r.getMessage()] == [
        f"kvtier: the metrics exporter binds {NOT_LOOPBACK}, not loopback: anyone on the network can "
        "read this engine's /metrics (use 127.0.0.1 unless intended)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvtier.metrics"), start_exporter(lambda: {}, 0) as exp:
        assert exp.addr == "127.0.0.1"
    assert not [r for r in caplog.records if "not loopback" in r.getMessage()]


def test_serve_warns_for_a_non_loopback_metrics_address_then_exits_2(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    need_module("prometheus_client", "metrics")  # a skip locally, a failure under CI=true
    with caplog.at_level(logging.WARNING):
        code = main(["serve", "--metrics-port", "0", "--metrics-addr", NOT_LOOPBACK, "--duration", "1"])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot listen on {NOT_LOOPBACK}" in err, err
    assert any("metrics exporter binds" in r.getMessage() for r in caplog.records)


def test_every_server_warning_names_the_address_and_spares_loopback(caplog: pytest.LogCaptureFixture) -> None:
    """The shared check the exporter and the p2p block server call before binding."""
    from kvtier.netaddr import warn_if_exposed

    log = logging.getLogger("kvtier.test")
    with caplog.at_level(logging.WARNING, logger="kvtier.test"):
        assert warn_if_exposed(log, "x", "", "y") and warn_if_exposed(log, "x", "0.0.0.0", "y")
        assert not warn_if_exposed(log, "x", "::1", "y") and not warn_if_exposed(log, "x", "localhost", "y")
    assert [r.getMessage() for r in caplog.records] == [
        "kvtier: x binds every interface, not loopback: y",
        "kvtier: x binds 0.0.0.0, not loopback: y",
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["--duration", "nan"],
        ["--duration", "inf"],
        ["--duration", "-5"],
        ["--metrics-port", "70000"],
    ],
)
def test_serve_refuses_bad_durations_and_ports_in_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    """``--metrics-port 70000`` exited 1 with an OverflowError."""
    argv = ["serve", "--metrics-port", "0", *args] if args[0] == "--duration" else ["serve", *args]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"ConfigError: {args[0]}:"), err
