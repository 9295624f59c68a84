"""Configuration layers: defaults < file (``--config`` / ``KVTIER_CONFIG``) < ``KVTIER_*`` < explicit.

Real files and real ``kvtier check --show-config`` subprocesses; ``env`` is passed as a mapping to
the library (never by mutating this process's environment). Hypothesis checks the environment
spelling round-trips for any key path and value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.config.layers import REDACTED, env_name, is_secret_key, redact, resolve_config
from kvtier.errors import ConfigError


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_each_layer_overrides_the_one_below(tmp_path: Path) -> None:
    f = write(tmp_path / "kv.json", {"block_bytes": "64KiB", "model": "file", "cpu_bytes_to_use": "1MiB"})
    env = {"KVTIER_CONFIG": str(f), "KVTIER_MODEL": "env", "KVTIER_CPU_BYTES_TO_USE": "2MiB"}
    r = resolve_config(env=env, explicit={"cpu_bytes_to_use": "4MiB"})
    c = r.config
    assert (c.block_bytes, c.model, c.cpu_bytes_to_use, c.eviction_policy) == (65536, "env", 4 << 20, "lru")
    assert r.origins == {
        "block_bytes": f"file {f}",
        "model": "env KVTIER_MODEL",
        "cpu_bytes_to_use": "argument",
    }
    assert r.file == f
    shown = {k: (v, o) for k, v, o in r.show()}
    assert shown["eviction_policy"] == ('"lru"', "default")
    assert shown["cpu_bytes_to_use"] == ('"4MiB"', "argument")


def test_an_explicit_source_wins_over_kvtier_config(tmp_path: Path) -> None:
    a = write(tmp_path / "a.json", {"model": "a"})
    b = write(tmp_path / "b.json", {"model": "b"})
    assert resolve_config(b, env={"KVTIER_CONFIG": str(a)}).config.model == "b"
    assert resolve_config(None, env={}).config.model == "default"
    assert resolve_config(None, env={}, fallback={"model": "cmd"}).origins["model"] == "command default"


def test_nested_keys_and_list_items(tmp_path: Path) -> None:
    f = write(tmp_path / "kv.json", {"secondary_tiers": [{"type": "fs", "root_dir": "/a"}]})
    env = {
        "KVTIER_SECONDARY_TIERS__0__ROOT_DIR": "/b",
        "KVTIER_SECONDARY_TIERS__0__MAX_BYTES": "1GiB",
        "KVTIER_SECONDARY_TIERS__1__TYPE": "example",  # the next index appends an entry
        "KVTIER_PLUGINS__ALLOW_MODULE_PATH": "false",
        "KVTIER_COST_MODEL__PREFILL_SECONDS_PER_TOKEN": "2e-4",
        "KVTIER_METRICS_PORT": "9400",
        "KVTIER_MODEL": "123",  # a text key stays text
    }
    c = resolve_config(f, env=env).config
    assert [t.type for t in c.secondary_tiers] == ["fs", "example"]
    assert dict(c.secondary_tiers[0].options) == {"root_dir": "/b", "max_bytes": "1GiB"}
    assert c.plugins.allow_module_path is False
    assert c.cost_model == {"prefill_seconds_per_token": 2e-4}
    assert (c.metrics_port, c.model) == (9400, "123")


def test_a_whole_value_as_json() -> None:
    env = {"KVTIER_SECONDARY_TIERS": '[{"type": "example"}, {"type": "example", "name": "x"}]'}
    assert [t.options.get("name") for t in resolve_config(env=env).config.secondary_tiers] == [None, "x"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KVTIER_CPU_BYTES": "1GiB"},
         "KVTIER_CPU_BYTES: names no kvtier setting (did you mean KVTIER_CPU_BYTES_TO_USE?)"),
        ({"KVTIER_SECONDARY_TIERS__2__TYPE": "fs"},
         "KVTIER_SECONDARY_TIERS__2__TYPE: secondary_tiers has 0 entries"),
        ({"KVTIER_MODEL__X": "1"},
         "model: expected a string, got dict {'x': 1} (set by env KVTIER_MODEL__X)"),
        ({"KVTIER_SECONDARY_TIERS": '{"type": "fs"}', "KVTIER_SECONDARY_TIERS__0__TYPE": "fs"},
         "KVTIER_SECONDARY_TIERS__0__TYPE: secondary_tiers is not a list"),
        ({"KVTIER_BLOCK_BYTES": "huge"}, "block_bytes: expected a size such as 8GiB"),
        ({"KVTIER_PLUGINS____X": "1"}, "KVTIER_PLUGINS____X: empty key segment"),
        ({"KVTIER_CONFIG": "/nonexistent/kv.json"},
         "KVTIER_CONFIG: /nonexistent/kv.json: cannot read config file"),
    ],
)  # fmt: skip
def test_bad_environment_is_one_clear_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_config(env=env)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_a_bad_value_names_the_variable_that_set_it() -> None:
    with pytest.raises(ConfigError, match=r"\(set by env KVTIER_BLOCK_BYTES\)$"):
        resolve_config(env={"KVTIER_BLOCK_BYTES": "huge"})
    with pytest.raises(ConfigError, match=r"^write_policy: .*\(set by argument\)$"):
        resolve_config(env={}, explicit={"write_policy": "sometimes"})


def test_test_suite_variables_are_not_settings() -> None:
    assert resolve_config(env={"KVTIER_TEST_NO_MOUNT": "1"}).config.model == "default"


def test_secrets_from_files_and_never_shown(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("hunter2\n")
    env = {
        "KVTIER_SECONDARY_TIERS__0__TYPE": "example",
        "KVTIER_SECONDARY_TIERS__0__PASSWORD_FILE": str(secret),
        "KVTIER_SECONDARY_TIERS__0__URL": "redis://user:s3cret@127.0.0.1:6379/0",
        "KVTIER_SECONDARY_TIERS__0__MAC_KEY": "00ff",  # a secret is text even when it looks like JSON
    }
    r = resolve_config(env=env)
    opts = r.config.secondary_tiers[0].options
    assert opts["password"] == "hunter2" and opts["mac_key"] == "00ff"
    text = json.dumps(r.show())
    assert "hunter2" not in text and "s3cret" not in text and "00ff" not in text
    shown = {k: (v, o) for k, v, o in r.show()}
    assert shown["secondary_tiers[0].password"] == (REDACTED, "env KVTIER_SECONDARY_TIERS__0__PASSWORD_FILE")
    assert shown["secondary_tiers[0].url"][0] == f'"redis://user:{REDACTED}@127.0.0.1:6379/0"'
    with pytest.raises(ConfigError, match="cannot read secret file") as info:
        resolve_config(env={"KVTIER_SECONDARY_TIERS__0__PASSWORD_FILE": str(tmp_path / "missing")})
    assert "hunter2" not in str(info.value)


def test_secret_names() -> None:
    for name in ("password", "redis_password", "mac_key", "token", "api_key", "aws_secret_access_key"):
        assert is_secret_key(name), name
    for name in ("kv_bytes_per_token", "tokens_per_block", "bench_file", "cache_salt", "max_bytes"):
        assert not is_secret_key(name), name
    assert redact("password", "") == "" and redact("root_dir", "/x") == "/x"


_segment = st.from_regex(r"[a-z][a-z0-9]{0,6}(_[a-z0-9]{1,6}){0,2}", fullmatch=True).filter(
    lambda s: not is_secret_key(s)
)
_value = st.one_of(
    st.integers(-(10**9), 10**9), st.booleans(), st.none(),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
    st.lists(st.integers(0, 9), max_size=3),
)  # fmt: skip


@given(keys=st.lists(_segment, min_size=1, max_size=3), value=_value)
def test_env_spelling_round_trips_any_nested_policy_option(keys: list[str], value: Any) -> None:
    path = "policy_options." + ".".join(keys)
    name = env_name(path)
    raw = json.dumps(value)
    merged = resolve_config(env={name: raw}).merged
    node: Any = merged["policy_options"]
    for k in keys:
        node = node[k]
    assert node == value
    origins = resolve_config(env={name: raw}).origins
    mine = {k: o for k, o in origins.items() if k == path or k.startswith((path + ".", path + "["))}
    assert mine and set(mine.values()) == {f"env {name}"}


@given(index=st.integers(0, 3), root=st.from_regex(r"/[a-z0-9/]{1,20}", fullmatch=True))
def test_list_items_append_in_order(index: int, root: str) -> None:
    env = {env_name(f"secondary_tiers[{i}].type"): "example" for i in range(index + 1)}
    env[env_name(f"secondary_tiers[{index}].root_dir")] = root
    tiers = resolve_config(env=env).merged["secondary_tiers"]
    assert len(tiers) == index + 1 and tiers[index]["root_dir"] == root


def test_check_show_config_prints_origins_and_redacts(tmp_path: Path) -> None:
    cfg = write(tmp_path / "kv.json", {"block_bytes": 4096})
    secret = tmp_path / "pw"
    secret.write_text("hunter2")
    env = {
        **os.environ,
        "KVTIER_CONFIG": str(cfg),
        "KVTIER_MODEL": "llama",
        "KVTIER_SECONDARY_TIERS__0__TYPE": "example",
        "KVTIER_SECONDARY_TIERS__0__PASSWORD_FILE": str(secret),
    }
    argv = [sys.executable, "-m", "kvtier", "check", "--show-config", "--json"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["block_bytes"] == {"value": 4096, "origin": f"file {cfg}"}
    assert shown["model"] == {"value": "llama", "origin": "env KVTIER_MODEL"}
    assert shown["eviction_policy"] == {"value": "lru", "origin": "default"}
    assert shown["secondary_tiers[0].password"]["value"] == REDACTED
    assert "hunter2" not in proc.stdout + proc.stderr
    table = subprocess.run(argv[:-1], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert table.returncode == 0 and "env KVTIER_MODEL" in table.stdout and "hunter2" not in table.stdout
    # And the same environment drives the check itself (no built-in tier takes a password yet).
    del env["KVTIER_SECONDARY_TIERS__0__PASSWORD_FILE"]
    ran = subprocess.run(argv[:4], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0 and "example0" in ran.stdout and str(cfg) in ran.stdout, ran.stderr


def test_a_typo_in_the_environment_fails_the_command() -> None:
    env = {**os.environ, "KVTIER_EVICTION_POLCY": "arc"}
    argv = [sys.executable, "-m", "kvtier", "check"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("ConfigError: KVTIER_EVICTION_POLCY: names no kvtier setting (did you mean")
