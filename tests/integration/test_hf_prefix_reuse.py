"""kvtier.integrations.transformers with a real (tiny, randomly initialised) Llama model.

Everything is real: transformers' LlamaForCausalLM and DynamicCache, kvtier's engine, the fs tier on
real files, a second real process. The one injected fault is :class:`BrokenTier` (a tier whose I/O
raises), because a disk that fails on demand cannot be had otherwise.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def _need(name: str) -> ModuleType:
    """The module; skipped when missing, except under CI=true where a missing extra must fail."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(name)
    return pytest.importorskip(name)


torch = _need("torch")
_need("transformers")

import hf_helpers as h  # noqa: E402  (tests/integration is on pytest's pythonpath; needs torch)

from kvtier import (  # noqa: E402
    BlockKey,
    Engine,
    JobResult,
    LookupResult,
    MisuseError,
    SecondaryTier,
    TierContext,
    TransferJob,
)
from kvtier.integrations.transformers import PrefixCache, block_bytes_for  # noqa: E402
from kvtier.tiers.fs.segment_index import decode_records  # noqa: E402

BS = h.BLOCK
TOL = 1e-5
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model() -> Any:
    return h.tiny_model()


def _close_logits(got: Any, want: Any) -> float:
    assert got.shape == want.shape
    return float((got - want).abs().max())


def _mixed(ids: Any, keep: int, seed: int, extra: int) -> Any:
    """The first ``keep`` tokens of ``ids``, then ``extra`` tokens that differ from what followed."""
    tail = h.prompt(extra, seed=seed)
    if keep < ids.shape[1] and extra:
        tail[0, 0] = (ids[0, keep] + 1) % h.VOCAB  # the sequences really diverge at ``keep``
    return torch.cat([ids[:, :keep], tail], dim=1)


