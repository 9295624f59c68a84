"""``kvtier --version``, ``kvtier plugins`` and ``kvtier check``, run as real subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from kvtier.cli import main as cli_main

PLUGIN_SRC = '''
import numpy as np

from kvtier.jobs import JobResult
from kvtier.policies.base import CachePolicy
from kvtier.specs.tiering import TieringSpec
from kvtier.tiers.base import SecondaryTier
from kvtier.keys import LookupResult


class DictTier(SecondaryTier):
    """A minimal out-of-tree tier: a dict of copies, with one option of its own."""

    def __init__(self, *, primary_kv_view, context, label, corrupt=False):
        super().__init__(primary_kv_view=primary_kv_view, context=context)
        self.label = label
        self.corrupt = corrupt
        self.data = {}
        self.done = []

    def lookup(self, key, req_context=None):
        return LookupResult.HIT if key in self.data else LookupResult.MISS

    def submit_store(self, job):
        for k, s in zip(job.keys, job.slot_ids):
            self.data.setdefault(k, self.slot_array(s).tobytes())
        self.done.append(JobResult(job.job_id, True))

    def submit_load(self, job):
        for k, s in zip(job.keys, job.slot_ids):
            data = np.frombuffer(self.data[k], dtype=np.uint8)
            self.slot_array(s)[:] = data ^ 1 if self.corrupt else data
        self.done.append(JobResult(job.job_id, True))

    def get_finished_jobs(self):
        done, self.done = self.done, []
        return done

    def drain(self):
        pass


class OtherTier(DictTier):
    pass


class FifoPolicy(CachePolicy):
    def __init__(self, capacity):
        super().__init__(capacity)
        self.keys = {}

    def __len__(self):
        return len(self.keys)

    def __contains__(self, key):
        return key in self.keys

    def __iter__(self):
        return iter(list(self.keys))

    def insert(self, key, info=None):
        self.keys[key] = None

    def touch(self, key):
        pass

    def remove(self, key):
        self.keys.pop(key, None)

    def evict(self, n=1, protected=(), incoming=None):
        victims = [k for k in self.keys if k not in protected][:n]
        if len(victims) < n:
            return []
        for k in victims:
            del self.keys[k]
        return victims


class MySpec(TieringSpec):
    pass
'''


def kvtier_cmd() -> list[str]:
    script = Path(sys.executable).with_name("kvtier")
    if script.exists():
        return [str(script)]
    found = shutil.which("kvtier")
    return [found] if found else [sys.executable, "-m", "kvtier.cli.main"]


def run_cli(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    return subprocess.run(
        [*kvtier_cmd(), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


@pytest.fixture
def plugin_module(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "site"
    root.mkdir()
    name = f"kvt_cli_plug_{uuid.uuid4().hex[:8]}"
    (root / f"{name}.py").write_text(textwrap.dedent(PLUGIN_SRC))
    return root, name


def out_of_tree_config(module: str, **tier0: object) -> dict[str, object]:
    return {
        "block_bytes": 3000,
        "cpu_bytes_to_use": "64KiB",
        "eviction_policy": "FifoPolicy",
        "cache_policy_module_path": module,
        "spec_name": "MySpec",
        "spec_module_path": module,
        "secondary_tiers": [
            {"type": "DictTier", "module_path": module, "label": "first", **tier0},
            {"type": "example", "capacity_blocks": 4},
            {"type": "OtherTier", "module_path": module, "label": "third"},
        ],
    }


def test_version() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == "kvtier 0.1.0"


def test_no_command_prints_help_and_exits_2() -> None:
    proc = run_cli()
    assert proc.returncode == 2 and "plugins" in proc.stderr and "check" in proc.stderr


def test_plugins_json_lists_every_kind_and_entry_points(tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = site / "kvt_cli_ext-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvt_cli_ext\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kvtier.tiers]\nremote_thing = kvt_cli_ext.tiers:RemoteTier\n")
    proc = run_cli("plugins", "--json", pythonpath=site)
    assert proc.returncode == 0, proc.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(proc.stdout)}
    assert rows[("tier", "example")] == {
        "kind": "tier",
        "name": "example",
        "source": "built-in",
        "target": "kvtier.tiers.example:ExampleTier",
    }
    assert rows[("policy", "lru")]["source"] == "built-in"
    assert rows[("spec", "tiering")]["target"] == "kvtier.specs.tiering:TieringSpec"
    assert rows[("tier", "remote_thing")]["source"] == "entry point"
    assert rows[("tier", "remote_thing")]["target"] == "kvt_cli_ext.tiers:RemoteTier"


def test_plugins_table() -> None:
    proc = run_cli("plugins", "--kind", "tier")
    assert proc.returncode == 0
    assert "kvtier.tiers.example:ExampleTier" in proc.stdout and "built-in" in proc.stdout
    assert "LRUPolicy" not in proc.stdout


def test_table_falls_back_to_plain_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)  # import rich -> ImportError
    monkeypatch.setitem(sys.modules, "rich.console", None)
    cli_main.print_table("title", ["a", "bb"], [("x", 1), ("longer", None)])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["title", "a       bb", "------  --", "x       1", "longer"]


def test_check_out_of_tree_tier_policy_and_spec(tmp_path: Path, plugin_module: tuple[Path, str]) -> None:
    site, module = plugin_module
    cfg = tmp_path / "kvtier.json"
    cfg.write_text(json.dumps(out_of_tree_config(module)))
    proc = run_cli("check", str(cfg), pythonpath=site)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DictTier0" in proc.stdout and "OtherTier2" in proc.stdout and "example1" in proc.stdout
    assert f"{module}:DictTier" in proc.stdout and "OK" in proc.stdout
    assert f"{module}:FifoPolicy" in proc.stdout and f"{module}:MySpec" in proc.stdout
    # Two out-of-tree tiers, one policy, one spec: one experimental-API WARNING per kind, no more.
    warnings = [line for line in proc.stderr.splitlines() if "experimental" in line]
    assert len(warnings) == 3, proc.stderr
    assert "Traceback" not in proc.stderr

    proc = run_cli("check", str(cfg), "--json", pythonpath=site)
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert [t["target"] for t in report["tiers"]] == [
        f"{module}:DictTier",
        "kvtier.tiers.example:ExampleTier",
        f"{module}:OtherTier",
    ]
    assert all(t["ok"] and t["load_seconds"] is not None for t in report["tiers"])


def test_check_yaml_config(tmp_path: Path, plugin_module: tuple[Path, str]) -> None:
    site, module = plugin_module
    cfg = tmp_path / "kvtier.yaml"
    cfg.write_text(
        textwrap.dedent(
            f"""
            block_bytes: 4KiB
            cpu_bytes_to_use: 1MiB
            eviction_policy: FifoPolicy
            cache_policy_module_path: {module}
            secondary_tiers:
              - type: DictTier
                module_path: {module}
                label: from-yaml
            """
        )
    )
    proc = run_cli("check", str(cfg), "--json", pythonpath=site)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tiers"][0]["name"] == "DictTier0"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["secondary_tiers"][0].update(lable="x"), "ConfigError: secondary_tiers[0].lable: "),
        (
            lambda c: c.update(blok_bytes=1),
            "ConfigError: blok_bytes: unknown key (did you mean 'block_bytes'?)",
        ),
        (
            lambda c: c["secondary_tiers"][1].update(type="exampel"),
            "UnknownPluginError: secondary_tiers[1].type: ",
        ),
        (lambda c: c["secondary_tiers"][0].pop("label"), "ConfigError: secondary_tiers[0].label: missing"),
        (lambda c: c.update(plugins={"allowed_modules": ["corp"]}), "PluginNotAllowedError: "),
        (lambda c: c.update(cache_policy_module_path="kvt_no_such_mod"), "PluginImportError: "),
    ],
)
def test_check_bad_config_exits_2_with_one_line(
    tmp_path: Path, plugin_module: tuple[Path, str], mutate: object, expected: str
) -> None:
    site, module = plugin_module
    raw = out_of_tree_config(module)
    mutate(raw)  # type: ignore[operator]
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps(raw))
    proc = run_cli("check", str(cfg), pythonpath=site)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "experimental" not in line]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(expected), errors[0]
    assert proc.stdout == ""


def test_check_reports_a_tier_that_corrupts_bytes(tmp_path: Path, plugin_module: tuple[Path, str]) -> None:
    site, module = plugin_module
    cfg = tmp_path / "kvtier.json"
    cfg.write_text(json.dumps(out_of_tree_config(module, corrupt=True)))
    proc = run_cli("check", str(cfg), "--json", pythonpath=site)
    assert proc.returncode == 1, proc.stderr
    tiers = json.loads(proc.stdout)["tiers"]
    assert [t["ok"] for t in tiers] == [False, True, True]
    assert "differ" in tiers[0]["error"]


def test_check_invalid_json_string_and_missing_file(tmp_path: Path) -> None:
    proc = run_cli("check", "{not json")
    assert proc.returncode == 2 and proc.stderr.startswith("ConfigError: config JSON string is invalid")
    proc = run_cli("check", str(tmp_path / "absent.yaml"))
    assert proc.returncode == 2 and "cannot read config file" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_verbose_logs_each_plugin_load(tmp_path: Path, plugin_module: tuple[Path, str]) -> None:
    site, module = plugin_module
    cfg = tmp_path / "kvtier.json"
    cfg.write_text(json.dumps(out_of_tree_config(module)))
    proc = run_cli("-v", "check", str(cfg), pythonpath=site)
    assert proc.returncode == 0, proc.stderr
    infos = [line for line in proc.stderr.splitlines() if line.startswith("INFO kvtier.plugins")]
    # spec, policy and two tiers: one INFO line per out-of-tree load, naming plug-in and module.
    assert len(infos) == 4, proc.stderr
    assert any("'DictTier'" in line and module in line for line in infos)
    assert any("'OtherTier'" in line for line in infos)


def test_every_listed_command_module_has_the_command_interface() -> None:
    import importlib

    assert cli_main.COMMANDS[:2] == ["plugins", "check"]
    for name in ("plugins", "check"):
        module = importlib.import_module(f"kvtier.cli.{name}")
        assert isinstance(module.HELP, str) and isinstance(module.DESCRIPTION, str)
        assert callable(module.add_arguments) and callable(module.run)
    help_text = cli_main.build_parser().format_help()
    assert "plugins" in help_text and "check" in help_text
