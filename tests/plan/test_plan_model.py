"""KV bytes per token from Hugging Face configs: GQA, MHA, MLA, nesting, dtypes, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.plan.model import kv_from_config, load_model_config

#: Llama-3-8B's shape (the fields the planner reads), written here rather than downloaded.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}


def test_llama3_8b_is_128_kib_per_token() -> None:
    m = kv_from_config(LLAMA3_8B)
    # 32 layers x 8 KV heads x 128 dims x (K and V) x 2 bytes
    assert m.bytes_per_token == 32 * 8 * 128 * 2 * 2 == 131072
    assert (m.attention, m.head_dim, m.kv_heads) == ("gqa", 128, 8)


def test_fp8_kv_cache_halves_it_and_bad_dtype_is_named() -> None:
    assert kv_from_config(LLAMA3_8B, kv_dtype="fp8").bytes_per_token == 65536
    with pytest.raises(ConfigError, match=r"--kv-dtype.*unknown dtype 'int3'"):
        kv_from_config(LLAMA3_8B, kv_dtype="int3")


def test_mha_without_kv_heads_and_explicit_head_dim() -> None:
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "torch_dtype": "float32"}
    m = kv_from_config(cfg)
    assert (m.attention, m.bytes_per_token) == ("mha", 2 * 2 * 4 * 16 * 4)
    assert kv_from_config({**cfg, "head_dim": 32}).bytes_per_token == 2 * 2 * 4 * 32 * 4


def test_mla_caches_one_latent_per_layer() -> None:
    cfg = {"num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "hidden_size": 2048,
           "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}  # fmt: skip
    m = kv_from_config(cfg)
    assert (m.attention, m.bytes_per_token) == ("mla", 27 * (512 + 64) * 2)


def test_text_config_of_a_multimodal_model_is_used() -> None:
    m = kv_from_config({"model_type": "llava", "text_config": LLAMA3_8B})
    assert m.bytes_per_token == 131072 and any("text_config" in n for n in m.notes)


def test_sliding_window_layers_are_refused_with_the_way_out() -> None:
    gemma = {**LLAMA3_8B, "num_hidden_layers": 4, "sliding_window": 4096,
             "layer_types": ["sliding_attention", "full_attention"] * 2}  # fmt: skip
    with pytest.raises(ConfigError, match=r"2 of 4 layers use a sliding window.*--kv-bytes-per-token 8192"):
        kv_from_config(gemma)
    with pytest.raises(ConfigError, match=r"4 of 4 layers.*bytes per token your engine offloads"):
        kv_from_config({**LLAMA3_8B, "num_hidden_layers": 4, "sliding_window": 4096})
    gemma3 = {**LLAMA3_8B, "num_hidden_layers": 12, "sliding_window": 1024, "sliding_window_pattern": 6}
    with pytest.raises(ConfigError, match=r"10 of 12 layers.*--kv-bytes-per-token 8192"):
        kv_from_config(gemma3)
    # Qwen2-style: a window that is configured but not in use is ignored.
    qwen = {**LLAMA3_8B, "sliding_window": 32768, "use_sliding_window": False}
    assert kv_from_config(qwen).bytes_per_token == 131072


def test_missing_fields_and_bad_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config.json.num_hidden_layers"):
        kv_from_config({"hidden_size": 8})
    bad = tmp_path / "config.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match=r"--model-config: .*config.json:1:2: invalid JSON"):
        load_model_config(bad)
    with pytest.raises(ConfigError, match=r"cannot read"):
        load_model_config(tmp_path / "absent.json")
    bad.write_text(json.dumps(LLAMA3_8B))
    assert kv_from_config(load_model_config(bad)).bytes_per_token == 131072
