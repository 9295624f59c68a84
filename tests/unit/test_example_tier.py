"""The example tier beyond the shared contract: capacity, LRU order, misuse, a model-based property."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import ConfigError, MisuseError
from kvtier.jobs import TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.tiers.base import TierContext
from kvtier.tiers.example import ExampleTier

SLOTS, ROW, BLOCK = 6, 4096, 1000


def make(capacity: int | None = None) -> tuple[ExampleTier, np.ndarray]:
    buf = np.zeros((SLOTS, ROW), dtype=np.uint8)
    tier = ExampleTier(
        primary_kv_view=memoryview(buf), context=TierContext("ex", BLOCK), capacity_blocks=capacity
    )
    return tier, buf


def job(job_id: int, keys: list[bytes], slots: list[int], promotion: bool = False) -> TransferJob:
    return TransferJob(job_id, [BlockKey(k) for k in keys], np.array(slots, dtype=np.int32), promotion)


def test_capacity_drops_least_recently_used() -> None:
    tier, buf = make(capacity=2)
    buf[0, :BLOCK] = 1
    buf[1, :BLOCK] = 2
    buf[2, :BLOCK] = 3
    tier.submit_store(job(1, [b"a", b"b"], [0, 1]))
    tier.submit_load(job(2, [b"a"], [3], True))  # "a" becomes most recent
    tier.submit_store(job(3, [b"c"], [2]))  # evicts "b"
    assert [tier.lookup(BlockKey(k)) for k in (b"a", b"b", b"c")] == [
        LookupResult.HIT,
        LookupResult.MISS,
        LookupResult.HIT,
    ]
    assert tier.stats.evictions == 1
    assert len(tier) == 2
    assert [r.job_id for r in tier.get_finished_jobs()] == [1, 2, 3]


def test_touch_refreshes_recency() -> None:
    tier, _ = make(capacity=2)
    tier.submit_store(job(1, [b"a", b"b"], [0, 1]))
    tier.touch([BlockKey(b"a"), BlockKey(b"zz")])
    tier.submit_store(job(2, [b"c"], [2]))
    assert BlockKey(b"a") in tier and BlockKey(b"b") not in tier


def test_bad_capacity_is_config_error() -> None:
    for bad in (0, -1, True, 1.5, "3"):
        with pytest.raises(ConfigError, match="capacity_blocks"):
            make(capacity=bad)  # type: ignore[arg-type]


def test_misuse_is_raised_not_reported() -> None:
    tier, _ = make()
    with pytest.raises(MisuseError, match="slot 6"):
        tier.submit_store(job(1, [b"a"], [SLOTS]))
    tier.submit_store(job(2, [b"a"], [0]))
    with pytest.raises(MisuseError, match="already in flight"):
        tier.submit_load(job(2, [b"a"], [1]))
    assert [r.job_id for r in tier.get_finished_jobs()] == [2]
    tier.submit_load(job(2, [b"a"], [1]))  # reported ids may be reused
    tier.shutdown()
    tier.shutdown()
    # Shutdown is not misuse: the engine may still flush a job while it stops. A late job is a
    # failed job (AsyncTier's rule for every tier), never an exception.
    tier.submit_store(job(3, [b"b"], [0]))
    late = tier.get_finished_jobs()[-1]
    assert late.job_id == 3 and not late.success and late.error == "tier is shut down"


def test_store_copies_bytes_so_slot_reuse_is_safe() -> None:
    tier, buf = make()
    buf[0, :BLOCK] = np.arange(BLOCK) % 251
    tier.submit_store(job(1, [b"k"], [0]))
    buf[0, :] = 0  # the engine reuses the slot after the job is reported
    tier.submit_load(job(2, [b"k"], [4], True))
    assert np.array_equal(buf[4, :BLOCK], np.arange(BLOCK) % 251)
    assert not buf[4, BLOCK:].any()  # only block_bytes are written, never the row padding


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["store", "load"]),
            st.lists(st.integers(0, 7), min_size=1, max_size=SLOTS, unique=True),
            st.integers(0, 255),
        ),
        max_size=30,
    ),
    st.one_of(st.none(), st.integers(1, 5)),
)
def test_matches_a_dictionary_model(ops: list[tuple[str, list[int], int]], capacity: int | None) -> None:
    """Byte content and hit/miss answers agree with a plain dict model (with LRU capacity)."""
    tier, buf = make(capacity)
    model: dict[bytes, bytes] = {}
    order: list[bytes] = []  # LRU order of the model, oldest first
    for job_id, (op, ids, fill) in enumerate(ops):
        keys = [f"k{i}".encode() for i in ids]
        slots = list(range(len(keys)))
        if op == "store":
            for s in slots:
                buf[s, :BLOCK] = (fill + s) % 256
            tier.submit_store(job(job_id, keys, slots))
            for s, k in zip(slots, keys, strict=True):
                if k in model:
                    continue
                if capacity is not None and len(model) >= capacity:
                    del model[order.pop(0)]
                model[k] = bytes(buf[s, :BLOCK])
                order.append(k)
        else:
            buf[: len(slots)] = 0
            tier.submit_load(job(job_id, keys, slots, True))
            (result,) = tier.get_finished_jobs()
            loaded = set(result.transferred(keys))
            assert loaded == {k for k in keys if k in model}
            assert result.success == (loaded == set(keys))
            for s, k in zip(slots, keys, strict=True):
                if k in model:
                    assert bytes(buf[s, :BLOCK]) == model[k]
                    order.remove(k)
                    order.append(k)
                else:
                    assert not buf[s].any()
        for i in range(8):
            key = f"k{i}".encode()
            expected = LookupResult.HIT if key in model else LookupResult.MISS
            assert tier.lookup(BlockKey(key)) is expected
        tier.get_finished_jobs()
    assert not tier.has_pending_work()
