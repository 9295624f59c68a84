"""Chained block keys: determinism across processes, tenant isolation, chain structure."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.keys import KEY_BYTES, KeyNamespace, chain_key, make_namespace

_SCRIPT = """
import numpy as np
from kvtier.keys import make_namespace
ns = make_namespace("llama-3-8b@rev1", block_size=16, dtype="bfloat16", layout="32x8x128", cache_salt="t1")
toks = np.arange(1000, dtype=np.int64) * 7919 % 128256
keys = ns.key_tokens(toks, extra=b"lora:3", partial=True)
keys += ns.wrap_engine_hashes([b"\\x01" * 32, b"abc"]) + ns.trace_keys([0, 5, 2**40])
print(",".join(k.hex() for k in keys))
"""


def _keys_in_subprocess(seed: str) -> str:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_keys_identical_across_processes_with_different_hash_seeds() -> None:
    a = _keys_in_subprocess("0")
    b = _keys_in_subprocess("12345")
    c = _keys_in_subprocess("random")
    assert a == b == c
    assert len(a.split(",")) == 62 + 1 + 2 + 3  # 62 full blocks + 1 partial, 2 engine, 3 trace


def _ns(salt: str = "", model: str = "m") -> KeyNamespace:
    return make_namespace(model, block_size=4, dtype="float16", layout="L", cache_salt=salt)


def test_two_tenants_keys_disjoint() -> None:
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 50_000, size=int(rng.integers(4, 400))) for _ in range(200)]
    # Shared prefixes within a tenant are expected; across tenants nothing may collide.
    seqs += [np.concatenate([seqs[0][:40], s]) for s in seqs[:50]]
    a, b = _ns("tenant-a"), _ns("tenant-b")
    keys_a = {k for s in seqs for k in a.key_tokens(s)}
    keys_b = {k for s in seqs for k in b.key_tokens(s)}
    assert keys_a and keys_b
    assert keys_a.isdisjoint(keys_b)
    eng = [bytes([i]) * 16 for i in range(100)]
    assert set(a.wrap_engine_hashes(eng)).isdisjoint(b.wrap_engine_hashes(eng))
    assert set(a.trace_keys(range(1000))).isdisjoint(b.trace_keys(range(1000)))


def test_namespace_fields_all_matter() -> None:
    base = make_namespace("m", block_size=16, dtype="f16", layout="L", cache_salt="s")
    variants = [
        make_namespace("m2", block_size=16, dtype="f16", layout="L", cache_salt="s"),
        make_namespace("m", block_size=32, dtype="f16", layout="L", cache_salt="s"),
        make_namespace("m", block_size=16, dtype="bf16", layout="L", cache_salt="s"),
        make_namespace("m", block_size=16, dtype="f16", layout="L2", cache_salt="s"),
        make_namespace("m", block_size=16, dtype="f16", layout="L", cache_salt="s2"),
    ]
    roots = {base.root} | {v.root for v in variants}
    assert len(roots) == 6
    # The salt changes the root but not the layout fingerprint.
    assert variants[-1].fingerprint == base.fingerprint


@settings(max_examples=100, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=70),
    extra=st.binary(max_size=8),
    block_size=st.integers(1, 9),
)
def test_key_tokens_is_the_chain_of_block_keys(tokens: list[int], extra: bytes, block_size: int) -> None:
    ns = make_namespace("m", block_size=block_size, cache_salt="x")
    keys = ns.key_tokens(tokens, extra=extra, partial=True)
    prev = ns.root
    expect = []
    for i in range(0, len(tokens), block_size):
        prev = chain_key(prev, tokens[i : i + block_size], extra)
        expect.append(prev)
    assert keys == expect
    assert all(len(k) == KEY_BYTES for k in keys)
    full = ns.key_tokens(tokens, extra=extra)
    assert full == keys[: len(tokens) // block_size]
    # Continuing a chain from a parent equals keying the whole sequence.
    cut = (len(tokens) // block_size // 2) * block_size
    if cut:
        head = ns.key_tokens(tokens[:cut], extra=extra)
        tail = ns.key_tokens(tokens[cut:], extra=extra, parent=head[-1], partial=True)
        assert head + tail == keys


def test_prefix_sharing_and_divergence() -> None:
    ns = _ns()
    a = ns.key_tokens([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    b = ns.key_tokens([1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12])
    assert a[:2] == b[:2] and a[2] != b[2]
    # The same block content at another position is a different key (it names the whole prefix).
    c = ns.key_tokens([5, 6, 7, 8])
    assert c[0] != a[1]
    # Extra data (LoRA id, image hash) separates otherwise equal blocks.
    assert ns.key_tokens([1, 2, 3, 4], extra=b"x") != ns.key_tokens([1, 2, 3, 4])


def test_token_dtype_does_not_matter() -> None:
    ns = _ns()
    toks = [3, 1, 4, 1, 5, 9, 2, 6]
    ref = ns.key_tokens(toks)
    for dt in (np.int32, np.int64, np.uint16, np.uint32, ">i8"):
        assert ns.key_tokens(np.asarray(toks, dtype=dt)) == ref


@pytest.mark.parametrize("bad", [[1, -2, 3, 4], [2**32, 0, 0, 0], [1.5, 2.0, 3.0, 4.0]])
def test_bad_token_ids_raise(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="token ids"):
        _ns().key_tokens(bad)


def test_bad_block_size_raises() -> None:
    with pytest.raises(ValueError, match="block_size"):
        make_namespace("m", block_size=0)


def test_from_config_uses_model_salt_and_block_bytes() -> None:
    from kvtier.config import load_config

    c1 = load_config({"model": "m", "cache_salt": "a"})
    c2 = load_config({"model": "m", "cache_salt": "b"})
    n1 = KeyNamespace.from_config(c1, block_size=16)
    n2 = KeyNamespace.from_config(c2, block_size=16)
    assert n1.fingerprint == n2.fingerprint and n1.root != n2.root
    assert KeyNamespace.from_config(c1, block_size=16) == n1


@settings(max_examples=200)
@given(st.lists(st.binary(max_size=80), max_size=20), st.text(max_size=8))
def test_wrap_engine_hashes_is_wrap_engine_hash_per_hash(hashes: list[bytes], salt: str) -> None:
    # The batch form hoists lookups for speed; it must hash exactly what the single form hashes.
    ns = _ns(salt)
    assert ns.wrap_engine_hashes(hashes) == [ns.wrap_engine_hash(h) for h in hashes]
    assert ns.wrap_engine_hashes(iter(hashes)) == ns.wrap_engine_hashes(hashes)
