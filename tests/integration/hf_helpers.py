"""Tiny Llama models for the transformers-integration tests, also runnable as the writer subprocess.

``python hf_helpers.py store <root_dir> <n_tokens>`` builds the seeded tiny model, runs one
:meth:`PrefixCache.forward` over :func:`prompt` ``(n_tokens)`` with an fs tier at ``root_dir``,
closes the engine (which waits for the tier writes) and prints its counters as one JSON line. The
model and the prompt are pure functions of their seeds, so any process can rebuild them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from kvtier.integrations.transformers import PrefixCache

BLOCK = 16
VOCAB = 256

# The tiny model's matrices are too small for two threads: on a busy shared host torch's second
# thread made each forward 5-30x slower (measured), so the tests run torch on one.
torch.set_num_threads(1)


def tiny_model(seed: int = 0, dtype: Any = torch.float32, **config: Any) -> Any:
    """4 layers, hidden 64, 4 heads of 16, 2 KV heads: one 16-token block is 16 KiB in fp32."""
    base: dict[str, Any] = {
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
    }  # fmt: skip
    base.update(config)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**base)).to(dtype).eval()


def prompt(n: int, seed: int = 1) -> Any:
    """``(1, n)`` token ids, a pure function of ``seed``."""
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def ram_config() -> dict[str, Any]:
    return {"cpu_bytes_to_use": "8MiB", "model": "hf-test"}


def fs_config(root: str) -> dict[str, Any]:
    tier = {"type": "fs", "root_dir": str(root), "precreate_dirs": False, "refresh_interval": 0.05}
    return {**ram_config(), "secondary_tiers": [tier]}


def full_logits(model: Any, ids: Any) -> Any:
    """Logits of a plain forward over every token (the reference a restored prefix must match)."""
    with torch.no_grad():
        return model(input_ids=ids).logits


def spawn_args(mode: str, *args: object) -> list[str]:
    return [sys.executable, __file__, mode, *map(str, args)]


def main(argv: list[str]) -> int:
    mode, root, n = argv[0], argv[1], int(argv[2])
    if mode != "store":
        raise SystemExit(f"unknown mode {mode!r}; expected store")
    with PrefixCache.create(tiny_model(), fs_config(root), block_size=BLOCK) as pc:
        r = pc.forward(prompt(n))
        stats = pc.stats()
    print(json.dumps({"reused_tokens": r.reused_tokens, **stats}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
