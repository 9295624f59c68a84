"""KV-cache bytes per token of a model, from its Hugging Face ``config.json``.

One token of one full-attention layer stores a key and a value vector per KV head:
``2 * num_key_value_heads * head_dim * dtype_bytes`` bytes. Summed over the layers this is what a
block of the trace costs in every tier (times the trace's tokens per block).

Handled:
    * grouped-query and multi-query attention (``num_key_value_heads``; ``multi_query``; absent =
      multi-head, one KV head per attention head);
    * ``head_dim`` given or ``hidden_size // num_attention_heads``;
    * multimodal configs whose language model sits under ``text_config`` (or ``llm_config``);
    * **MLA** (DeepSeek-V2/V3 style, ``kv_lora_rank`` present): one compressed latent of
      ``kv_lora_rank + qk_rope_head_dim`` values per token and layer, no separate K and V (what vLLM
      caches for MLA models);
    * the dtype from ``torch_dtype`` / ``dtype`` unless ``kv_dtype`` overrides it (an fp8 KV cache).

Refused with a :class:`~kvtier.errors.ConfigError` naming the key and the way out:
    * sliding-window layers (``layer_types`` naming ``sliding_attention``, or a ``sliding_window``
      that is in use): those layers keep only the last window of tokens, so a prefix block's KV is not
      a fixed size per token and the planner's block model does not hold; the message gives the
      full-attention layers' figure to pass as ``--kv-bytes-per-token`` if the engine caches only those;
    * a config without the fields above.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError

__all__ = ["DTYPE_BYTES", "ModelKV", "kv_from_config", "load_model_config"]

#: Bytes per element of the dtype names found in ``torch_dtype`` / ``dtype`` and ``--kv-dtype``.
DTYPE_BYTES: Mapping[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8": 1,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}


@dataclass(frozen=True, slots=True)
class ModelKV:
    """The KV footprint of a model.

    Attributes:
        name: what the config calls the model (``_name_or_path`` / ``model_type``) or the file name.
        bytes_per_token: KV bytes one token occupies over all layers.
        layers: layers that cache KV.
        kv_heads: KV heads per layer (1 for MLA: one latent vector).
        head_dim: values per head and token (for MLA: ``kv_lora_rank + qk_rope_head_dim``).
        dtype_bytes: bytes per value.
        attention: ``"gqa"``, ``"mha"``, ``"mqa"`` or ``"mla"``.
        notes: how each figure was derived (for reports).
    """

    name: str
    bytes_per_token: int
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    attention: str
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Every field, in declaration order (the ``model`` object of ``kvtier plan --json``)."""
        return asdict(self)


def load_model_config(path: str | Path) -> dict[str, Any]:
    """Read a ``config.json``; :class:`ConfigError` naming the file on any problem."""
    from kvtier.config.files import read_object_file

    expected = "a JSON object (a Hugging Face config.json)"
    return dict(read_object_file(path, "--model-config", what="model config", expected=expected))


def _int(cfg: Mapping[str, Any], key: str, where: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}.{key}", f"expected an integer >= 1, got {value!r}")
    return value


def _dtype_bytes(cfg: Mapping[str, Any], kv_dtype: str | None, where: str, notes: list[str]) -> int:
    if kv_dtype is not None:
        name, key = kv_dtype, "--kv-dtype"
    else:
        name, key = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), f"{where}.torch_dtype"
        if "torch_dtype" not in cfg and "dtype" not in cfg:
            notes.append("no torch_dtype in the config: assumed bfloat16")
    size = DTYPE_BYTES.get(name.lower().removeprefix("torch."))
    if size is None:
        raise ConfigError(key, f"unknown dtype {name!r}; use one of {', '.join(sorted(DTYPE_BYTES))}")
    return size


def _sliding_layers(cfg: Mapping[str, Any], layers: int) -> int:
    """How many layers use a sliding window (0 when the config says none do)."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return sum(1 for t in types if "sliding" in str(t))
    window = cfg.get("sliding_window")
    if window in (None, 0, False) or cfg.get("use_sliding_window") is False:
        return 0
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 1:
        # Gemma-3-style: every pattern-th layer is global, the others slide.
        return layers - layers // pattern
    # Qwen2-style configs: only layers from max_window_layers on slide.
    mwl = cfg.get("max_window_layers")
    if isinstance(mwl, int) and cfg.get("use_sliding_window") is True:
        return max(0, layers - mwl)
    return layers


def kv_from_config(
    config: Mapping[str, Any], *, kv_dtype: str | None = None, source: str = "config.json"
) -> ModelKV:
    """The :class:`ModelKV` of a Hugging Face model config (see the module docstring for the rules)."""
    where = source
    cfg: Mapping[str, Any] = config
    notes: list[str] = []
    for sub in ("text_config", "llm_config"):
        inner = config.get(sub)
        if isinstance(inner, Mapping) and "num_hidden_layers" in inner:
            cfg, where = inner, f"{source}.{sub}"
            notes.append(f"language model read from {sub}")
            break
    name = str(config.get("_name_or_path") or config.get("model_type") or source)
    layers = _int(cfg, "num_hidden_layers", where)
    dtype_bytes = _dtype_bytes(cfg, kv_dtype, where, notes)
    if cfg.get("kv_lora_rank"):
        rank = _int(cfg, "kv_lora_rank", where)
        rope = int(cfg.get("qk_rope_head_dim") or 0)
        dim = rank + rope
        notes.append(f"MLA: one latent of kv_lora_rank {rank} + qk_rope_head_dim {rope} per token and layer")
        return ModelKV(name, layers * dim * dtype_bytes, layers, 1, dim, dtype_bytes, "mla", notes)
    heads = _int(cfg, "num_attention_heads", where)
    if cfg.get("num_key_value_heads") is not None:
        kv_heads = _int(cfg, "num_key_value_heads", where)
    elif cfg.get("multi_query"):
        kv_heads = 1
    else:
        kv_heads = heads
        notes.append("no num_key_value_heads: multi-head attention assumed")
    attention = "mqa" if kv_heads == 1 else ("mha" if kv_heads == heads else "gqa")
    if cfg.get("head_dim"):
        head_dim = _int(cfg, "head_dim", where)
    else:
        hidden = _int(cfg, "hidden_size", where)
        if hidden % heads:
            raise ConfigError(
                f"{where}.head_dim", f"missing, and hidden_size {hidden} is not a multiple of {heads} heads"
            )
        head_dim = hidden // heads
    per_layer = 2 * kv_heads * head_dim * dtype_bytes
    sliding = _sliding_layers(cfg, layers)
    if sliding:
        full = layers - sliding
        way_out = (
            f"if your engine offloads only the {full} full-attention layers, pass --kv-bytes-per-token "
            f"{full * per_layer}"
            if full
            else "pass --kv-bytes-per-token with the bytes per token your engine offloads"
        )
        raise ConfigError(
            f"{where}.sliding_window",
            f"{sliding} of {layers} layers use a sliding window, which the planner does not model (their KV "
            f"is not a fixed size per prefix token); {way_out}",
        )
    return ModelKV(name, layers * per_layer, layers, kv_heads, head_dim, dtype_bytes, attention, notes)
