"""Careless and hostile input to the config loader, ``kvtier check`` and ``Engine`` (issue 17):
every bad value is a one-line ``ConfigError`` (exit 2 from the CLI), the same for ``kvtier check``
and ``Engine``, and nothing is written to disk before the whole config validated.

``kvtier check`` runs in-process (:func:`kvtier.cli.main.main`); real files and directories.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

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


@pytest.mark.parametrize("opener", ["[", '{"a":'])
@pytest.mark.parametrize("where", ["file", "string", "yaml"])
def test_a_100k_deep_config_is_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, opener: str, where: str
) -> None:
    """It exited 1 with a RecursionError."""
    closer = "]" if opener == "[" else "}"
    text = opener * 100_000 + "1" + closer * 100_000
    if where == "string":
        if opener == "[":
            pytest.skip("a JSON string config starts with '{'")
        arg = text
    else:
        path = tmp_path / ("deep.yaml" if where == "yaml" else "deep.json")
        path.write_text(text)
        arg = str(path)
    if where == "yaml":
        pytest.importorskip("yaml")
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
