"""kvtier's ``p2p`` tier inside vLLM 0.33: vLLM loads blocks a kvtier peer holds in its primary tier.

vLLM's own factory creates the tier from ``module_path`` and vLLM's own manager drives it. The peer
(``vllm_peer.Peer``) is a real kvtier ``Engine`` holding the blocks, served by kvtier's real
``BlockServer`` on 127.0.0.1 (in this process), with the shared secret and the handshake's block
size / namespace checks. One thing is arranged by the test: the server presents the namespace of
the vLLM side (a kvtier engine's own namespace comes from its config, a vLLM instance's from
vLLM's layout, so no shipped kvtier process presents a vLLM namespace today). Here the vLLM
side is a client; serving vLLM's primary tier to peers is tested in ``test_vllm_p2p_serve.py``. Its
stores move nothing and are never claimed as held.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from polling import wait_for
from vllm_helpers import ROW_BYTES, VllmStack, assert_exact, need_vllm, offload_keys, vllm_stack
from vllm_peer import Peer
from vllm_scenarios import load_until_hit, remote_entry

from kvtier.cli.check import check_config
from kvtier.errors import ConfigError

need_vllm()

SECRET = "vllm-p2p-test-secret"
SECRET_ENV = "KVTIER_TEST_VLLM_P2P_SECRET"
HELD = offload_keys(6, salt=b"p2p-held")


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer(HELD, SECRET)
    try:
        yield p
    finally:
        p.close()


def _entry(peer: Peer, **kw: Any) -> dict[str, Any]:
    return remote_entry(
        "p2p", peers=[peer.address], secret_env=SECRET_ENV,
        op_timeout=1.0, breaker_reset=0.5, negative_ttl=0.2, **kw,
    )  # fmt: skip


@contextlib.contextmanager
def _p2p_stack(peer: Peer, *, first: bool = True, **kw: Any) -> Iterator[VllmStack]:
    """A vLLM stack loading from ``peer``; the first one makes the peer present its namespace."""
    with vllm_stack(tiers=[_entry(peer)], **kw) as stack:
        if first:
            peer.namespace = stack.tier.namespace.root.hex()
        yield stack


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)


def test_vllm_loads_a_peers_blocks_byte_exact(peer: Peer) -> None:
    with _p2p_stack(peer) as stack:
        assert type(stack.tier.kvtier_tier).__name__ == "P2PTier"
        assert stack.tier.cache_hit_source.value == "p2p"
        assert_exact(load_until_hit(stack, HELD), HELD)
        assert stack.tier.kvtier_tier.get_stats()["loads"] == len(HELD)
        # The server counts a fetch once its send returns, which can be just after this side has
        # read the last byte: wait for the count instead of reading it at once.
        assert wait_for(lambda: peer.server.stats["blocks_sent"] == len(HELD)), peer.server.stats
        # Its own stores move nothing and are never claimed: once vLLM's primary forgets them,
        # no tier has them (a HIT here would be a promotion that can only fail).
        mine = offload_keys(2, salt=b"p2p-mine")
        stack.store(mine)
        assert stack.manager._jobs == {}
        stack.wipe_primary()
        assert stack.load(mine) == {k: None for k in mine}


def test_two_vllm_managers_both_load_from_the_peer(peer: Peer) -> None:
    with _p2p_stack(peer) as a, _p2p_stack(peer, first=False) as b:
        assert_exact(load_until_hit(a, HELD[:3]), HELD[:3])
        assert_exact(load_until_hit(b, HELD), HELD)


def test_a_vllm_instance_with_another_layout_gets_nothing(peer: Peer) -> None:
    with _p2p_stack(peer):
        pass  # the server now presents the float16 instance's namespace
    with _p2p_stack(peer, first=False, dtype="bfloat16") as other:
        assert load_until_hit(other, HELD, timeout=2.0) == {k: None for k in HELD}
        assert peer.server.stats["blocks_sent"] == 0


def test_peer_gone_is_misses_and_failed_jobs_without_a_hang(peer: Peer) -> None:
    with _p2p_stack(peer) as stack:
        assert_exact(load_until_hit(stack, HELD[:2]), HELD[:2])
        stack.wipe_primary()
        peer.server.close()
        t0 = time.monotonic()
        assert stack.load(HELD, timeout=20) == {k: None for k in HELD}
        assert stack.manager._jobs == {}, "every promotion was reported"
        assert time.monotonic() - t0 < 20


def test_serving_with_a_directory_inside_vllm_is_refused_naming_the_key(peer: Peer) -> None:
    # Serving is allowed (test_vllm_p2p_serve.py); a directory would go stale: vLLM's primary tier
    # never reports its evictions.
    entry = _entry(peer, serve={"port": 0}, directory="redis://127.0.0.1:1/0")
    raw = {
        "kv_connector": "OffloadingConnector",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 16 * ROW_BYTES,
            "secondary_tiers": [entry],
        },
    }
    with pytest.raises(ConfigError, match=r"secondary_tiers\[0\]\.directory.*peers"):
        check_config(raw)
    with pytest.raises(ConfigError, match=r"KvtierTier\.directory"), vllm_stack(tiers=[entry]):
        pass
