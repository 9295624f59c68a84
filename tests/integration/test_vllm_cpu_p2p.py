"""Two running vLLM servers (vLLM's CPU build) serving each other's primary tiers through kvtier's p2p.

Each server runs ``KvtierCPUTieringSpec`` with one ``KvtierTier`` entry of kvtier's ``p2p`` tier: its
block server on 127.0.0.1 (``serve``, shared secret) and the other server as its one peer. Server A
computes a 2,000-token prompt; server B, after its own caches are reset, is served that prompt's
blocks by A: B's lookups find them at A (LOOKUP), vLLM promotes them and B's tier FETCHes them from
A's primary tier, answered by A in ``serve_external_requests`` on A's own scheduler thread. Then both
servers stop on SIGINT with no kvtier defect and no ``/dev/shm`` file left.

vLLM 0.32 (the CPU build) has no tier-poll thread, so a server answers peers only while its engine
steps (0.33 and 0.34 also answer between steps: tests/integration/test_vllm_p2p_serve.py drives
that through their managers). A is therefore kept busy with a long generation while B asks: the
shape of a production fleet, where the instance holding a prefix is one that serves requests.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from remote_servers import free_port
from vllm_cpu import BLOCK_TOKENS, kvtier_defects, prompt, shared_model, shm_leftovers
from vllm_cpu_server import Server, cached_tokens, counter_total, tiering_extra

pytestmark = pytest.mark.slow

TOKENS = 2000
FULL_BLOCKS = TOKENS // BLOCK_TOKENS
PROMPT = prompt(7, TOKENS)
SECRET_ENV = "KVTIER_TEST_VLLM_CPU_P2P_SECRET"


def _extra(serve_port: int, peer_port: int) -> dict[str, Any]:
    return tiering_extra(
        "p2p",
        peers=[f"127.0.0.1:{peer_port}"],
        secret_env=SECRET_ENV,
        op_timeout=5.0,
        serve={"host": "127.0.0.1", "port": serve_port, "io_timeout": 10.0},
    )


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    model = shared_model(tmp_path_factory.mktemp("model"))
    port_a, port_b = free_port(), free_port()
    mp = pytest.MonkeyPatch()
    mp.setenv(SECRET_ENV, "p2p-engines-test-secret")  # the servers read it from their environment
    servers: list[Server] = []
    try:
        servers.append(Server(model, _extra(port_a, port_b), tmp_path_factory.mktemp("a")))
        servers.append(Server(model, _extra(port_b, port_a), tmp_path_factory.mktemp("b")))
        yield servers[0], servers[1]
    finally:
        for srv in servers:
            srv.stop()
        mp.undo()


def _reset(server: Server) -> None:
    """Empty both of vLLM's caches (device prefix cache and CPU primary tier); retried while a
    transfer is in flight (vLLM refuses then)."""
    deadline = time.monotonic() + 60
    while not server.post("/reset_prefix_cache?reset_external=true")["success"]:
        assert time.monotonic() < deadline, "vLLM never reset its prefix caches"
        time.sleep(0.5)


def _keep_busy(server: Server, stop: threading.Event) -> threading.Thread:
    """Long generations on ``server`` until ``stop``: its engine steps, so it answers its peers."""

    def run() -> None:
        while not stop.is_set():
            server.post(
                "/v1/completions",
                {"model": server.model, "prompt": prompt(123, 40), "max_tokens": 400, "ignore_eos": True},
            )

    thread = threading.Thread(target=run, name="keep-busy", daemon=True)
    thread.start()
    return thread


def test_two_running_engines_serve_each_other_through_kvtier_p2p(pair: tuple[Server, Server]) -> None:
    a, b = pair
    reference = a.complete(PROMPT)  # A computes the prompt; its blocks go to A's primary tier
    a.complete(PROMPT)  # a device prefix-cache hit: the steps that store the first request's blocks
    b.complete(PROMPT)  # B: its lookups start (LOOKUPs to A run while B computes it itself)
    _reset(b)  # B's own copy is gone: only A can serve it now
    stop = threading.Event()
    busy = _keep_busy(a, stop)
    try:
        again: dict[str, Any] = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            again = b.complete(PROMPT)
            if cached_tokens(again) >= (FULL_BLOCKS - 1) * BLOCK_TOKENS:
                break
            _reset(b)  # a miss recomputed the prompt on B: drop that copy and ask A again
            time.sleep(1)
    finally:
        stop.set()
        busy.join(120)
    assert cached_tokens(again) >= (FULL_BLOCKS - 1) * BLOCK_TOKENS, (again, b.log()[-3000:])
    # The first token is the one A computed for the same prompt (the greedy pick of a cached path).
    assert again["choices"][0]["text"] == reference["choices"][0]["text"]
    # B's kvtier p2p tier counted the loads; vLLM reports counters at its next step.
    deadline = time.monotonic() + 60
    while counter_total(b.metrics(), "kvtier:tier_loads") < FULL_BLOCKS - 1:
        if time.monotonic() > deadline:
            break
        b.complete(prompt(99, 40))
        time.sleep(0.5)
    assert counter_total(b.metrics(), "kvtier:tier_loads") >= FULL_BLOCKS - 1


def test_both_servers_stop_clean_on_sigint(pair: tuple[Server, Server]) -> None:
    """Runs last: Ctrl-C ends both servers (block servers included) with no kvtier defect."""
    for srv in pair:
        srv.stop(signal.SIGINT)
        defects = kvtier_defects(srv.log())
        assert not defects, "\n".join(defects[:20])
        assert shm_leftovers(srv.engine_id) == []
