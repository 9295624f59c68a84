"""The ``external`` primary backing: the engine keeps the slot index over memory someone else owns.

This is what the vLLM spec (``kvtier.integrations.vllm.spec``) relies on: vLLM's workers own the
host buffer (a shared mapping they copy GPU blocks into) and kvtier runs its primary tier and its
secondary tiers on those same bytes. Real numpy memory and kvtier's real ``example`` tier here.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.engine import Engine
from kvtier.errors import ConfigError

ROW = 4096


def cfg(slots: int = 4, **more: object) -> dict[str, object]:
    return {"cpu_bytes_to_use": slots * ROW, "block_bytes": ROW, **more}


def test_engine_works_on_caller_memory_zero_copy_and_leaves_it_alone() -> None:
    memory = np.zeros((4, ROW), dtype=np.uint8)
    engine = Engine(cfg(secondary_tiers=[{"type": "example"}]), primary_buffer=memory)
    h = engine.prepare_store([b"a", b"b"])
    # The caller (an inference engine's copy) writes straight into its own memory at the slot ids.
    memory[h.slots[0]] = 7
    memory[h.slots[1]] = 9
    engine.complete_store(h)
    out = np.zeros((2, ROW), dtype=np.uint8)
    assert engine.load_blocks([b"a", b"b"], out) == 2
    assert (out[0] == 7).all() and (out[1] == 9).all()
    engine.drain()  # the write-through job read the caller's memory
    stats = engine.stats()
    assert stats["primary"]["backing"] == "external"
    assert stats["tiers"]["example0"]["stores"] == 2
    engine.close()
    memory[:] = 1  # still the caller's, still mapped after close
    assert int(memory.sum()) == 4 * ROW


@pytest.mark.parametrize(
    ("memory", "words"),
    [
        (np.zeros((3, ROW), dtype=np.uint8), "holds 12288 bytes but 4 slots"),
        (np.zeros((4, 2 * ROW), dtype=np.uint8)[:, :ROW], "C-contiguous"),
        (bytes(4 * ROW), "writable"),
        (object(), "expected a buffer"),
    ],
)
def test_unusable_memory_is_a_one_line_config_error_naming_primary_buffer(memory: object, words: str) -> None:
    with pytest.raises(ConfigError, match="primary_buffer") as err:
        Engine(cfg(), primary_buffer=memory)
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_signed_2d_views_are_used_as_bytes() -> None:
    # vLLM hands out its region as a 2-D int8 memoryview (a torch int8 tensor's bytes).
    memory = np.zeros((4, ROW), dtype=np.int8)
    with Engine(cfg(), primary_buffer=memoryview(memory)) as engine:
        h = engine.prepare_store([b"k"])
        engine.primary.rows[h.slots[0]] = 200
        engine.complete_store(h)
        assert int(memory[h.slots[0], 0]) == 200 - 256
