"""Time to first token with and without kvtier, for a multi-turn chat over a shared 2,048-token prefix.

A tiny Llama-architecture model is built from a config with random weights (nothing is downloaded).
Every turn's prompt is the shared prefix (a system prompt or document), the conversation so far and
a new user message. Each turn is run twice, in alternating order:

* without kvtier: one plain ``model(prompt)`` forward over the whole prompt, as transformers does
  for a new request;
* with kvtier: :meth:`PrefixCache.forward`, which restores the cached blocks of the prompt and
  computes only the rest.

TTFT is the wall time until the first answer token's logits exist (both argmaxes must agree); both
paths ask for the last position's logits only (``logits_to_keep=1``), as ``generate`` does. The
model's greedy answer (``PrefixCache.generate``) then joins the conversation. Turn 0 is the first
turn (cold, unless ``--fs`` holds an earlier run's blocks: kvtier computes and stores); the speedup
is the median over the later, warm turns.

    python examples/hf_prefix_reuse.py            # human-readable lines
    python examples/hf_prefix_reuse.py --json     # one JSON object; ratios.ttft = without / with
    python examples/hf_prefix_reuse.py --fs /tmp/kv   # RAM + fs tier (run twice: the second run's
                                                      # cold turn reuses the first run's blocks)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from kvtier.integrations.transformers import PrefixCache


def build_model(args: argparse.Namespace) -> Any:
    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=8192,
    )
    torch.manual_seed(args.seed)  # same weights in every run, so an fs tier can be reused
    return LlamaForCausalLM(cfg).eval()


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = build_model(args)
    config: dict[str, Any] = {"cpu_bytes_to_use": "512MiB", "model": "hf-prefix-reuse-example"}
    if args.fs:
        config["secondary_tiers"] = [{"type": "fs", "root_dir": args.fs}]
    rng = torch.Generator().manual_seed(args.seed + 1)

    def tokens(n: int) -> Any:
        return torch.randint(3, args.vocab, (1, n), generator=rng)

    prefix = tokens(args.prefix_tokens)
    turns: list[dict[str, Any]] = []
    with PrefixCache.create(model, config, block_size=args.block_size) as pc:

        def without(ids: Any) -> Any:
            with torch.no_grad():
                return int(model(input_ids=ids, use_cache=True, logits_to_keep=1).logits[0, -1].argmax())

        def with_kvtier(ids: Any) -> tuple[int, int]:
            r = pc.forward(ids, logits_to_keep=1)
            return int(r.output.logits[0, -1].argmax()), r.reused_tokens

        # Warm both paths (allocator, kernels) on an unrelated prompt of the same size.
        warm = tokens(args.prefix_tokens + args.user_tokens)
        for _ in range(2):
            without(warm)
            with_kvtier(warm)
        history = prefix
        for turn in range(args.turns):
            prompt = torch.cat([history, tokens(args.user_tokens)], dim=1)
            order = ("without", "with") if turn % 2 == 0 else ("with", "without")
            row: dict[str, Any] = {"turn": turn, "prompt_tokens": int(prompt.shape[1])}
            for which in order:
                if which == "without":
                    row["next_without"], row["ttft_without_s"] = timed(lambda p=prompt: without(p))
                else:
                    (nxt, reused), row["ttft_with_s"] = timed(lambda p=prompt: with_kvtier(p))
                    row["next_with"], row["reused_tokens"] = nxt, reused
            turns.append(row)
            answer = pc.generate(prompt, max_new_tokens=args.answer_tokens, do_sample=False)
            history = answer  # prompt + the model's greedy answer: the next turn's context
        kv_stats = pc.stats()
    warm_turns = turns[1:] or turns
    med_without = statistics.median(t["ttft_without_s"] for t in warm_turns)
    med_with = statistics.median(t["ttft_with_s"] for t in warm_turns)
    reused = sum(t["reused_tokens"] for t in warm_turns)
    total = sum(t["prompt_tokens"] for t in warm_turns)
    return {
        "model": {
            "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "kv_heads": args.kv_heads,
            "vocab": args.vocab, "dtype": str(model.dtype),
            "params": sum(p.numel() for p in model.parameters()),
        },
        "prefix_tokens": args.prefix_tokens, "block_size": args.block_size, "fs": args.fs or None,
        "torch_threads": torch.get_num_threads(),
        "turns": turns,
        "ttft_ms": {"without": med_without * 1e3, "with": med_with * 1e3},
        "hit_ratio": reused / total,
        "same_next_token": all(t["next_with"] == t["next_without"] for t in turns),
        "ratios": {"ttft": med_without / med_with},
        "kvtier": kv_stats,
    }  # fmt: skip


def print_report(r: dict[str, Any]) -> None:
    m = r["model"]
    print(
        f"model: Llama, {m['layers']} layers, hidden {m['hidden']}, {m['kv_heads']} KV heads, {m['dtype']}, "
        f"{m['params'] / 1e6:.1f}M params (random weights); kvtier block {r['block_size']} tokens"
        + (f"; fs tier {r['fs']}" if r["fs"] else "; RAM tier only")
    )
    for t in r["turns"]:
        label = "turn 0 (first)" if t["turn"] == 0 else f"turn {t['turn']}"
        print(
            f"{label}: {t['prompt_tokens']} prompt tokens, TTFT without {t['ttft_without_s'] * 1e3:.1f} ms, "
            f"with {t['ttft_with_s'] * 1e3:.1f} ms ({t['reused_tokens']} tokens reused)"
        )
    n = len(r["turns"]) - 1
    print(
        f"TTFT median over {n} warm turns, {r['prefix_tokens']}-token shared prefix: without kvtier "
        f"{r['ttft_ms']['without']:.1f} ms, with kvtier {r['ttft_ms']['with']:.1f} ms: "
        f"{r['ratios']['ttft']:.1f}x faster"
    )
    print(f"hit ratio (reused / prompt tokens, warm turns): {r['hit_ratio']:.3f}")
    print(f"same next token with and without kvtier on every turn: {'yes' if r['same_next_token'] else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefix-tokens", type=int, default=2048)
    p.add_argument("--turns", type=int, default=6, help="turns, the first one cold (default 6)")
    p.add_argument("--user-tokens", type=int, default=48)
    p.add_argument("--answer-tokens", type=int, default=16)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fs", default="", help="also use an fs tier in this directory")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    args = p.parse_args(argv)
    if args.turns < 2:
        p.error("--turns must be at least 2 (one cold turn, then warm ones)")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print_report(result)
    return 0 if result["same_next_token"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
