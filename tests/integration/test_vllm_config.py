"""vLLM's configuration as users write it: ``kvtier check`` and kvtier's config loader.

These run without vLLM installed: they check kvtier's reading of vLLM's keys. Whether vLLM itself
accepts the same configs is ``test_vllm_docs.py`` (through vLLM's factory and manager).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.cli.check import check_config
from kvtier.config import load_config
from kvtier.config.vllm import ADAPTER_CLASS, ADAPTER_MODULE, inline_secrets, split_adapter_entry
from kvtier.errors import ConfigError, PluginError

# vLLM 0.33's own example config, verbatim from the TieringOffloadingSpec docstring (tiering/spec.py).
VLLM_EXAMPLE: dict[str, Any] = {
    "cpu_bytes_to_use": 10737418240,
    "block_size": 16,
    "eviction_policy": "lru",
    "secondary_tiers": [{"type": "example", "custom_param": 67}],
}


def _kv_transfer(tiers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 1 << 30,
            "block_size": 16,
            "secondary_tiers": tiers,
            **extra,
        },
    }


def _kvtier(root: Path, **options: Any) -> dict[str, Any]:
    return {"type": ADAPTER_CLASS, "module_path": ADAPTER_MODULE, "root_dir": str(root), **options}


def test_vllm_example_as_kvtier_config_names_block_size_and_says_what_to_write() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(VLLM_EXAMPLE)
    assert err.value.key_path == "block_size"
    assert "tokens" in str(err.value) and '"block_bytes"' in str(err.value)
    without = {k: v for k, v in VLLM_EXAMPLE.items() if k != "block_size"}
    with pytest.raises(ConfigError) as err:
        load_config(without)
    assert err.value.key_path == "secondary_tiers[0].custom_param"
    assert "vLLM's example tier" in str(err.value)


def test_vllm_example_inside_kv_transfer_config_passes_check() -> None:
    raw = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": VLLM_EXAMPLE}
    with pytest.raises(ConfigError, match="spec_name"):
        check_config(raw)  # vLLM itself only reads secondary_tiers with TieringOffloadingSpec
    raw["kv_connector_extra_config"] = {**VLLM_EXAMPLE, "spec_name": "TieringOffloadingSpec"}
    report = check_config(raw)
    assert report["ok"] and report["tiers"] == [] and report["vllm_tiers"] == ["example"]


# vLLM 0.33's out-of-tree example from the same docstring: a tier class in a user's package.
VLLM_OOT_EXAMPLE: dict[str, Any] = {
    "cpu_bytes_to_use": 10737418240,
    "secondary_tiers": [
        {"type": "MyCustomTier", "module_path": "my_package.my_module", "custom_param": "value"}
    ],
}


def test_vllm_out_of_tree_example_names_the_module_or_is_left_to_vllm() -> None:
    # As kvtier's own config: kvtier loads the tier itself and names the key it cannot import.
    with pytest.raises(PluginError) as err:
        check_config(VLLM_OOT_EXAMPLE)
    assert str(err.value).startswith(
        "secondary_tiers[0].module_path: cannot import module 'my_package.my_module'"
    )
    # Inside --kv-transfer-config it is vLLM's tier (not a KvtierTier entry): listed, left to vLLM.
    raw = {
        "kv_connector": "OffloadingConnector",
        "kv_connector_extra_config": {**VLLM_OOT_EXAMPLE, "spec_name": "TieringOffloadingSpec"},
    }
    report = check_config(raw)
    assert report["ok"] and report["tiers"] == [] and report["vllm_tiers"] == ["MyCustomTier"]


def test_kv_transfer_config_checks_and_round_trips_each_kvtier_tier(tmp_path: Path) -> None:
    raw = _kv_transfer([{"type": "fs", "root_dir": "/vllm/own"}, _kvtier(tmp_path, max_bytes="64MiB")])
    report = check_config(raw)
    assert report["ok"], report
    (tier,) = report["tiers"]
    assert tier["type"] == "fs" and tier["target"] == "kvtier.tiers.fs:FsTier" and tier["ok"]
    assert report["vllm_tiers"] == ["fs"]
    cfg = load_config(raw)
    assert cfg.secondary_tiers[0].key_path == "secondary_tiers[1]"  # the index in vLLM's list
    assert cfg.raw == raw


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"kv_connector": "LMCacheConnectorV1"}, "kv_connector", "OffloadingConnector"),
        ({"kv_conector": "x"}, "kv_conector", "did you mean 'kv_connector'"),
        ({"cpu_bytes_to_use": "8GiB"}, "kv_connector_extra_config.cpu_bytes_to_use", "integer byte count"),
        ({"spec_name": "CPUOffloadingSpec"}, "kv_connector_extra_config.spec_name", "TieringOffloadingSpec"),
    ],
)
def test_kv_transfer_config_mistakes_name_the_key(
    tmp_path: Path, change: dict[str, Any], key: str, words: str
) -> None:
    raw = _kv_transfer([_kvtier(tmp_path)])
    extra = raw["kv_connector_extra_config"]
    for k, v in change.items():
        (raw if k.startswith("kv_") else extra)[k] = v
    with pytest.raises(ConfigError) as err:
        load_config(raw)
    assert err.value.key_path == key and words in str(err.value)


def test_kvtier_tier_options_are_validated_strictly(tmp_path: Path) -> None:
    # Inside vLLM an unknown option is only logged (it may come from a newer vLLM); check refuses it.
    with pytest.raises(ConfigError, match=r"max_bytse: .*did you mean 'max_bytes'"):
        check_config(_kv_transfer([_kvtier(tmp_path, max_bytse="1GiB")]))
    # enable_kv_events is vLLM's own tier key and means the same on a KvtierTier entry: accepted,
    # and never passed to the kvtier tier (whose strict option check would refuse it).
    for value in (True, False):
        report = check_config(_kv_transfer([_kvtier(tmp_path, enable_kv_events=value)]))
        assert report["tiers"][0]["ok"], report
    with pytest.raises(ConfigError, match=r"enable_kv_events: expected true or false"):
        check_config(_kv_transfer([_kvtier(tmp_path, enable_kv_events="yes")]))


def test_vllm_fs_keys_in_kvtier_own_config(tmp_path: Path) -> None:
    cfg = load_config({"secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path), "n_read_threads": 8}]})
    assert dict(cfg.secondary_tiers[0].options) == {"root_dir": str(tmp_path), "threads": 8 + 16}
    for key, value, words in [
        ("enable_kv_events", True, "KV events"),
        ("locality", "REMOTE", "KvtierTier entry"),
        ("n_read_threads", 0, "integer >= 1"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config({"secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path), key: value}]})
        assert err.value.key_path == f"secondary_tiers[0].{key}" and words in str(err.value)


def test_kvtier_check_cli_takes_the_exact_vllm_serve_json(tmp_path: Path) -> None:
    text = json.dumps(_kv_transfer([_kvtier(tmp_path)]))
    cmd = [sys.executable, "-m", "kvtier.cli.main", "check", text]
    ok = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["tiers"][0]["ok"]
    bad = subprocess.run(
        [*cmd[:-1], text.replace("OffloadingConnector", "NixlConnector")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert (
        bad.stderr.strip().startswith("ConfigError: kv_connector:")
        and len(bad.stderr.strip().splitlines()) == 1
    )


_names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
_values = st.one_of(st.integers(-5, 5), st.text(max_size=5), st.booleans(), st.none())


@given(st.dictionaries(_names, _values, max_size=6))
def test_adapter_entry_passes_every_other_option_to_the_kvtier_tier(options: dict[str, Any]) -> None:
    reserved = {"tier", "tier_module_path", "name", "cache_salt", "locality", "enable_kv_events"}
    reserved |= {"type", "module_path", "backpressure", "n_read_threads", "n_write_threads", "threads"}
    options = {k: v for k, v in options.items() if k not in reserved}
    entry = {"type": ADAPTER_CLASS, "module_path": ADAPTER_MODULE, "tier": "x", **options}
    opts, kv_entry = split_adapter_entry(entry, "t.")
    assert opts.tier == "x"
    assert kv_entry == {"type": "x", **options}


@given(st.integers(1, 64), st.integers(1, 64), st.booleans(), st.booleans())
def test_fs_thread_keys_sum_like_vllms_two_pools(
    n_read: int, n_write: int, give_r: bool, give_w: bool
) -> None:
    opts: dict[str, Any] = {"root_dir": "/x"}
    if give_r:
        opts["n_read_threads"] = n_read
    if give_w:
        opts["n_write_threads"] = n_write
    cfg = load_config({"secondary_tiers": [{"type": "fs", **opts}]})
    threads = cfg.secondary_tiers[0].options.get("threads")
    if give_r or give_w:
        assert threads == (n_read if give_r else 16) + (n_write if give_w else 16)
    else:
        assert threads is None


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"url": "redis://:pw@10.0.0.5:6379/0"}, [("url", "password_env")]),
        ({"url": "rediss+cluster://user:pw@10.0.0.5:7000"}, [("url", "password_env")]),
        ({"url": "redis://user@10.0.0.5:6379/0"}, []),  # a user name is no secret
        ({"url": "redis://10.0.0.5:6379/0", "password_env": "P"}, []),
        ({"secret_access_key": "s", "access_key_id": "a"}, [
            ("secret_access_key", "secret_key_env"), ("access_key_id", "access_key_env")]),
        ({"access_key_env": "A", "secret_key_env": "S"}, []),
        ({"url": "redis://[bad"}, []),  # malformed: the tier reports it, never this check
    ],
)  # fmt: skip
def test_inline_secrets_names_the_key_and_the_env_option(
    entry: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    assert inline_secrets(entry) == expected


_NAMES = {
    ("url", "password_env"),
    ("secret_access_key", "secret_key_env"),
    ("access_key_id", "access_key_env"),
    ("session_token", "an AWS profile or role"),
}


@given(
    # No control characters: urlsplit drops tab/CR/LF (WHATWG URL parsing), so none is a password.
    password=st.text(
        alphabet=st.characters(blacklist_characters="@/:#?[]", blacklist_categories=("Cs", "Cc"))
    ),
    key=st.sampled_from(["secret_access_key", "access_key_id", "session_token", "bucket"]),
    value=st.text(),
)
def test_inline_secrets_reports_fixed_names_never_values(password: str, key: str, value: str) -> None:
    found = inline_secrets({"url": f"redis://u:{password}@h:1/0", key: value})
    # Only fixed (key, option) names come back, so no value can reach the log line built from them.
    assert set(found) <= _NAMES
    assert (("url", "password_env") in found) == bool(password)
    assert any(k == key for k, _ in found) == (bool(value) and key != "bucket")


def test_p2p_serve_in_a_kvtier_entry_is_kept_but_not_with_a_directory() -> None:
    entry = {
        "type": ADAPTER_CLASS,
        "module_path": ADAPTER_MODULE,
        "tier": "p2p",
        "peers": ["127.0.0.1:1"],
        "serve": {"port": 0},
    }
    opts, kv_entry = split_adapter_entry(entry, "KvtierTier.")
    assert opts.tier == "p2p" and kv_entry == {"type": "p2p", "peers": ["127.0.0.1:1"], "serve": {"port": 0}}
    with pytest.raises(ConfigError) as err:
        split_adapter_entry({**entry, "directory": "redis://127.0.0.1:1/0"}, "KvtierTier.")
    assert err.value.key_path == "KvtierTier.directory"
    assert "list the serving instances in peers" in str(err.value)
    # A directory without serve (a client finding other holders) stays allowed.
    _opts, kv_entry = split_adapter_entry(
        {k: v for k, v in entry.items() if k != "serve"} | {"directory": "redis://127.0.0.1:1/0"},
        "KvtierTier.",
    )
    assert kv_entry["directory"] == "redis://127.0.0.1:1/0"
