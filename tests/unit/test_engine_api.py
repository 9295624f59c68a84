"""Engine facade: lookup/store/load, write policies, admission, tier failures, events, lifecycle.

Real parts throughout: the LRU policy, the ``example`` tier (really copies bytes) and a heap or
metadata-only primary buffer. No GPU is involved (the engine's KV movers are tested with numpy and CPU
torch tensors in ``test_transfer_movers.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvtier.engine import Engine, EngineEvent, LookupReport, RequestContext
from kvtier.errors import MisuseError
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.policies.lru import LRUPolicy
from kvtier.tiers.base import SecondaryTier, TierContext
from kvtier.tiers.example import ExampleTier

HIT, MISS, PENDING, RETRY = (
    LookupResult.HIT,
    LookupResult.MISS,
    LookupResult.HIT_PENDING,
    LookupResult.RETRY,
)
BLOCK = 5000  # not a multiple of 4 KiB: rows are padded to 8192


def K(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(8, "big") * 2)


def payload(keys: list[BlockKey]) -> np.ndarray:
    """Bytes that depend on the key, so a block served under the wrong key is caught."""
    out = np.empty((len(keys), BLOCK), dtype=np.uint8)
    for i, k in enumerate(keys):
        out[i] = np.random.default_rng(int.from_bytes(k[:8], "big")).integers(0, 256, BLOCK, dtype=np.uint8)
    return out


def cfg(slots: int, **extra: Any) -> dict[str, Any]:
    return {"cpu_bytes_to_use": slots * 8192, "block_bytes": BLOCK, **extra}


def example_engine(slots: int = 4, **extra: Any) -> Engine:
    return Engine(cfg(slots, secondary_tiers=[{"type": "example"}], **extra))


def test_built_from_config_through_the_spec() -> None:
    with example_engine(4) as e:
        assert e.num_slots == 4 and e.row_stride == 8192 and e.block_bytes == BLOCK
        assert isinstance(e.policy, LRUPolicy)
        assert [type(t).__name__ for t in e.tiers] == ["ExampleTier"]
        assert e.tiers[0].name == "example0"
        assert e.primary_kv_view.shape == (4, 8192)


def test_lookup_store_load_roundtrip_in_primary() -> None:
    with Engine(cfg(8)) as e:
        keys = [K(i) for i in range(5)]
        data = payload(keys)
        assert e.lookup(keys).results == [MISS] * 5
        assert e.store_blocks(keys, data) == 5
        rep = e.lookup(keys + [K(99)])
        assert rep.num_hits == 5
        assert rep.results == [HIT] * 5 + [MISS]
        assert rep.codes == bytes([1] * 5 + [0])
        out = np.zeros_like(data)
        assert e.load_blocks(keys, out) == 5
        assert np.array_equal(out, data)
        # Storing again is a no-op (resident keys are skipped).
        assert e.store_blocks(keys, data) == 0


def test_num_hits_counts_only_the_leading_run_but_every_key_is_evaluated() -> None:
    with Engine(cfg(8, primary_backing="none")) as e:
        e.complete_store(e.prepare_store([K(0), K(2)]))
        rep = e.lookup([K(0), K(1), K(2)])
        assert rep.num_hits == 1
        assert rep.results == [HIT, MISS, HIT]
        assert rep.hits == 2


def test_writing_blocks_are_pending_not_readable() -> None:
    with Engine(cfg(4)) as e:
        h = e.prepare_store([K(1)])
        assert e.lookup([K(1)]).results == [PENDING]
        with pytest.raises(MisuseError):
            e.prepare_load([K(1)])
        assert e.load_blocks([K(1)], np.zeros((1, BLOCK), np.uint8)) == 0
        e.complete_store(h)
        assert e.lookup([K(1)]).results == [HIT]
        with pytest.raises(MisuseError):
            e.complete_store(h)  # twice


def test_failed_store_frees_the_slot() -> None:
    with Engine(cfg(2)) as e:
        h = e.prepare_store([K(1), K(2)])
        e.complete_store(h, success=False)
        assert e.lookup([K(1), K(2)]).results == [MISS, MISS]
        assert e.stats()["primary"]["free"] == 2


def test_pinned_blocks_are_never_evicted_and_stores_are_dropped_instead() -> None:
    with Engine(cfg(2, primary_backing="none")) as e:
        e.complete_store(e.prepare_store([K(1), K(2)]))
        lh = e.prepare_load([K(1), K(2)])
        h = e.prepare_store([K(3)])
        assert h.keys == []
        assert e.stats()["dropped_stores"] == 1
        e.complete_store(h)
        e.complete_load(lh)
        h = e.prepare_store([K(3)])
        assert h.keys == [K(3)]
        e.complete_store(h)
        # LRU victim was K(1) (least recently used)
        assert e.lookup([K(1), K(2), K(3)]).results == [MISS, HIT, HIT]


def test_evicted_to_example_tier_then_promoted_back_byte_exact() -> None:
    with example_engine(4) as e:
        keys = [K(i) for i in range(12)]
        data = payload(keys)
        for i in range(0, 12, 4):
            assert e.store_blocks(keys[i : i + 4], data[i : i + 4]) == 4
            e.poll()
        # Only the last 4 are in the primary tier now; the rest come back from the example tier.
        rep = e.lookup(keys[:4])
        assert rep.results == [PENDING] * 4 and rep.pending == 4 and rep.num_hits == 0
        assert e.poll()  # the promotion finished: events
        rep = e.lookup(keys[:4])
        assert rep.results == [HIT] * 4
        out = np.zeros((4, BLOCK), np.uint8)
        assert e.load_blocks(keys[:4], out) == 4
        assert np.array_equal(out, data[:4])
        kinds = {ev.kind for ev in e.events()}
        assert {"stored", "evicted", "promoted"} <= kinds
        st = e.stats()
        assert st["promotions"] == 4 and st["tiers"]["example0"]["loads"] == 4


def test_one_promotion_job_per_tier_and_lookup() -> None:
    with example_engine(8) as e:
        keys = [K(i) for i in range(6)]
        e.store_blocks(keys, payload(keys))
        e.drain()
        e.reset()
        before = e.stats()["jobs_submitted"]
        assert e.lookup(keys).results == [PENDING] * 6
        assert e.stats()["jobs_submitted"] == before + 1


class ScriptedTier(SecondaryTier):
    """A tier whose answers and failures the test scripts; jobs finish when the test says so."""

    def __init__(self, *, primary_kv_view: memoryview, context: TierContext) -> None:
        super().__init__(primary_kv_view=primary_kv_view, context=context)
        self.held: set[BlockKey] = set()
        self.answer: dict[BlockKey, LookupResult] = {}
        self.raise_on: set[str] = set()
        self.open: dict[int, TransferJob] = {}
        self.done: list[JobResult] = []
        self.fail_loads: set[BlockKey] = set()

    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        if "lookup" in self.raise_on:
            raise OSError("backend down")
        return self.answer.get(key, HIT if key in self.held else MISS)

    def submit_store(self, job: TransferJob) -> None:
        if "store" in self.raise_on:
            raise OSError("disk full")
        self.open[job.job_id] = job

    def submit_load(self, job: TransferJob) -> None:
        if "load" in self.raise_on:
            raise OSError("read error")
        self.open[job.job_id] = job

    def finish_all(self) -> None:
        for jid, job in list(self.open.items()):
            if job.is_promotion:
                ok = frozenset(k for k in job.keys if k not in self.fail_loads)
                self.done.append(JobResult(jid, len(ok) == len(job.keys), ok))
            else:
                self.held.update(job.keys)
                self.done.append(JobResult(jid, True))
        self.open.clear()

    def get_finished_jobs(self) -> list[JobResult]:
        if "poll" in self.raise_on:
            raise OSError("poll failed")
        out, self.done = self.done, []
        return out

    def drain(self) -> None:
        self.finish_all()

    def has_pending_work(self) -> bool:
        return bool(self.open or self.done)


def scripted(slots: int = 4, **extra: Any) -> tuple[Engine, ScriptedTier]:
    e = Engine(
        cfg(slots, **extra),
        policy=LRUPolicy(slots),
        tiers=[lambda view: ScriptedTier(primary_kv_view=view, context=TierContext("scripted", BLOCK))],
    )
    tier = e.tiers[0]
    assert isinstance(tier, ScriptedTier)
    return e, tier
