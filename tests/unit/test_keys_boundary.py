"""Keys are checked at the API call (issue 17): a ``str``/``None``/``int`` key, an empty key or one
over ``MAX_KEY_BYTES`` is a :class:`MisuseError` there, never a worker traceback or a stuck slot."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier import Engine
from kvtier.engine.types import StoreHandle
from kvtier.errors import MisuseError
from kvtier.keys import MAX_KEY_BYTES, BlockKey, check_keys
from kvtier.primary import SlotState

BLOCK = 4096


def _engine() -> Engine:
    return Engine({"block_bytes": BLOCK, "cpu_bytes_to_use": 8 * BLOCK})


@pytest.mark.parametrize("bad", ["text", None, 7, b"", b"x" * (MAX_KEY_BYTES + 1), bytearray(b"ab")])
def test_a_bad_key_is_a_misuse_error_at_prepare_store_and_leaves_no_slot_writing(bad: object) -> None:
    with _engine() as eng:
        with pytest.raises(MisuseError, match=r"prepare_store: key #1"):
            eng.prepare_store([BlockKey(b"ok"), bad])  # type: ignore[list-item]
        with pytest.raises(MisuseError, match=r"key #1"):
            eng.store_blocks([BlockKey(b"ok"), bad], bytearray(2 * BLOCK))  # type: ignore[list-item]
        # Nothing was reserved: the engine still stores all 8 slots.
        keys = [BlockKey(bytes([i + 1])) for i in range(8)]
        h = eng.prepare_store(keys)
        assert len(h.slot_ids) == 8
        eng.complete_store(h)


@given(
    st.lists(
        st.one_of(st.binary(min_size=0, max_size=MAX_KEY_BYTES + 2), st.text(), st.none(), st.integers())
    )
)
def test_check_keys_accepts_exactly_nonempty_bytes_within_the_limit(keys: list[object]) -> None:
    ok = all(type(k) is bytes and 0 < len(k) <= MAX_KEY_BYTES for k in keys)
    if ok:
        check_keys("t", keys)
    else:
        with pytest.raises(MisuseError):
            check_keys("t", keys)


_BAD = ["text", None, 7, b"", b"x" * (MAX_KEY_BYTES + 1)]


@pytest.mark.parametrize("bad", _BAD, ids=["str", "None", "int", "empty", "too_long"])
@pytest.mark.parametrize("method", ["lookup", "access", "prepare_load", "load_blocks"])
def test_every_public_method_taking_keys_refuses_a_bad_key_at_the_call(method: str, bad: object) -> None:
    """Before issue 17's follow-up only ``prepare_store`` checked: ``lookup([None])`` reached the
    primary index (and an fs tier's worker), ``lookup([b"x" * 70000])`` was looked up as is."""
    with _engine() as eng:
        eng.store_blocks([BlockKey(b"ok")], np.zeros((1, BLOCK), dtype=np.uint8))
        keys = [BlockKey(b"ok"), bad]
        calls = {
            "lookup": lambda: eng.lookup(keys),  # type: ignore[arg-type]
            "access": lambda: eng.access(keys),  # type: ignore[arg-type]
            "prepare_load": lambda: eng.prepare_load(keys),  # type: ignore[arg-type]
            "load_blocks": lambda: eng.load_blocks(keys, np.zeros((2, BLOCK), dtype=np.uint8)),  # type: ignore[arg-type]
        }
        with pytest.raises(MisuseError, match=r"key #1"):
            calls[method]()
        assert eng.stats()["lookups"] == 0  # refused before any work was done


def _no_slot_writing(eng: Engine) -> bool:
    return not any(int(s) == int(SlotState.WRITING) for s in eng.primary.states)


def test_a_forged_store_handle_is_refused_and_the_real_one_still_completes() -> None:
    """A copy carrying a live handle's token but other slots used to complete in its place, leaving
    the real slots WRITING for ever."""
    with _engine() as eng:
        real = eng.prepare_store([BlockKey(b"a"), BlockKey(b"b")])
        forged = StoreHandle([BlockKey(b"z")], [7], None, None, None, None, real.token)
        with pytest.raises(MisuseError, match="complete_store"):
            eng.complete_store(forged)
        clone = copy.copy(real)
        with pytest.raises(MisuseError, match="complete_store"):
            eng.complete_store(clone)
        eng.complete_store(real)
        assert _no_slot_writing(eng)
        assert eng.lookup([BlockKey(b"a"), BlockKey(b"b")]).num_hits == 2
        with pytest.raises(MisuseError):
            eng.complete_store(real)  # twice


def test_a_handle_of_another_engine_or_of_the_wrong_kind_is_refused() -> None:
    with _engine() as a, _engine() as b:
        ha = a.prepare_store([BlockKey(b"k")])
        hb = b.prepare_store([BlockKey(b"k")])
        assert ha.token == hb.token  # per-engine counters: only the object identity tells them apart
        with pytest.raises(MisuseError):
            a.complete_store(hb)
        b.complete_store(hb)
        a.complete_store(ha)
        load = a.prepare_load([BlockKey(b"k")])
        with pytest.raises(MisuseError):
            a.complete_store(load)  # type: ignore[arg-type]
        with pytest.raises(MisuseError):
            b.complete_load(load)
        a.complete_load(load)
        assert _no_slot_writing(a) and _no_slot_writing(b)
        assert not any(a.primary.pins) and not any(b.primary.pins)
