"""vLLM instances serving each other's primary tiers through kvtier's p2p tier (vLLM 0.33).

Each instance is vLLM's own spec, factory and ``TieringOffloadingManager`` (``vllm_helpers``) with a
kvtier ``p2p`` tier whose ``serve`` options start kvtier's real block server on 127.0.0.1 (shared
secret, handshake). The server's threads never touch vLLM: peers' requests are answered in
``serve_external_requests`` on vLLM's thread (each step, and vLLM's tier-poll thread between steps),
through vLLM's ``ParentManager``. The other instance loads the blocks byte for byte through its own
manager. The two-process test is the real shape: two engines, each serving the other.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from polling import wait_for
from remote_servers import free_port
from vllm_helpers import VllmStack, assert_exact, kvtier_entry, need_vllm, offload_keys, vllm_stack
from vllm_scenarios import load_until_hit, remote_entry, run_sharing_processes

need_vllm()

from kvtier.keys import BlockKey, LookupResult  # noqa: E402

SECRET_ENV = "KVTIER_TEST_VLLM_P2P_SERVE_SECRET"
OTHER_ENV = "KVTIER_TEST_VLLM_P2P_SERVE_OTHER"


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "serve-test-secret")
    monkeypatch.setenv(OTHER_ENV, "another-secret")


def _p2p(**kw: Any) -> dict[str, Any]:
    kw.setdefault("secret_env", SECRET_ENV)
    return remote_entry("p2p", op_timeout=1.0, breaker_reset=0.5, negative_ttl=0.2, **kw)


@contextlib.contextmanager
def _server(
    *, serve: dict[str, Any] | None = None, extra_tiers: tuple[Any, ...] = (), **kw: Any
) -> Iterator[VllmStack]:
    """An instance whose p2p tier (its first tier) serves on a free loopback port."""
    entry = _p2p(serve=serve or {"port": 0})
    with vllm_stack(tiers=[entry, *extra_tiers], **kw) as stack:
        assert stack.tier.block_service is not None
        yield stack


def _client(server: VllmStack, **kw: Any) -> contextlib.AbstractContextManager[VllmStack]:
    return vllm_stack(tiers=[_p2p(peers=[server.tier.block_service.address], **kw)])


def _sent(stack: VllmStack) -> int:
    return int(stack.tier.block_service.server.stats["blocks_sent"])


def test_an_instance_loads_another_instances_primary_blocks_byte_exact() -> None:
    keys = offload_keys(6, salt=b"served")
    with _server() as a, _client(a) as b:
        assert a.tier.block_service.address.startswith("127.0.0.1:")
        a.store(keys)  # in a's primary tier only: its p2p tier stores nothing
        out = load_until_hit(b, keys)
        assert_exact(out, keys)
        assert b.tier.kvtier_tier.get_stats()["loads"] == len(keys)
        assert wait_for(lambda: _sent(a) == len(keys)), a.tier.block_service.server.stats
        # Every pin taken for a peer was reported and released by a's manager (no step of a's
        # own: its tier-poll thread did it), so a's chunks are evictable again.
        assert wait_for(lambda: not a.manager._jobs), a.manager._jobs
        assert not a.tier.has_pending_work()


def test_a_peer_with_the_wrong_secret_gets_nothing() -> None:
    keys = offload_keys(3, salt=b"secret")
    with _server() as a, _client(a, secret_env=OTHER_ENV) as b:
        a.store(keys)
        assert load_until_hit(b, keys, timeout=2.0) == {k: None for k in keys}
        stats = a.tier.block_service.server.stats
        assert stats["auth_failures"] >= 1 and stats["blocks_sent"] == 0


def test_only_the_primary_tier_is_served_no_promotion_for_a_peer(tmp_path: Path) -> None:
    keys = offload_keys(4, salt=b"fs-only")
    with _server(extra_tiers=(kvtier_entry(tmp_path),)) as a, _client(a) as b:
        a.store(keys)  # cascaded to a's fs tier too
        a.wipe_primary()  # now only a's fs tier has them
        assert load_until_hit(b, keys, timeout=2.0) == {k: None for k in keys}
        assert _sent(a) == 0
        assert not a.manager._jobs, "a peer's lookup started a promotion in a"
        assert a.tier.block_service is not None and a.tier._served.stats["lookups"] > 0
        # a's own request still finds them in its fs tier.
        assert_exact(a.load(keys), keys)


def test_an_instance_that_stops_answering_costs_its_peer_only_misses_and_pins_nothing() -> None:
    keys = offload_keys(3, salt=b"stalled")
    # No tier-poll thread: a answers only when it steps, and its server waits io_timeout at most.
    with (
        _server(serve={"port": 0, "io_timeout": 0.3}, extra={"tier_poll_interval_s": 0}) as a,
        _client(a) as b,
    ):
        a.store(keys)
        stop = threading.Event()

        def steps() -> None:
            while not stop.is_set():
                a.step()
                time.sleep(0.002)

        stepper = threading.Thread(target=steps)
        stepper.start()
        try:
            # b's p2p tier learns that a holds them (LOOKUPs answered on a's steps), no fetch yet.
            p2p = b.tier.kvtier_tier
            assert wait_for(lambda: all(p2p.lookup(BlockKey(k)) is LookupResult.HIT for k in keys))
        finally:
            stop.set()
            stepper.join()
        # Now a takes no step: b's FETCH waits io_timeout, gets nothing, and b recomputes.
        t0 = time.monotonic()
        assert b.load(keys) == {k: None for k in keys}
        assert time.monotonic() - t0 < 10
        served = a.tier._served
        assert served.stats["timeouts"] >= 1, served.stats
        a.step()  # the late FETCH is discarded, never pinned for a sender that gave up
        assert not a.manager._jobs and _sent(a) == 0
        assert served.stats["pinned_blocks"] == 0


def test_reset_cache_waits_for_sends_and_reports_every_pin() -> None:
    keys = offload_keys(6, salt=b"reset")
    with _server() as a, _client(a) as b:
        a.store(keys)
        assert_exact(load_until_hit(b, keys), keys)
        a.reset()  # vLLM asserts every job was reported after drain_jobs
        assert not a.manager._jobs


def test_two_vllm_processes_serve_each_other(tmp_path: Path) -> None:
    pa, pb = free_port(), free_port()
    while pb == pa:
        pb = free_port()
    tiers = {
        me: [_p2p(serve={"port": mine}, peers=[f"127.0.0.1:{theirs}"])]
        for me, mine, theirs in (("a", pa, pb), ("b", pb, pa))
    }
    results = run_sharing_processes(tiers, tmp_path, n=5)
    assert [r["blocks_sent"] for r in results] == [5, 5], results


def test_shutdown_with_a_peer_waiting_is_prompt_and_leaves_vllms_region_unmappable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    keys = offload_keys(2, salt=b"shutdown")
    with caplog.at_level(logging.WARNING):
        with _server(serve={"port": 0, "io_timeout": 8.0}, extra={"tier_poll_interval_s": 0}) as a:
            a.store(keys)
            asks = a.tier._served._asks
            with _client(a) as b:
                b.load(keys)  # b's tier asks a on a worker; a takes no step, so the question waits
                assert wait_for(lambda: len(asks) > 0), "b's question never reached a"
            t0 = time.monotonic()
        elapsed = time.monotonic() - t0
    assert elapsed < 3.0, f"shutdown took {elapsed:.1f} s: it waited out the peer's io_timeout"
    # vLLM unmaps its region only when no view of it is left (it logs that it keeps it otherwise).
    assert "still exported" not in caplog.text, caplog.text
