"""Keys are checked at the API call (issue 17): a ``str``/``None``/``int`` key, an empty key or one
over ``MAX_KEY_BYTES`` is a :class:`MisuseError` there, never a worker traceback or a stuck slot."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier import Engine
from kvtier.errors import MisuseError
from kvtier.keys import MAX_KEY_BYTES, BlockKey, check_keys

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
