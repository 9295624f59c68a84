"""Hypothesis stateful test of the engine against an asynchronous tier the test drives.

Invariants checked after every step:
    * capacity: never more resident blocks than slots; the free list, the states and the policy agree;
    * WRITING blocks are never readable (lookup says HIT_PENDING, prepare_load raises, loads skip them);
    * a pinned block is never evicted, and its bytes never change while pinned;
    * every job submitted to the tier is reported exactly once (the tier checks ids; the engine
      counts strays), and a store job's slots stay pinned and unchanged until it is reported;
    * ``drain()`` leaves no job in flight and no pin but the test's own load handles;
    * ``reset()`` keeps every pinned block (and its bytes);
    * every byte loaded equals what was stored under that key.

All real: heap primary buffer, LRU policy, bytes copied by the tier on its own schedule.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from kvtier.engine import Engine, LoadHandle, StoreHandle
from kvtier.errors import MisuseError
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.policies.lru import LRUPolicy
from kvtier.primary import SlotState
from kvtier.tiers.base import SecondaryTier, TierContext

BLOCK = 64
SLOTS = 4
KEYS = [BlockKey(b"key-%02d" % i) for i in range(9)]


def data_of(key: BlockKey) -> bytes:
    return hashlib.sha512(key).digest()[:BLOCK]


class AsyncTier(SecondaryTier):
    """Holds blocks in memory; jobs complete only when the test says (or on drain)."""

    def __init__(
        self, *, primary_kv_view: memoryview, context: TierContext, engine_ref: list[Engine]
    ) -> None:
        super().__init__(primary_kv_view=primary_kv_view, context=context)
        self.blocks: dict[BlockKey, bytes] = {}
        self.open: dict[int, TransferJob] = {}
        self.done: list[JobResult] = []
        self.seen: set[int] = set()
        self.reported: set[int] = set()
        self.engine_ref = engine_ref
        self.fail_next = False

    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        return LookupResult.HIT if key in self.blocks else LookupResult.MISS

    def _accept(self, job: TransferJob) -> None:
        assert job.job_id not in self.seen, "job id reused"
        self.seen.add(job.job_id)
        self.open[job.job_id] = job

    def submit_store(self, job: TransferJob) -> None:
        self._accept(job)

    def submit_load(self, job: TransferJob) -> None:
        self._accept(job)

    def finish(self, n: int, fail: bool) -> None:
        pr = self.engine_ref[0].primary
        for jid in list(self.open)[:n]:
            job = self.open.pop(jid)
            ok: set[BlockKey] = set()
            for i, (k, s) in enumerate(zip(job.keys, job.slot_ids.tolist(), strict=True)):
                assert pr.slot_keys[s] == k, "a job's slot was reused before the job was reported"
                if job.is_promotion:
                    assert pr.states[s] == SlotState.WRITING
                    if k in self.blocks and not (fail and i == 0):
                        self.rows[s, :BLOCK] = np.frombuffer(self.blocks[k], np.uint8)
                        ok.add(k)
                else:
                    assert pr.states[s] in (SlotState.READY, SlotState.FLUSHING) and pr.pins[s] > 0
                    assert self.rows[s, :BLOCK].tobytes() == data_of(k)
                    if not (fail and i == 0):
                        self.blocks[k] = self.rows[s, :BLOCK].tobytes()
                        ok.add(k)
            success = len(ok) == len(set(job.keys))
            self.done.append(JobResult(jid, success, None if success else frozenset(ok)))

    def get_finished_jobs(self) -> list[JobResult]:
        out, self.done = self.done, []
        for r in out:
            assert r.job_id not in self.reported
            self.reported.add(r.job_id)
        return out

    def drain(self) -> None:
        self.finish(len(self.open), False)

    def has_pending_work(self) -> bool:
        return bool(self.open or self.done)


keys_st = st.lists(st.sampled_from(KEYS), min_size=1, max_size=4)


class EngineMachine(RuleBasedStateMachine):
    stores = Bundle("stores")
    loads = Bundle("loads")

    @initialize(
        policy=st.sampled_from(["write_through", "write_back", "after_hits"]),
        inflight=st.integers(1, 4),
    )
    def setup(self, policy: str, inflight: int) -> None:
        ref: list[Engine] = []
        self.e = Engine(
            {
                "cpu_bytes_to_use": SLOTS * 4096,
                "block_bytes": BLOCK,
                "write_policy": policy,
                "write_after_hits": 1,
                "max_inflight_jobs": inflight,
                "promotion_share": 0.5,
            },
            policy=LRUPolicy(SLOTS),
            tiers=[
                lambda v: AsyncTier(primary_kv_view=v, context=TierContext("async", BLOCK), engine_ref=ref)
            ],
        )
        ref.append(self.e)
        tier = self.e.tiers[0]
        assert isinstance(tier, AsyncTier)
        self.tier = tier
        self.held: list[LoadHandle] = []

    def teardown(self) -> None:
        if hasattr(self, "e"):
            for h in self.held:
                self.e.complete_load(h)
            self.e.close()
            assert self.tier.seen == self.tier.reported, "a job was never reported"
            assert self.e.stats()["unknown_results"] == 0

    # -- rules -----------------------------------------------------------------------------
    @rule(keys=keys_st)
    def store(self, keys: list[BlockKey]) -> None:
        data = np.frombuffer(b"".join(data_of(k) for k in keys), np.uint8).reshape(len(keys), BLOCK)
        self.e.store_blocks(keys, data)

    @rule(target=stores, keys=keys_st)
    def open_store(self, keys: list[BlockKey]) -> StoreHandle:
        h = self.e.prepare_store(keys)
        for k, s in zip(h.keys, h.slot_ids.tolist(), strict=True):
            self.e.primary.rows[s, :BLOCK] = np.frombuffer(data_of(k), np.uint8)
        return h

    @rule(h=consumes(stores), ok=st.booleans())
    def close_store(self, h: StoreHandle, ok: bool) -> None:
        self.e.complete_store(h, success=ok)

    @rule(keys=keys_st)
    def lookup(self, keys: list[BlockKey]) -> None:
        pr = self.e.primary
        before = {k: pr.states[pr.index[k]] for k in keys if k in pr.index}
        rep = self.e.lookup(keys)
        for k, r in zip(keys, rep.results, strict=True):
            if before.get(k) == SlotState.WRITING:
                assert r is LookupResult.HIT_PENDING  # never readable
            if r is LookupResult.HIT:
                assert pr.readable(pr.index[k])
        assert rep.num_hits <= len(keys)

    @rule(keys=keys_st)
    def load(self, keys: list[BlockKey]) -> None:
        out = np.zeros((len(keys), BLOCK), np.uint8)
        n = self.e.load_blocks(keys, out)
        for i in range(n):
            assert out[i].tobytes() == data_of(keys[i])

    @rule(target=loads, data=st.data())
    def pin(self, data: st.DataObject) -> LoadHandle | None:
        pr = self.e.primary
        readable = [k for k in KEYS if k in pr.index and pr.readable(pr.index[k])]
        if not readable:
            return None
        keys = data.draw(st.lists(st.sampled_from(readable), min_size=1, max_size=3))
        h = self.e.prepare_load(keys)
        self.held.append(h)
        return h

    @rule(keys=keys_st)
    def pin_unreadable_raises(self, keys: list[BlockKey]) -> None:
        pr = self.e.primary
        if not all(k in pr.index and pr.readable(pr.index[k]) for k in keys):
            with pytest.raises(MisuseError):
                self.e.prepare_load(keys)

    @rule(h=consumes(loads))
    def unpin(self, h: LoadHandle | None) -> None:
        if h is not None and h in self.held:
            self.held.remove(h)
            self.e.complete_load(h)

    @rule(n=st.integers(1, 3), fail=st.booleans())
    def tier_progress(self, n: int, fail: bool) -> None:
        self.tier.finish(n, fail)

    @rule()
    def poll(self) -> None:
        self.e.poll()

    @rule()
    def drain(self) -> None:
        self.e.drain()
        assert self.e.inflight_jobs == 0
        assert not self.tier.open
        held_pins = sum(len(h.slot_ids) for h in self.held)
        assert int(self.e.primary.pins_np.sum()) == held_pins

    @rule()
    def reset(self) -> None:
        pr = self.e.primary
        pinned = {k: pr.rows[pr.index[k], :BLOCK].tobytes() for k in pr.pinned_keys}
        self.e.reset()
        for k, b in pinned.items():
            assert k in pr.index and pr.readable(pr.index[k])
            assert pr.rows[pr.index[k], :BLOCK].tobytes() == b

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def capacity_and_bookkeeping(self) -> None:
        if not hasattr(self, "e"):
            return
        pr = self.e.primary
        states = pr.states_np
        assert len(pr.index) <= SLOTS
        assert len(pr.index) + pr.num_free == SLOTS
        assert int(np.count_nonzero(states == SlotState.FREE)) == pr.num_free
        ready = {pr.slot_keys[s] for s in np.flatnonzero(states == SlotState.READY).tolist()}
        assert set(pr.policy) == ready  # WRITING and FLUSHING blocks are never eviction candidates
        assert pr._in_policy == len(pr.policy)  # the engine's cached count agrees with the policy
        assert pr.pinned_keys == {pr.slot_keys[s] for s in np.flatnonzero(pr.pins_np).tolist()}

    @invariant()
    def pinned_blocks_stay(self) -> None:
        if not hasattr(self, "e"):
            return
        pr = self.e.primary
        for h in self.held:
            for k, s in zip(h.keys, h.slot_ids.tolist(), strict=True):
                assert pr.slot_keys[s] == k and pr.readable(s)
                assert pr.rows[s, :BLOCK].tobytes() == data_of(k)


EngineMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestEngineStateful = EngineMachine.TestCase