# -- correctness --------------------------------------------------------------------------------
def test_restored_prefix_gives_the_logits_of_a_full_recompute(model: Any) -> None:
    first = h.prompt(100)
    with PrefixCache.create(model, h.ram_config(), block_size=BS) as pc:
        assert pc.forward(first).reused_tokens == 0
        for keep, expect in ((90, 80), (40, 32), (100, 96), (15, 0)):
            ids = _mixed(first, keep, seed=keep, extra=40)
            r = pc.forward(ids)
            assert r.reused_tokens == expect
            assert r.cache.get_seq_length() == ids.shape[1]
            assert _close_logits(r.output.logits, h.full_logits(model, ids)[:, expect:]) <= TOL
        assert pc.stats()["errors"] == 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first_len=st.integers(1, 80),
    keep=st.integers(0, 80),
    extra=st.integers(0, 30),
    block_size=st.sampled_from([1, 4, 16]),
)
def test_property_reuse_is_the_common_whole_blocks_and_logits_match(
    model: Any, first_len: int, keep: int, extra: int, block_size: int
) -> None:
    first = h.prompt(first_len, seed=7)
    keep = min(keep, first_len)
    ids = _mixed(first, keep, seed=8, extra=extra)
    if ids.shape[1] == 0:
        ids = h.prompt(1, seed=9)
        keep = 0
    with PrefixCache.create(model, h.ram_config(), block_size=block_size) as pc:
        pc.forward(first)
        r = pc.forward(ids)
    common = keep if keep < first_len else first_len
    blocks = min(common // block_size, first_len // block_size, (ids.shape[1] - 1) // block_size)
    assert r.reused_tokens == blocks * block_size
    assert _close_logits(r.output.logits, h.full_logits(model, ids)[:, r.reused_tokens :]) <= TOL


def test_greedy_generate_gives_the_same_tokens_and_reuses_the_answer(model: Any) -> None:
    ids = h.prompt(70)
    prev_len = 0
    with PrefixCache.create(model, h.ram_config(), block_size=BS) as pc:
        for turn in range(3):
            want = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False
            )
            before = pc.stats()["reused_tokens"]
            got = pc.generate(ids, max_new_tokens=12, do_sample=False)
            assert torch.equal(got, want)
            reused = pc.stats()["reused_tokens"] - before
            # Turn 0 is cold; later turns reuse every whole block of the previous turn's prompt and
            # answer (the cache held all but the last generated token).
            assert reused == (0 if turn == 0 else (prev_len - 1) // BS * BS)
            prev_len = got.shape[1]
            ids = torch.cat([got, h.prompt(9, seed=turn)], dim=1)


def test_partial_last_block_is_never_stored(model: Any) -> None:
    ids = h.prompt(3 * BS + 5)
    with PrefixCache.create(model, h.ram_config(), block_size=BS) as pc:
        pc.forward(ids)
        assert pc.stats()["stored_blocks"] == 3
        keys = pc.namespace.key_tokens(ids[0].numpy(), partial=True)
        assert len(keys) == 4
        assert pc.engine.lookup(keys).results == [LookupResult.HIT] * 3 + [LookupResult.MISS]
        # The same prompt again: 3 whole blocks restored, the 5-token tail recomputed.
        r = pc.forward(ids)
        assert r.reused_tokens == 3 * BS
        assert _close_logits(r.output.logits, h.full_logits(model, ids)[:, 3 * BS :]) <= TOL
        # A prompt of exactly 3 blocks reuses 2: the last token must be computed for its logits.
        assert pc.forward(ids[:, : 3 * BS]).reused_tokens == 2 * BS


# -- across processes, and when the tier fails ------------------------------------------------
N_STORED = 96


@pytest.fixture(scope="module")
def written_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An fs tier tree written by another process: the blocks of ``prompt(96)``."""
    root = tmp_path_factory.mktemp("written")
    proc = subprocess.run(h.spawn_args("store", root, N_STORED), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["stored_blocks"] == N_STORED // BS and out["reused_tokens"] == 0
    return root


@pytest.fixture
def tree(written_tree: Path, tmp_path: Path) -> Path:
    """A private copy of the written tree (tests change it)."""
    shutil.copytree(written_tree, tmp_path / "fs")
    return tmp_path / "fs"


def test_a_second_process_reuses_the_first_processes_blocks(model: Any, tree: Path) -> None:
    ids = torch.cat([h.prompt(N_STORED), h.prompt(20, seed=5)], dim=1)
    with PrefixCache.create(model, h.fs_config(str(tree)), block_size=BS) as pc:
        r = pc.forward(ids)
        promoted = pc.engine.stats()["promotions"]
    assert r.reused_tokens == N_STORED  # this process computed none of them: they came from the fs tier
    assert promoted == N_STORED // BS
    assert _close_logits(r.output.logits, h.full_logits(model, ids)[:, N_STORED:]) <= TOL


def _payload_end(root: Path, key: BlockKey) -> tuple[Path, int]:
    """The file holding ``key``'s block and the offset just past its payload: its own block file,
    or its record in a small-block segment (found through the segment index)."""
    files = [p for p in root.rglob(key.hex()) if p.is_file()]
    if files:
        return files[0], files[0].stat().st_size
    for idx in root.rglob("*.idx"):
        for rec in decode_records(idx.read_bytes())[0]:
            if rec.key == bytes(key):
                return idx.with_suffix(".dat"), rec.offset + rec.length
    raise AssertionError(f"no block of {key.hex()} under {root}")


def test_a_corrupted_tier_file_means_recompute_with_identical_output(model: Any, tree: Path) -> None:
    ids = h.prompt(N_STORED)
    with PrefixCache.create(model, h.fs_config(str(tree)), block_size=BS) as pc:
        keys = pc.namespace.key_tokens(ids[0].numpy())
        victim, end = _payload_end(tree, keys[2])
        data = bytearray(victim.read_bytes())
        data[end - 100] ^= 0xFF  # one payload byte: only the checksum can tell
        victim.write_bytes(bytes(data))
        r = pc.forward(ids)
        fs_stats = pc.engine.stats()["tiers"]["fs0"]
        assert pc.stats()["errors"] == 0  # a corrupt block is a miss, not an error
    assert r.reused_tokens == 2 * BS  # blocks 0 and 1 only: block 2 failed, the chain stops there
    assert fs_stats["corrupt"] >= 1
    assert _close_logits(r.output.logits, h.full_logits(model, ids)[:, 2 * BS :]) <= TOL


class BrokenTier(SecondaryTier):
    """Says it holds every block; every store and load raises, as a failing disk or network would."""

    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        return LookupResult.HIT

    def submit_store(self, job: TransferJob) -> None:
        raise OSError("injected: device gone")

    def submit_load(self, job: TransferJob) -> None:
        raise OSError("injected: device gone")

    def get_finished_jobs(self) -> list[JobResult]:
        return []

    def drain(self) -> None:
        return None


def test_a_tier_failure_means_recompute_never_an_error(model: Any) -> None:
    bb = block_bytes_for(model, BS)
    cfg = {**h.ram_config(), "block_bytes": bb}
    engine = Engine(
        cfg, tiers=[lambda view: BrokenTier(primary_kv_view=view, context=TierContext("broken", bb))]
    )
    ids = h.prompt(80)
    want = h.full_logits(model, ids)
    try:
        pc = PrefixCache(model, engine, block_size=BS, wait_s=0.2)
        r = pc.forward(ids)  # cold: every lookup says HIT in the broken tier, every load fails
        assert r.reused_tokens == 0
        assert _close_logits(r.output.logits, want) <= TOL
        assert engine.stats()["tier_errors"] > 0
    finally:
        engine.close()
    # A closed engine is the harshest failure: every kvtier call raises. Still the model's output.
    r = pc.forward(ids)
    assert r.reused_tokens == 0 and pc.stats()["errors"] >= 1
    assert _close_logits(r.output.logits, want) <= TOL
    assert torch.equal(pc.generate(ids, max_new_tokens=4, do_sample=False)[:, :80], ids)


@pytest.mark.parametrize(
    ("variant", "kwargs"),
    [
        ("other weights", {"seed": 1}),
        ("other dtype", {"dtype": torch.float64, "block_size": 8}),
        ("other layout (kv heads)", {"num_key_value_heads": 4, "block_size": 8}),
        ("other layout (layers)", {"num_hidden_layers": 8, "block_size": 8}),
        ("other label", {"model_id": "tokenizer-b"}),
    ],
)
def test_another_model_dtype_or_layout_never_reuses(model: Any, variant: str, kwargs: dict[str, Any]) -> None:
    opts = dict(kwargs)
    block_size = opts.pop("block_size", BS)
    model_id = opts.pop("model_id", "")
    other = h.tiny_model(**opts) if opts else model
    bb = block_bytes_for(model, BS)
    assert block_bytes_for(other, block_size) == bb  # same row size: only the namespace tells them apart
    ids = h.prompt(96)
    with Engine({**h.ram_config(), "block_bytes": bb}) as engine:
        base = PrefixCache(model, engine, block_size=BS)
        base.forward(ids)
        pc = PrefixCache(other, engine, block_size=block_size, model_id=model_id)
        assert pc.namespace.root != base.namespace.root
        r = pc.forward(ids)
        assert r.reused_tokens == 0, variant
        assert _close_logits(r.output.logits, h.full_logits(other, ids).to(r.output.logits.dtype)) <= TOL
        # Positive control: the original model on the same engine does reuse.
        assert PrefixCache(model, engine, block_size=BS).forward(ids).reused_tokens == 96 - BS


# -- misuse gives one line with the fix ---------------------------------------------------------
def test_misuse_is_refused_with_the_fix(model: Any) -> None:
    with (
        Engine({**h.ram_config(), "block_bytes": 4096}) as engine,
        pytest.raises(MisuseError, match="=16384"),
    ):
        PrefixCache(model, engine, block_size=BS)
    with PrefixCache.create(model, h.ram_config(), block_size=BS) as pc:
        with pytest.raises(MisuseError, match="once per row"):
            pc.forward(torch.cat([h.prompt(20), h.prompt(20)]))
        with pytest.raises(MisuseError, match="attention_mask"):
            pc.forward(h.prompt(20), attention_mask=torch.ones(1, 20))
        with pytest.raises(MisuseError, match="empty"):
            pc.forward([])
        with pytest.raises(MisuseError, match="padding"):
            pc.generate(h.prompt(4), attention_mask=torch.tensor([[0, 1, 1, 1]]))


def test_sliding_window_models_are_refused() -> None:
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(
        vocab_size=h.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=32,
    )  # fmt: skip
    other = MistralForCausalLM(cfg).eval()
    with pytest.raises(MisuseError, match="DynamicSlidingWindowLayer"):
        PrefixCache.create(other, h.ram_config(), block_size=BS)


# -- the example and the docs ---------------------------------------------------------------------
def test_example_runs_and_reports_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("hf_prefix_reuse", ROOT / "examples" / "hf_prefix_reuse.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    threads = torch.get_num_threads()
    try:
        rc = example.main([
            "--json", "--prefix-tokens", "64", "--turns", "3", "--user-tokens", "8", "--answer-tokens", "4",
            "--layers", "2", "--hidden", "32", "--heads", "2", "--kv-heads", "1", "--vocab", "128",
        ])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["same_next_token"] is True
    assert out["ratios"]["ttft"] == pytest.approx(out["ttft_ms"]["without"] / out["ttft_ms"]["with"])
    assert out["turns"][0]["reused_tokens"] == 0
    assert all(t["reused_tokens"] >= 64 for t in out["turns"][1:])
    assert 0.5 < out["hit_ratio"] <= 1.0


def test_docs_python_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = ROOT / "docs" / "transformers.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, str(doc), "exec"), {})
