"""Config loading and validation: every source form, sizes, key paths in one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kvtier.config import KvtierConfig, PluginsConfig, TierConfig, load_config, parse_size
from kvtier.errors import ConfigError

# -- sizes -------------------------------------------------------------------------------------
UNITS = {"": 1, "B": 1, "KB": 1000, "KiB": 1024, "MB": 10**6, "MiB": 1 << 20, "GB": 10**9, "GiB": 1 << 30,
         "TB": 10**12, "TiB": 1 << 40, "PiB": 1 << 50, "Ki": 1024, "K": 1000}  # fmt: skip


@given(st.integers(0, 10**6), st.sampled_from(sorted(UNITS)), st.sampled_from(["", " "]), st.booleans())
def test_parse_size_units(n: int, unit: str, space: str, lower: bool) -> None:
    text = f"{n}{space}{unit}"
    assert parse_size(text.lower() if lower else text, "k") == n * UNITS[unit]


@given(st.integers(0, 2**62))
def test_parse_size_integers_and_integral_floats(n: int) -> None:
    assert parse_size(n, "k") == n
    assert parse_size(str(n), "k") == n
    assert parse_size(float(n), "k") == int(float(n))


def test_parse_size_fractions() -> None:
    assert parse_size("1.5GiB", "k") == 3 << 29
    assert parse_size("0.5 KiB", "k") == 512


@pytest.mark.parametrize(
    "bad", [True, False, -1, "-1", "8XB", "GiB", "", "8 GiB x", 1.5, None, [1], "1e9", "8iB"]
)
def test_parse_size_rejects(bad: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(bad, "secondary_tiers[0].max_bytes")
    assert str(info.value).startswith("secondary_tiers[0].max_bytes: ")
    assert "\n" not in str(info.value)


# -- sources -----------------------------------------------------------------------------------
FULL = {
    "cpu_bytes_to_use": "64MiB",
    "block_bytes": "1MiB",
    "eviction_policy": "arc",
    "policy_options": {"p": 1},
    "spec_name": "TieringOffloadingSpec",
    "secondary_tiers": [
        {"type": "example", "capacity_blocks": 8},
        {"type": "MyTier", "module_path": "corp.kv.tiers", "root_dir": "/mnt/kv", "name": "disk"},
    ],
    "plugins": {"allow_module_path": True, "allowed_modules": ["corp.kv"]},
    "primary_backing": "shm",
    "shm_name": "kvtier-test",
    "write_policy": "after_hits",
    "write_after_hits": 2,
    "model": "llama-3-8b",
    "cache_salt": "tenant-a",
    "max_inflight_jobs": 16,
    "promotion_share": 0.25,
    "metrics_port": 9400,
    "cost_model": {"recompute_us_per_token": 12},
}


def check_full(cfg: KvtierConfig) -> None:
    assert cfg.cpu_bytes_to_use == 64 << 20 and cfg.block_bytes == 1 << 20
    assert cfg.num_primary_slots == 64 and cfg.row_stride == 1 << 20
    assert cfg.eviction_policy == "arc" and dict(cfg.policy_options) == {"p": 1}
    assert cfg.secondary_tiers == (
        TierConfig("example", None, {"capacity_blocks": 8}, 0),
        TierConfig("MyTier", "corp.kv.tiers", {"root_dir": "/mnt/kv", "name": "disk"}, 1),
    )
    assert cfg.secondary_tiers[1].key_path == "secondary_tiers[1]"
    assert cfg.plugins == PluginsConfig(True, ("corp.kv",))
    assert (cfg.primary_backing, cfg.write_policy, cfg.write_after_hits) == ("shm", "after_hits", 2)
    assert (cfg.promotion_share, cfg.metrics_port, cfg.max_inflight_jobs) == (0.25, 9400, 16)


def test_every_source_form_gives_the_same_config(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text(json.dumps(FULL))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(FULL))
    (tmp_path / "c.yml").write_text(yaml.safe_dump(FULL))
    forms: list[Any] = [
        FULL,
        json.dumps(FULL),
        "  \n" + json.dumps(FULL, indent=2),
        tmp_path / "c.json",
        str(tmp_path / "c.yaml"),
        tmp_path / "c.yml",
    ]
    configs = [load_config(f) for f in forms]
    for cfg in configs:
        check_full(cfg)
        assert cfg == configs[0]
    assert load_config(configs[0]) is configs[0]


def test_defaults() -> None:
    for cfg in (load_config(None), load_config({}), KvtierConfig.from_mapping({})):
        assert cfg == KvtierConfig()
        assert cfg.spec_name == "tiering" and cfg.eviction_policy == "lru" and cfg.secondary_tiers == ()
        assert cfg.plugins.permits("anything.at.all")


def test_empty_yaml_file_is_defaults(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    assert load_config(tmp_path / "empty.yaml") == KvtierConfig()


def test_row_stride_is_page_aligned() -> None:
    cfg = load_config({"block_bytes": 5000, "cpu_bytes_to_use": 8192 * 3 + 1})
    assert cfg.row_stride == 8192 and cfg.num_primary_slots == 3


# -- errors name the key path -------------------------------------------------------------------
BAD: list[tuple[dict[str, Any], str]] = [
    ({"cpu_bytes_to_usee": 1}, "cpu_bytes_to_usee: unknown key (did you mean 'cpu_bytes_to_use'?)"),
    ({"block_bytes": "lots"}, "block_bytes: expected a size"),
    ({"block_bytes": 0}, "block_bytes: must be at least 1 byte"),
    ({"cpu_bytes_to_use": 100, "block_bytes": 4096}, "cpu_bytes_to_use: 100 bytes hold no slot"),
    ({"eviction_policy": ""}, "eviction_policy: must not be empty"),
    ({"eviction_policy": 3}, "eviction_policy: expected a string"),
    ({"cache_policy_module_path": "  "}, "cache_policy_module_path: must not be empty"),
    ({"policy_options": []}, "policy_options: expected an object"),
    ({"secondary_tiers": {"type": "fs"}}, "secondary_tiers: expected a list"),
    ({"secondary_tiers": ["fs"]}, "secondary_tiers[0]: expected an object"),
    ({"secondary_tiers": [{"type": "example"}, {"root_dir": "/x"}]}, "secondary_tiers[1].type: missing"),
    ({"secondary_tiers": [{"type": ""}]}, "secondary_tiers[0].type: must not be empty"),
    ({"secondary_tiers": [{"type": 7}]}, "secondary_tiers[0].type: expected a tier name string"),
    (
        {"secondary_tiers": [{"type": "x", "module_path": 1}]},
        "secondary_tiers[0].module_path: expected a string",
    ),
    ({"plugins": {"allow_module_paths": False}}, "plugins.allow_module_paths: unknown key (did you mean"),
    ({"plugins": {"allow_module_path": "no"}}, "plugins.allow_module_path: expected true or false"),
    ({"plugins": {"allowed_modules": "corp"}}, "plugins.allowed_modules: expected a list"),
    ({"plugins": {"allowed_modules": ["ok", 3]}}, "plugins.allowed_modules[1]: expected a module prefix"),
    ({"plugins": {"allowed_modules": ["."]}}, "plugins.allowed_modules[0]: must name a module prefix"),
    ({"primary_backing": "gpu"}, "primary_backing: expected one of heap, shm, torch, none"),
    ({"write_policy": "sometimes"}, "write_policy: expected one of write_through, write_back, after_hits"),
    ({"write_after_hits": 0}, "write_after_hits: must be >= 1"),
    ({"max_inflight_jobs": True}, "max_inflight_jobs: expected an integer"),
    ({"promotion_share": 0}, "promotion_share: must be in (0, 1]"),
    ({"promotion_share": 1.5}, "promotion_share: must be in (0, 1]"),
    ({"metrics_port": 70000}, "metrics_port: must be in 0..65535"),
    ({"metrics_port": "9400"}, "metrics_port: expected a TCP port number"),
    ({"primary_row_pad": -1}, "primary_row_pad: size must be >= 0"),
    ({"primary_row_pad": "2MiB"}, "primary_row_pad: at most 1048576 bytes"),
]


@pytest.mark.parametrize(("raw", "start"), BAD, ids=[b[1].split(":")[0] for b in BAD])
def test_bad_values_are_one_line_errors_naming_the_key(raw: dict[str, Any], start: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(raw)
    msg = str(info.value)
    assert msg.startswith(start), msg
    assert "\n" not in msg
    assert info.value.key_path == start.split(":")[0]
    # The same error from a JSON string (as vLLM users pass it).
    with pytest.raises(ConfigError, match=None) as again:
        load_config(json.dumps(raw))
    assert str(again.value) == msg


def test_backing_none_allows_zero_slots() -> None:
    assert load_config({"primary_backing": "none", "cpu_bytes_to_use": 0}).num_primary_slots == 0


def test_allowed_module_prefix_is_normalised() -> None:
    cfg = load_config({"plugins": {"allowed_modules": [" corp.kv. "]}})
    assert cfg.plugins.allowed_modules == ("corp.kv",)
    assert cfg.plugins.permits("corp.kv.tiers") and cfg.plugins.permits("corp.kv")
    assert not cfg.plugins.permits("corp.kvx") and not cfg.plugins.permits("corp")
    assert not load_config({"plugins": {"allow_module_path": False}}).plugins.permits("corp.kv")


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("bad.json", "{oops", "invalid JSON"),
        ("bad.yaml", "a: [1, 2", "invalid YAML"),
        ("list.json", "[1, 2]", "config must be an object/mapping, got list"),
        ("bin.json", b"\xff\xfe\x00garbage", "config file is not UTF-8 text"),
    ],
)
def test_bad_files_are_one_line_config_errors(
    tmp_path: Path, name: str, content: str | bytes, expected: str
) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(path)
    assert "\n" not in str(info.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.json")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path)


def test_invalid_json_string() -> None:
    with pytest.raises(ConfigError, match="config JSON string is invalid"):
        load_config('{"block_bytes": }')


# -- round trip property -------------------------------------------------------------------------
tier_st = st.fixed_dictionaries(
    {"type": st.sampled_from(["example", "fs", "Custom"])},
    optional={
        "module_path": st.sampled_from(["corp.tiers", "a.b:C"]),
        "capacity_blocks": st.integers(1, 1000),
        "root_dir": st.text("abc/", min_size=1, max_size=8),
    },
)
config_st = st.fixed_dictionaries(
    {},
    optional={
        "cpu_bytes_to_use": st.sampled_from(["1GiB", "64MiB", 1 << 26, "100 MB"]),
        "block_bytes": st.sampled_from(["1MiB", 4096, "256KiB", 5000]),
        "eviction_policy": st.sampled_from(["lru", "arc", "MyPolicy"]),
        "secondary_tiers": st.lists(tier_st, max_size=3),
        "write_policy": st.sampled_from(["write_through", "write_back", "after_hits"]),
        "promotion_share": st.floats(0.01, 1.0),
        "cache_salt": st.text(max_size=5),
    },
)


@given(config_st)
def test_dict_json_and_yaml_agree(raw: dict[str, Any]) -> None:
    from_dict = load_config(raw)
    assert load_config(json.dumps(raw)) == from_dict
    assert load_config(yaml.safe_load(yaml.safe_dump(raw))) == from_dict
    assert [t.index for t in from_dict.secondary_tiers] == list(range(len(raw.get("secondary_tiers", []))))
    for tc, entry in zip(from_dict.secondary_tiers, raw.get("secondary_tiers", []), strict=True):
        assert "type" not in tc.options and "module_path" not in tc.options
        assert {
            **tc.options,
            "type": tc.type,
            **({"module_path": tc.module_path} if tc.module_path else {}),
        } == entry


@pytest.mark.parametrize(
    ("block", "pad", "stride"), [(5000, 0, 8192), (5000, 1, 12288), (1 << 18, 4096, (1 << 18) + 4096)]
)
def test_primary_row_pad_adds_whole_pages_after_the_block(block: int, pad: int, stride: int) -> None:
    """Rows keep the block's 4 KiB pages as they are, then the pad in whole pages; slots count it."""
    cfg = load_config({"block_bytes": block, "cpu_bytes_to_use": 3 * stride, "primary_row_pad": pad})
    assert (cfg.row_stride, cfg.num_primary_slots, cfg.primary_row_pad) == (stride, 3, pad)


def test_vllm_refuses_a_row_pad_naming_the_key() -> None:
    """vLLM's shared offload region fixes the rows: a pad there would configure nothing."""
    from kvtier.config.vllm import spec_block

    with pytest.raises(ConfigError, match=r"^kvtier\.primary_row_pad: remove it"):
        spec_block({"kvtier": {"primary_row_pad": 4096}})
