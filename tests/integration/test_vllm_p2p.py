"""kvtier's ``p2p`` tier inside vLLM 0.33: vLLM loads blocks a kvtier peer holds in its primary tier.

vLLM's own factory creates the tier from ``module_path`` and vLLM's own manager drives it. The peer
is a real kvtier ``Engine`` holding the blocks, served by kvtier's real ``BlockServer`` on
127.0.0.1 (in this process), with the shared secret and the handshake's block size / namespace
checks. One thing is arranged by the test: the server presents the namespace of the vLLM side
(a kvtier engine's own namespace comes from its config, a vLLM instance's from vLLM's layout; two
vLLM instances would share one by construction). Inside vLLM the p2p tier is a client only:
serving vLLM's primary tier to peers is refused (``serve``), so its stores move nothing and are
never claimed as held.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from vllm_helpers import ROW_BYTES, VllmStack, assert_exact, need_vllm, offload_keys, payload, vllm_stack
from vllm_scenarios import load_until_hit, remote_entry

from kvtier.cli.check import check_config
from kvtier.engine import Engine
from kvtier.errors import ConfigError
from kvtier.keys import BlockKey
from kvtier.p2p.server import BlockServer

need_vllm()

SECRET = "vllm-p2p-test-secret"
SECRET_ENV = "KVTIER_TEST_VLLM_P2P_SECRET"
HELD = offload_keys(6, salt=b"p2p-held")


class _Served:
    """A kvtier engine as its block server sees it, under the namespace of the vLLM side."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.namespace = ""  # set once the vLLM side exists (see _p2p_stack)
        self.block_bytes = engine.block_bytes
        self.primary_kv_view = engine.primary_kv_view
        self.serving = engine.serving

    def complete_load(self, handle: Any) -> None:
        self.engine.complete_load(handle)


@pytest.fixture
def peer() -> Iterator[tuple[_Served, BlockServer]]:
    engine = Engine({"block_bytes": ROW_BYTES, "cpu_bytes_to_use": ROW_BYTES * 32})
    data = np.stack([payload(k) for k in HELD])
    assert engine.store_blocks([BlockKey(k) for k in HELD], data) == len(HELD)
    served = _Served(engine)
    server = BlockServer(served, secret=SECRET.encode(), io_timeout=2.0)  # type: ignore[arg-type]
    try:
        yield served, server
    finally:
        server.close()
        engine.close()


def _entry(server: BlockServer, **kw: Any) -> dict[str, Any]:
    return remote_entry(
        "p2p", peers=[f"127.0.0.1:{server.port}"], secret_env=SECRET_ENV,
        op_timeout=1.0, breaker_reset=0.5, negative_ttl=0.2, **kw,
    )  # fmt: skip


@contextlib.contextmanager
def _p2p_stack(served: _Served, server: BlockServer, **kw: Any) -> Iterator[VllmStack]:
    with vllm_stack(tiers=[_entry(server)], **kw) as stack:
        if not served.namespace:
            served.namespace = stack.tier.namespace.root.hex()
        yield stack


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)


def test_vllm_loads_a_peers_blocks_byte_exact(peer: tuple[_Served, BlockServer]) -> None:
    served, server = peer
    with _p2p_stack(served, server) as stack:
        assert type(stack.tier.kvtier_tier).__name__ == "P2PTier"
        assert stack.tier.cache_hit_source.value == "p2p"
        assert_exact(load_until_hit(stack, HELD), HELD)
        assert stack.tier.kvtier_tier.get_stats()["loads"] == len(HELD)
        assert server.stats["blocks_sent"] == len(HELD)
        # Its own stores move nothing and are never claimed: once vLLM's primary forgets them,
        # no tier has them (a HIT here would be a promotion that can only fail).
        mine = offload_keys(2, salt=b"p2p-mine")
        stack.store(mine)
        assert stack.manager._jobs == {}
        stack.wipe_primary()
        assert stack.load(mine) == {k: None for k in mine}


def test_two_vllm_managers_both_load_from_the_peer(peer: tuple[_Served, BlockServer]) -> None:
    served, server = peer
    with _p2p_stack(served, server) as a, _p2p_stack(served, server) as b:
        assert_exact(load_until_hit(a, HELD[:3]), HELD[:3])
        assert_exact(load_until_hit(b, HELD), HELD)


def test_a_vllm_instance_with_another_layout_gets_nothing(peer: tuple[_Served, BlockServer]) -> None:
    served, server = peer
    with _p2p_stack(served, server):
        pass  # the server now presents the float16 instance's namespace
    with _p2p_stack(served, server, dtype="bfloat16") as other:
        assert load_until_hit(other, HELD, timeout=2.0) == {k: None for k in HELD}
        assert server.stats["blocks_sent"] == 0


def test_peer_gone_is_misses_and_failed_jobs_without_a_hang(peer: tuple[_Served, BlockServer]) -> None:
    served, server = peer
    with _p2p_stack(served, server) as stack:
        assert_exact(load_until_hit(stack, HELD[:2]), HELD[:2])
        stack.wipe_primary()
        server.close()
        t0 = time.monotonic()
        assert stack.load(HELD, timeout=20) == {k: None for k in HELD}
        assert stack.manager._jobs == {}, "every promotion was reported"
        assert time.monotonic() - t0 < 20


def test_serving_inside_vllm_is_refused_naming_the_key(peer: tuple[_Served, BlockServer]) -> None:
    _, server = peer
    entry = _entry(server, serve={"port": 0})
    raw = {
        "kv_connector": "OffloadingConnector",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 16 * ROW_BYTES,
            "secondary_tiers": [entry],
        },
    }
    with pytest.raises(ConfigError, match=r"secondary_tiers\[0\]\.serve.*remove"):
        check_config(raw)
    with pytest.raises(ConfigError, match=r"KvtierTier\.serve"), vllm_stack(tiers=[entry]):
        pass
