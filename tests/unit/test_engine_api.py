"""Engine facade: lookup/store/load, write policies, admission, tier failures, events, lifecycle.

Real parts throughout: the LRU policy, the ``example`` tier (really copies bytes) and a heap or
metadata-only primary buffer. No GPU is involved (the engine's KV movers are tested with numpy and CPU
torch tensors in ``test_transfer_movers.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.engine import Engine, EngineEvent, LookupReport, RequestContext
from kvtier.errors import MisuseError
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.policies.lru import LRUPolicy
from kvtier.tiers.base import SecondaryTier, TierContext

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
        rep = e.lookup([*keys, K(99)])
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
        assert [(ev.kind, len(ev.keys), ev.tier) for ev in e.poll()] == [("promoted", 4, "example0")]
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


def test_coalesced_promotions_go_out_as_one_job_at_the_next_poll() -> None:
    """Keys looked up one at a time (vLLM's scheduler) are promoted as one job per tier, handed
    to the tier at the next poll; a refused hand-over frees the slots (later lookups miss)."""
    e, tier = scripted(16, max_inflight_jobs=4, promotion_share=0.25)  # one promotion job allowed
    with e:
        e.coalesce_promotions = True
        tier.held = {K(i) for i in range(100, 106)}
        for i in range(100, 106):
            assert e.lookup([K(i)]).results == [PENDING]  # slot reserved, load staged
        assert tier.open == {}  # nothing handed over yet
        st = e.stats()
        assert st["promotions_rejected"] == 0 and st["jobs_submitted"] == 1
        e.poll()
        (job,) = tier.open.values()
        assert list(job.keys) == [K(i) for i in range(100, 106)]
        tier.finish_all()
        e.poll()
        assert e.lookup([K(i) for i in range(100, 106)]).results == [HIT] * 6
        assert e.stats()["promotions"] == 6
        # A tier that refuses the coalesced job: its keys are freed and miss afterwards.
        tier.held |= {K(200), K(201)}
        tier.raise_on.add("load")
        assert e.lookup([K(200)]).results == [PENDING]
        assert e.lookup([K(201)]).results == [PENDING]
        e.poll()
        tier.raise_on.clear()
        assert e.stats()["primary"]["writing"] == 0
        e.coalesce_promotions = False
        assert e.lookup([K(200), K(201)]).results == [PENDING] * 2  # retried, uncoalesced
        assert len(tier.open) == 1


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.one_of(st.integers(0, 11), st.just(-1)), max_size=40))
def test_coalescing_changes_how_many_jobs_never_what_lands(ops: list[int]) -> None:
    """Any interleaving of one-key lookups (0..11) and polls (-1): with and without coalescing,
    the same keys land with the same bytes (a budget that never binds), in no more jobs."""
    keys = [K(i) for i in range(12)]
    data = payload(keys)
    outcome = []
    for coalesce in (False, True):
        with example_engine(16, max_inflight_jobs=64) as e:
            e.store_blocks(keys, data[:12])
            e.drain()
            e.reset()
            e.coalesce_promotions = coalesce
            for op in ops:
                if op < 0:
                    e.poll()
                else:
                    e.lookup([keys[op]])
            e.drain()
            st_ = e.stats()
            landed = [k for k in keys if e.lookup([k]).results == [HIT]]
            out = np.zeros((len(landed), BLOCK), np.uint8)
            assert e.load_blocks(landed, out) == len(landed)
            assert all(np.array_equal(out[j], data[keys.index(k)]) for j, k in enumerate(landed))
            outcome.append((landed, st_["promotions"], st_["jobs_submitted"]))
    (plain, n_plain, jobs_plain), (coal, n_coal, jobs_coal) = outcome
    assert plain == coal and n_plain == n_coal and jobs_coal <= jobs_plain


def test_drain_hands_staged_promotions_over_and_waits_for_them() -> None:
    e, tier = scripted(8)
    with e:
        e.coalesce_promotions = True
        tier.held = {K(1), K(2)}
        e.lookup([K(1)])
        e.lookup([K(2)])
        assert tier.open == {} and e.inflight_jobs == 1
        e.drain()  # a staged promotion is handed over first, or drain would wait for it forever
        st = e.stats()
        assert st["promotions"] == 2 and st["jobs_submitted"] == 1 and e.inflight_jobs == 0
        assert e.lookup([K(1), K(2)]).results == [HIT, HIT]


def test_write_through_pins_until_the_store_job_ends() -> None:
    e, tier = scripted(2)
    with e:
        e.complete_store(e.prepare_store([K(1), K(2)]))
        assert e.stats()["primary"]["pinned"] == 2  # the store job reads the slots
        h = e.prepare_store([K(3)])
        assert h.keys == []  # nothing evictable while pinned
        e.complete_store(h)
        tier.finish_all()
        e.poll()
        assert e.stats()["primary"]["pinned"] == 0
        assert tier.held == {K(1), K(2)}
        h = e.prepare_store([K(3)])
        assert h.keys == [K(3)]
        e.complete_store(h)


def test_write_back_flushes_victims_before_freeing_them() -> None:
    e, tier = scripted(2, write_policy="write_back")
    with e:
        e.complete_store(e.prepare_store([K(1), K(2)]))
        assert not tier.open  # nothing written on store
        h = e.prepare_store([K(3)])
        # K(1) is the victim: it is being flushed, still readable, and its slot is not free yet.
        assert [j.keys for j in tier.open.values()] == [[K(1)]]
        assert h.keys == []
        e.complete_store(h)
        tier.finish_all()
        e.poll()
        assert tier.held == {K(1)}
        assert e.lookup([K(1), K(2)]).results == [PENDING, HIT]  # K(1) was freed; promoted back
        assert e.stats()["writebacks"] == 1


def test_a_hit_rescues_a_write_back_victim_being_flushed() -> None:
    e, tier = scripted(2, write_policy="write_back")
    with e:
        e.complete_store(e.prepare_store([K(1), K(2)]))
        e.complete_store(e.prepare_store([K(3)]))  # K(1) -> FLUSHING, K(3) dropped (no free slot)
        assert e.lookup([K(1)]).results == [HIT]  # readable while flushing, and now kept
        tier.finish_all()
        e.poll()
        assert tier.held == {K(1)}
        assert e.lookup([K(1)]).results == [HIT]  # not freed when its flush ended
        assert e.stats()["primary"]["flushing"] == 0
        assert set(e.policy) == {K(1), K(2)}


def test_write_back_with_a_fast_tier_does_not_drop_stores() -> None:
    with example_engine(2, write_policy="write_back") as e:
        keys = [K(i) for i in range(6)]
        data = payload(keys)
        for i in range(6):
            assert e.store_blocks(keys[i : i + 1], data[i : i + 1]) == 1
        assert e.stats()["dropped_stores"] == 0
        assert len(e.tiers[0]) == 4  # type: ignore[arg-type]
        e.drain()
        out = np.zeros((1, BLOCK), np.uint8)
        assert e.lookup(keys[:1]).results == [PENDING]
        e.poll()
        assert e.load_blocks(keys[:1], out) == 1 and np.array_equal(out, data[:1])


def test_close_flushes_write_back_blocks() -> None:
    e, tier = scripted(4, write_policy="write_back")
    e.complete_store(e.prepare_store([K(1), K(2)]))
    e.close()
    assert tier.held == {K(1), K(2)}
    e.close()  # idempotent
    with pytest.raises(MisuseError):
        e.lookup([K(1)])


def test_after_hits_writes_once_a_block_is_hit_k_times() -> None:
    e, tier = scripted(4, write_policy="after_hits", write_after_hits=2)
    with e:
        e.complete_store(e.prepare_store([K(1), K(2)]))
        e.lookup([K(1)])
        e.drain()
        assert tier.held == set()
        e.lookup([K(1), K(2)])
        e.drain()
        assert tier.held == {K(1)}
        e.lookup([K(1), K(2)])
        e.lookup([K(1)])
        e.drain()
        assert tier.held == {K(1), K(2)}
        assert e.stats()["jobs_submitted"] == 2  # once per block, not per hit


def test_admission_promotions_cannot_take_the_whole_job_budget() -> None:
    e, tier = scripted(16, max_inflight_jobs=4, promotion_share=0.5)
    with e:
        tier.held = {K(i) for i in range(100, 110)}
        for i in range(100, 105):
            e.lookup([K(i)])  # each lookup would be one promotion job
        st = e.stats()
        assert st["promotions_inflight"] == 2  # 0.5 * 4
        assert st["promotions_rejected"] == 3
        # Stores still get the rest of the budget at once.
        e.complete_store(e.prepare_store([K(1)]))
        e.complete_store(e.prepare_store([K(2)]))
        assert e.stats()["jobs_inflight"] == 4
        # A store beyond the budget waits (pinned), and goes out when a job finishes.
        e.complete_store(e.prepare_store([K(3)]))
        assert e.stats()["deferred_stores"] == 1
        tier.finish_all()
        e.poll()
        assert e.stats()["deferred_stores"] == 0
        e.drain()
        assert e.inflight_jobs == 0
        assert K(3) in tier.held


def test_tier_failures_degrade_to_misses_never_raise() -> None:
    e, tier = scripted(4)
    with e:
        tier.held = {K(1)}
        tier.raise_on = {"lookup"}
        assert e.lookup([K(1)]).results == [MISS]
        tier.raise_on = {"load"}
        assert e.lookup([K(1)]).results == [MISS]  # submit failed: slot released at once
        assert e.stats()["primary"]["free"] == 4
        tier.raise_on = {"store"}
        e.complete_store(e.prepare_store([K(2)]))
        assert e.stats()["jobs_failed"] == 2
        assert e.stats()["primary"]["pinned"] == 0
        tier.raise_on = {"poll"}
        e.poll()
        tier.raise_on = set()
        assert e.stats()["tier_errors"] >= 4
        # Partial promotion: the failed key is released, the good one becomes READY.
        tier.held = {K(5), K(6)}
        tier.fail_loads = {K(6)}
        assert e.lookup([K(5), K(6)]).results == [PENDING, PENDING]
        tier.finish_all()
        e.poll()
        assert e.lookup([K(5)]).results == [HIT]
        tier.held.discard(K(6))
        assert e.lookup([K(6)]).results == [MISS]


def test_retry_answers_pass_through() -> None:
    e, tier = scripted(4)
    with e:
        tier.answer = {K(1): RETRY}
        rep = e.lookup([K(1), K(2)])
        assert rep.results == [RETRY, MISS]
        assert e.stats()["retries"] == 1


def test_unknown_job_results_are_counted_not_applied() -> None:
    e, tier = scripted(4)
    with e:
        tier.done.append(JobResult(12345, True))
        e.poll()
        assert e.stats()["unknown_results"] == 1


def test_tenant_b_never_hits_tenant_a() -> None:
    with example_engine(8) as e:
        a, b = RequestContext("r1", tenant="A"), RequestContext("r2", tenant="B")
        keys = [K(i) for i in range(3)]
        data = payload(keys)
        assert e.store_blocks(keys, data, a) == 3
        e.drain()
        assert e.lookup(keys, a).results == [HIT] * 3
        assert e.lookup(keys, b).results == [MISS] * 3  # neither the primary nor the example tier
        assert e.lookup(keys).results == [MISS] * 3  # nor a request without a tenant
        with pytest.raises(MisuseError):
            e.prepare_load(keys, b)
        assert e.load_blocks(keys, np.zeros_like(data), b) == 0
        # B stores its own blocks under the same keys; each tenant reads its own bytes.
        data_b = data[::-1].copy()
        assert e.store_blocks(keys, data_b, b) == 3
        out = np.zeros_like(data)
        assert e.load_blocks(keys, out, a) == 3 and np.array_equal(out, data)
        assert e.load_blocks(keys, out, b) == 3 and np.array_equal(out, data_b)
        # After a reset, promotion from the shared tier still respects tenants.
        e.drain()  # write-through jobs pin their slots until collected; reset keeps pinned blocks
        e.reset()
        assert e.lookup(keys, b).results == [PENDING] * 3
        e.poll()
        assert e.load_blocks(keys, out, b) == 3 and np.array_equal(out, data_b)


def test_reset_keeps_pinned_blocks_and_close_is_idempotent() -> None:
    e = Engine(cfg(4))
    keys = [K(i) for i in range(3)]
    data = payload(keys)
    e.store_blocks(keys, data)
    lh = e.prepare_load(keys[:1])
    e.reset()
    assert e.lookup(keys).results == [HIT, MISS, MISS]
    out = np.zeros((1, BLOCK), np.uint8)
    np.copyto(out[0], e.primary.rows[int(lh.slot_ids[0]), :BLOCK])
    assert np.array_equal(out, data[:1])
    e.complete_load(lh)
    with pytest.raises(MisuseError):
        e.complete_load(lh)
    e.close()
    e.close()


def test_events_and_subscribers() -> None:
    seen: list[EngineEvent] = []
    with Engine(cfg(2, primary_backing="none")) as e:
        e.subscribe(seen.append)
        e.complete_store(e.prepare_store([K(1), K(2)]))
        e.lookup([K(1)])
        e.complete_store(e.prepare_store([K(3)]))
        kinds = [ev.kind for ev in e.events()]
        assert kinds == ["stored", "evicted", "stored"]
        assert [ev.kind for ev in seen] == kinds
        assert seen[1].keys == (K(2),)
        assert e.events() == []


def test_subscriber_errors_do_not_reach_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    def boom(ev: EngineEvent) -> None:
        raise RuntimeError("metrics broke")

    with Engine(cfg(2, primary_backing="none")) as e:
        e.subscribe(boom)
        e.complete_store(e.prepare_store([K(1)]))
    assert "subscriber failed" in caplog.text


def test_simulation_mode_has_no_bytes_and_no_tiers() -> None:
    c = cfg(3, primary_backing="none", secondary_tiers=[{"type": "example"}])
    with Engine(c) as e:
        assert e.tiers == []
        assert e.primary_kv_view.shape == (3, 0)
        keys = [K(i) for i in range(5)]
        # One batch cannot evict its own WRITING blocks: the 2 that do not fit are dropped.
        assert e.store_blocks(keys, payload(keys)) == 3
        assert e.stats()["dropped_stores"] == 2
        assert e.store_blocks(keys[3:], payload(keys[3:])) == 2
        assert e.lookup(keys).results == [MISS, MISS, HIT, HIT, HIT]
        assert e.stats()["evictions"] == 2


def test_duplicate_keys_in_one_store_take_one_slot() -> None:
    with Engine(cfg(4, primary_backing="none")) as e:
        h = e.prepare_store([K(1), K(1), K(2)])
        assert h.keys == [K(1), K(2)] and h.positions == [0, 2]
        e.complete_store(h)
        assert e.stats()["primary"]["ready"] == 2


def test_policy_override_must_match_the_slot_count() -> None:
    with pytest.raises(MisuseError, match="capacity"):
        Engine(cfg(4), policy=LRUPolicy(5))


def test_report_values() -> None:
    rep = LookupReport(1, [HIT, MISS])
    assert rep.codes == b"\x01\x00" and rep.hits == 1 and len(rep) == 2
    assert "num_hits=1" in repr(rep)
    assert LookupReport(0, None, 0, b"\x00\x00").results == [MISS, MISS]
    assert LookupReport(2, None, 0, b"\x01\x01").results == [HIT, HIT]
    assert LookupReport(1, None, 1, b"\x01\x02\x00\x03").results == [HIT, PENDING, MISS, RETRY]
    assert LookupReport(0, None, 0, b"").results == []


def test_access_equals_lookup_plus_storing_the_misses() -> None:
    import random

    from kvtier.keys import BlockInfo

    rnd = random.Random(3)
    trace = [[K(rnd.randrange(40)) for _ in range(6)] for _ in range(300)]
    tenants = [None, "t1", "t2"]
    a = Engine(cfg(10, primary_backing="none"))
    b = Engine(cfg(10, primary_backing="none"))
    with a, b:
        for n, keys in enumerate(trace):
            ctx = RequestContext(tenant=tenants[n % 3])
            infos = [BlockInfo(depth=d) for d in range(len(keys))]
            ra = a.access(keys, ctx, infos)
            rb = b.lookup(keys, ctx)
            miss = [i for i, c in enumerate(rb.codes) if c == 0]
            b.complete_store(b.prepare_store([keys[i] for i in miss], ctx, [infos[i] for i in miss]))
            assert ra.codes == rb.codes and ra.num_hits == rb.num_hits
        assert [(ev.kind, ev.keys) for ev in a.events()] == [(ev.kind, ev.keys) for ev in b.events()]
        sa, sb = a.stats(), b.stats()
        for key in ("hits", "misses", "stores", "evictions", "dropped_stores"):
            assert sa[key] == sb[key], key
        assert sorted(a.primary.index) == sorted(b.primary.index)


def test_docs_engine_md_examples_run() -> None:
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "docs" / "engine.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "docs/engine.md", "exec"), {})


def test_concurrent_callers_see_consistent_bytes() -> None:
    """Four threads store, look up, load and poll on one engine (one lock); every load is exact."""
    import random
    import threading

    e = example_engine(16)
    keys = [K(i) for i in range(48)]
    data = {k: row for k, row in zip(keys, payload(keys), strict=True)}
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        out = np.zeros((4, BLOCK), np.uint8)
        try:
            for step in range(150):
                ks = rnd.sample(keys, 4)
                op = rnd.random()
                if op < 0.4:
                    e.store_blocks(ks, np.stack([data[k] for k in ks]))
                elif op < 0.8:
                    n = e.load_blocks(ks, out)
                    for i in range(n):
                        assert np.array_equal(out[i], data[ks[i]])
                elif op < 0.95:
                    e.lookup(ks)
                    e.poll()
                elif seed == 0 and step % 50 == 0:
                    e.drain()
                    e.reset()
        except BaseException as exc:  # surfaced below with the thread's traceback
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    e.drain()
    st = e.stats()
    e.close()
    assert not errors, errors[0]
    assert st["jobs_inflight"] == 0 and st["unknown_results"] == 0 and st["tier_errors"] == 0
    assert st["primary"]["pinned"] == 0


def test_tiers_and_policies_never_import_the_engine() -> None:
    import ast
    import pathlib

    root = pathlib.Path(__file__).parents[2] / "src" / "kvtier"
    offenders = []
    for sub in ("tiers", "policies"):
        for path in sorted((root / sub).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                offenders += [
                    f"{path.name}: {n}" for n in names if n.startswith(("kvtier.engine", "kvtier.primary"))
                ]
    assert offenders == []


def test_a_tenantless_caller_cannot_forge_a_tenants_internal_keys() -> None:
    # The tag is keyed by model + cache_salt: guessing it from the tenant's name alone (as an
    # unkeyed hash would allow) must not reach tenant A's blocks.
    import hashlib

    with Engine({**cfg(8), "cache_salt": "deployment-secret"}) as e:
        keys = [K(i) for i in range(2)]
        data = payload(keys)
        assert e.store_blocks(keys, data, RequestContext("r1", tenant="A")) == 2
        guess = hashlib.blake2b(b"A", digest_size=8, person=b"kvtier-tenant").digest()
        forged = [BlockKey(b"\x01" + guess + k) for k in keys]
        assert e.lookup(forged).results == [MISS] * 2
        # Engines of the same deployment agree on the tag; another salt does not.
        with Engine({**cfg(8), "cache_salt": "deployment-secret"}) as same:
            assert same._scope(keys, RequestContext("x", tenant="A")) == e._scope(
                keys, RequestContext("y", tenant="A")
            )
        with Engine({**cfg(8), "cache_salt": "other"}) as other:
            assert other._scope(keys, RequestContext("x", tenant="A")) != e._scope(
                keys, RequestContext("y", tenant="A")
            )
