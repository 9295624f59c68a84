"""KV events of kvtier tiers inside vLLM 0.33: what a cache-aware router learns kvtier holds.

vLLM's own spec, factory and ``TieringOffloadingManager`` drive a kvtier fs tier (``vllm_helpers``);
its ``take_events`` is what vLLM's scheduler drains each step. The events are checked against the
truth: replaying them (stored adds, removed takes away) must give exactly the blocks the fs tier's
index holds, after stores that make it evict. The last test sends them the way a running vLLM does,
through vLLM's ``OffloadingEventsTracker`` (the connector's translation) and vLLM's
``ZmqEventPublisher``, to a ZMQ subscriber on 127.0.0.1, as llm-d's KV indexer or Dynamo's router
would subscribe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from needs import need_module
from polling import wait_for
from vllm_helpers import ROW_BYTES, VllmStack, kvtier_entry, need_vllm, offload_keys, vllm_stack

need_vllm()

from vllm.v1.kv_offload.base import Medium  # noqa: E402

NAME = "kvtier-events"


def _ours(events: Iterable[Any]) -> list[Any]:
    """The kvtier tier's events (vLLM's primary tier publishes its own, owned by ``None``)."""
    return [e for e in events if getattr(e, "ownership", None) == NAME]


def _replay(events: Iterable[Any], held: set[bytes]) -> set[bytes]:
    for e in events:
        keys = {bytes(k) for k in e.keys}
        if e.removed:
            held -= keys
        else:
            held |= keys
    return held


def _index(stack: VllmStack) -> set[bytes]:
    return {bytes(k) for k in stack.tier.kvtier_tier.index.sizes}


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[VllmStack]:
    # Room for about 5 blocks: the fourth batch of 4 makes the fs tier evict.
    entry = kvtier_entry(tmp_path, name=NAME, max_bytes=5 * ROW_BYTES + 4096, enable_kv_events=True)
    with vllm_stack(tiers=[entry], kv_events=True) as s:
        yield s


def test_events_replay_to_exactly_what_the_tier_holds(stack: VllmStack) -> None:
    keys = offload_keys(16, salt=b"events")
    held: set[bytes] = set()
    removed_seen = 0
    for i in range(0, 16, 4):
        stack.store(keys[i : i + 4])
        with stack.manager.lock:
            mine = _ours(stack.manager.take_events())
        assert all(e.medium is Medium.STORAGE for e in mine)
        removed_seen += sum(len(e.keys) for e in mine if e.removed)
        held = _replay(mine, held)
        assert held == _index(stack), "announced blocks differ from the blocks the tier holds"
    assert stack.tier.kvtier_tier.get_stats()["evictions"] > 0
    assert removed_seen == stack.tier.kvtier_tier.get_stats()["evictions"]
    assert held and held <= set(keys)


def test_stored_events_are_for_the_stored_keys_only_once(stack: VllmStack) -> None:
    keys = offload_keys(3, salt=b"once")
    stack.store(keys)
    with stack.manager.lock:
        first = _ours(stack.manager.take_events())
        again = _ours(stack.manager.take_events())
    assert [sorted(bytes(k) for k in e.keys) for e in first] == [sorted(keys)]
    assert not first[0].removed and first[0].removal_expected
    assert again == []


def test_no_events_without_the_option_or_without_vllm_events(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = offload_keys(2, salt=b"off")
    entry = kvtier_entry(tmp_path / "a", name=NAME)
    with vllm_stack(tiers=[entry], kv_events=True) as s:
        s.store(keys)
        with s.manager.lock:
            assert _ours(s.manager.take_events()) == []
        assert not s.tier.kvtier_tier.removals.enabled  # nothing kept for nobody
    from kvtier.integrations.vllm import tier as adapter

    adapter.reset_log_once()
    entry = kvtier_entry(tmp_path / "b", name=NAME, enable_kv_events=True)
    with caplog.at_level(logging.WARNING, "kvtier"), vllm_stack(tiers=[entry]) as s:
        s.store(keys)
        with s.manager.lock:
            assert _ours(s.manager.take_events()) == []
    assert "KV cache events are disabled" in caplog.text


def test_a_subscriber_receives_them_through_vllms_publisher(stack: VllmStack) -> None:
    # Both come with vLLM (.ci/vllm-requirements.txt): skipped locally without them, failed in CI.
    zmq = need_module("zmq")
    msgspec = need_module("msgspec")
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.events import OffloadingEventsTracker
    from vllm.v1.kv_offload.base import get_offload_block_hash

    keys = offload_keys(12, salt=b"zmq")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.setsockopt(zmq.RCVTIMEO, 200)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    # vLLM connects to a non-wildcard endpoint: the subscriber (a router) binds on loopback.
    pub = ZmqEventPublisher(data_parallel_rank=0, endpoint=f"tcp://127.0.0.1:{port}", topic="kv")
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    tracker = OffloadingEventsTracker(stack.spec.kv_events_config)
    try:
        # Until the subscription reached the publisher, its batches are dropped: send empty ones.
        deadline = time.monotonic() + 10
        while True:
            pub.publish(KVEventBatch(ts=time.time(), events=[]))
            try:
                sub.recv_multipart()
                break
            except zmq.Again:
                assert time.monotonic() < deadline, "the subscriber never connected"
        for i in range(0, 12, 4):
            stack.store(keys[i : i + 4])
            with stack.manager.lock:
                mine = _ours(stack.manager.take_events())
            pub.publish(KVEventBatch(ts=time.time(), events=list(tracker.take_events(mine))))
        received: list[Any] = []
        while len(received) < 3:
            _topic, _seq, payload = sub.recv_multipart()
            batch = decoder.decode(payload)
            if batch.events:
                received.append(batch)
    finally:
        pub.shutdown()
        sub.close(linger=0)
        ctx.term()
    # vLLM publishes a block hash as its low 64 bits (an int) unless told to send bytes
    # (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, maybe_convert_block_hash).
    by_hash: dict[Any, bytes] = {}
    for k in keys:
        h = get_offload_block_hash(k)
        by_hash[h] = by_hash[int.from_bytes(h, "big") & ((1 << 64) - 1)] = k
    held: set[bytes] = set()
    for batch in received:
        for ev in batch.events:
            assert ev.medium == "STORAGE" and ev.ownership == NAME
            ks = {by_hash[h] for h in ev.block_hashes}
            if isinstance(ev, BlockRemoved):
                held -= ks
            else:
                assert isinstance(ev, BlockStored)
                held |= ks
    assert held == _index(stack) and held


PROBE = {"type": "KvtierTier", "module_path": "kvtier.integrations.vllm", "tier": "ProbeTier"}


def _probe(**options: Any) -> dict[str, Any]:
    return {**PROBE, "tier_module_path": "vllm_probe_tier", "name": NAME, "enable_kv_events": True, **options}


def test_a_block_dropped_before_its_store_is_reported_is_never_announced_held() -> None:
    # A third party's tier (vllm_probe_tier) that evicts a block its store job just wrote, before
    # the job is reported: the removal reaches the adapter first, the job's stored event later.
    keys = offload_keys(3, salt=b"race")
    with vllm_stack(tiers=[_probe(drop_first_stored=True)], kv_events=True) as s:
        s.store(keys)
        with s.manager.lock:
            mine = _ours(s.manager.take_events())
        held = _replay(mine, set())
        truth = {bytes(k) for k in s.tier.kvtier_tier.blocks}
        assert truth == set(keys[1:])
        assert held == truth, [(e.removed, [bytes(k).hex()[:8] for k in e.keys]) for e in mine]


def test_a_third_party_tier_that_loses_a_block_announces_its_removal() -> None:
    keys = offload_keys(3, salt=b"lost")
    with vllm_stack(tiers=[_probe(lose_keys=True)], kv_events=True) as s:
        s.store(keys)
        s.wipe_primary()
        out = s.load(keys)
        s.settle()
        with s.manager.lock:
            mine = _ours(s.manager.take_events())
        lost = [k for k in keys if out[k] is None]
        assert lost, "the probe tier lost no block"
        assert _replay(mine, set()) == {bytes(k) for k in s.tier.kvtier_tier.blocks} == set(keys) - set(lost)


def test_another_instance_evicting_from_a_shared_root_is_announced(tmp_path: Path) -> None:
    # Two vLLM instances share one fs root and its byte budget: b's stores evict a's blocks, and a
    # (which did not evict them) announces them removed once it sees b's evictions.
    entry = kvtier_entry(tmp_path, name=NAME, max_bytes=6 * ROW_BYTES + 4096, enable_kv_events=True)
    a_keys, b_keys = offload_keys(4, salt=b"shared-a"), offload_keys(12, salt=b"shared-b")
    with vllm_stack(tiers=[entry], kv_events=True) as a, vllm_stack(tiers=[entry], kv_events=True) as b:
        a.store(a_keys)
        with a.manager.lock:
            held = _replay(_ours(a.manager.take_events()), set())
        assert held == set(a_keys)
        for i in range(0, len(b_keys), 4):
            b.store(b_keys[i : i + 4])

        def settled() -> bool:
            nonlocal held
            a.tier.kvtier_tier.refresh()  # what its refresh_interval timer does
            with a.manager.lock:
                held = _replay(_ours(a.manager.take_events()), held)
            return held == (_index(a) & set(a_keys)) and len(held) < len(a_keys)

        assert wait_for(settled, 10), (len(held), len(_index(a)))
        assert a.tier.kvtier_tier.get_stats()["evictions"] == 0, "a evicted nothing itself"
