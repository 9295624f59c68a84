"""Write a small random-weight Llama model and a word-level tokenizer to a directory vLLM can load.

No model can be downloaded on an offline machine; vLLM (and transformers) load this directory by path.
The weights are random, so the text is meaningless, but the KV cache, prefix caching and offloading
behave as with a real model of the same shape::

    python examples/make_tiny_llama.py /tmp/tiny-llama               # ~4.5M parameters, seconds
    python examples/make_tiny_llama.py /tmp/llama-100m --size 100m   # ~110M parameters (the benchmark's)

Tokens are ``t0`` ... ``t<vocab-1>``; pass prompts as token ids (vLLM's pre-check of a text prompt's
length assumes real words). Needs ``torch``, ``transformers`` and ``tokenizers`` (vLLM brings all three).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# name -> (hidden, layers, attention heads, KV heads, MLP width, vocabulary)
SIZES = {
    "tiny": (256, 4, 4, 2, 512, 4096),
    "100m": (768, 12, 12, 4, 2048, 32000),
}


def build(out: Path, size: str = "tiny", seed: int = 0) -> int:
    """Write the model and tokenizer to ``out``; the number of parameters."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    hidden, layers, heads, kv_heads, mlp, vocab = SIZES[size]
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=mlp,
        vocab_size=vocab,
        max_position_embeddings=8192,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    words = {f"t{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2"
    ).save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write (created)")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny", help="model shape (default: tiny)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    args = parser.parse_args(argv)
    count = build(args.out, args.size, args.seed)
    print(f"wrote a {count / 1e6:.1f}M-parameter Llama to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
