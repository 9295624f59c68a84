"""kvtier's engine as vLLM 0.33's offloading spec, loaded by vLLM's own factory (``spec_module_path``).

What runs for real: vLLM's ``OffloadingSpecFactory`` resolving ``spec_name`` + ``spec_module_path``,
vLLM's ``SharedOffloadRegion`` on both sides (a worker *process* creates ``/dev/shm/vllm_offload_<id>``
first, as vLLM's workers do before the scheduler exists; the spec's manager maps it second), kvtier's
engine with its fs tier on a real directory, and the manager calls in the order vLLM's
``OffloadingConnectorScheduler`` makes them (``offloading/scheduler.py``: ``on_new_request`` 1201,
``lookup`` 786, ``prepare_load`` 1474, ``prepare_store`` 1988, ``complete_store``/``complete_load``
2291-2293, ``on_request_finished`` 2182, ``on_schedule_end`` 2195, ``has_pending_work`` 2216), each
under ``manager.lock`` (vLLM 0.33+; 0.32 has no lock: :func:`vllm_helpers.manager_lock`).

Faked, because it needs a GPU: the worker's DMA. vLLM's ``CPUOffloadingWorker`` copies GPU blocks
into the view ``SharedOffloadRegion.create_next_worker_view`` gives it (``cpu/gpu_worker.py``
842-843) and refuses to start without CUDA/XPU (``cpu/spec.py`` 220); the worker process here takes
that same view and copies bytes into / out of it with numpy. ``docs/vllm.md`` lists what a GPU
machine still has to verify.

The ``test_contract_*`` tests pin the vLLM source facts the design stands on, so they fail loudly
when a vLLM upgrade changes one.
"""

from __future__ import annotations

import contextlib
import glob
import inspect
import json
import multiprocessing
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_helpers import ROW_BYTES, manager_lock, need_vllm, offload_keys, offloading_config, payload

from kvtier.errors import KvtierError
from kvtier.integrations.vllm import compat

need_vllm()

from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

from kvtier.integrations.vllm.spec import KvtierOffloadingManager, KvtierOffloadingSpec  # noqa: E402

SPEC = {"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.integrations.vllm"}
SETTLED = (LookupResult.HIT, LookupResult.MISS)


def _worker_main(conn: Any, engine_id: str, chunks: int, row: int, page: int) -> None:
    """A vLLM worker's host side: vLLM's region, the view its CPUOffloadingWorker copies into."""
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

    region = SharedOffloadRegion(
        engine_id=engine_id, num_chunks=chunks, rank=0, kv_bytes_per_chunk=row, cpu_page_size=page
    )
    view = region.create_next_worker_view(page).numpy().view(np.uint8)
    conn.send(("ready", region._creator, os.getpid()))
    while True:
        cmd, ids, rows = conn.recv()
        if cmd == "store":  # GPU -> CPU chunk (the faked DMA)
            for c, r in zip(ids, rows, strict=True):
                view[int(c)] = r
            conn.send("ok")
        elif cmd == "load":  # CPU chunk -> GPU
            conn.send([view[int(c)].copy() for c in ids])
        elif cmd == "wipe":
            view[:] = 0xA5
            conn.send("ok")
        else:
            break
    del view
    region.cleanup()
    conn.send("closed")


class Worker:
    """The worker process (forked: the parent has vLLM imported already)."""

    def __init__(self, spec: Any) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker_main,
            args=(
                child,
                spec._engine_id,
                spec.num_chunks,
                spec.kv_bytes_per_chunk,
                spec.cpu_page_size_per_worker,
            ),
            daemon=True,
        )
        self.proc.start()
        assert self.conn.poll(120), "worker did not map the region"
        tag, self.created, self.pid = self.conn.recv()
        assert tag == "ready"

    def call(self, cmd: str, ids: Sequence[int] = (), rows: Sequence[np.ndarray] = ()) -> Any:
        self.conn.send((cmd, [int(i) for i in ids], list(rows)))
        assert self.conn.poll(60), f"worker did not answer {cmd}"
        return self.conn.recv()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("close")
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


class Scheduler:
    """The manager calls of vLLM's OffloadingConnectorScheduler, step by step, under its lock."""

    def __init__(self, manager: Any, worker: Worker) -> None:
        self.manager = manager
        self.worker = worker
        self._n = 0

    def request(self) -> ReqContext:
        self._n += 1
        ctx = ReqContext(req_id=f"req-{self._n}")
        with manager_lock(self.manager):
            self.manager.on_new_request(ctx)
        return ctx

    def end_step(self, new: Sequence[str] = ()) -> None:
        with manager_lock(self.manager):
            self.manager.on_schedule_end(ScheduleEndContext(tuple(new), ()))

    def settle(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with manager_lock(self.manager):
                if not self.manager.has_pending_work():
                    return
            self.end_step()
            assert time.monotonic() < deadline, "manager still has pending work"
            time.sleep(0.002)

    def store(self, keys: Sequence[bytes]) -> Any:
        """prepare_store -> the worker's copy into the chunks -> complete_store(set(keys_to_store))."""
        ctx = self.request()
        with manager_lock(self.manager):
            out = self.manager.prepare_store(list(keys), ctx)
        if out is not None and out.keys_to_store:
            ids = out.store_spec.block_ids
            self.worker.call("store", ids, [payload(k) for k in out.keys_to_store])
            with manager_lock(self.manager):
                self.manager.complete_store(set(out.keys_to_store), ctx)
        with manager_lock(self.manager):
            self.manager.on_request_finished(ctx)
        self.end_step([ctx.req_id])
        return out

    def lookup(self, keys: Sequence[bytes], timeout: float = 30.0) -> list[LookupResult]:
        """The prefix scan (stop at the first MISS, go on past pending), repeated each step until
        every key scanned is settled, as a deferred request is rescheduled."""
        ctx = self.request()
        deadline = time.monotonic() + timeout
        self.first: list[LookupResult] | None = None
        while True:
            answers: list[LookupResult] = []
            with manager_lock(self.manager):
                for key in keys:
                    answers.append(self.manager.lookup(key, ctx))
                    if answers[-1] is LookupResult.MISS:
                        break
            self.end_step([ctx.req_id])
            self.first = answers if self.first is None else self.first
            if all(a in SETTLED for a in answers):
                return answers
            assert time.monotonic() < deadline, f"lookups still pending: {answers}"
            time.sleep(0.002)

    def load(self, keys: Sequence[bytes]) -> list[np.ndarray]:
        """prepare_load -> the worker's copy out of the chunks -> complete_load(set(keys))."""
        ctx = self.request()
        with manager_lock(self.manager):
            spec = self.manager.prepare_load(list(keys), ctx)
        rows: list[np.ndarray] = self.worker.call("load", spec.block_ids)
        with manager_lock(self.manager):
            self.manager.complete_load(set(keys), ctx)
            self.manager.on_request_finished(ctx)
        self.end_step()
        return rows

    def reset(self) -> None:
        """vLLM's reset_cache with no job in flight: on_reset_flushed follows at once (0.33+)."""
        with manager_lock(self.manager):
            self.manager.reset_cache()
            if compat.HAS_RESET_FLUSHED:
                self.manager.on_reset_flushed()


def extra(kvtier: Mapping[str, Any] | str, chunks: int = 8, **more: Any) -> dict[str, Any]:
    return {**SPEC, "cpu_bytes_to_use": chunks * ROW_BYTES, "kvtier": kvtier, **more}


def fs_tier(root: Path, **more: Any) -> dict[str, Any]:
    return {"type": "fs", "root_dir": str(root), "max_bytes": "4MiB", **more}


@contextlib.contextmanager
def stack(
    kvtier: Mapping[str, Any],
    *,
    chunks: int = 8,
    events: bool = False,
    raw_extra: Mapping[str, Any] | None = None,
) -> Iterator[Scheduler]:
    """vLLM's factory builds the spec; a worker process maps the region; then the manager.

    ``raw_extra`` is a whole ``kv_connector_extra_config`` used as given (``kvtier`` is ignored).
    """
    cfg = offloading_config(dict(raw_extra) if raw_extra is not None else extra(kvtier, chunks))
    if events:
        import dataclasses

        cfg = dataclasses.replace(cfg, enable_kv_cache_events=True)
    spec = OffloadingSpecFactory.create_spec(cfg)
    worker = Worker(spec)
    manager = None
    try:
        manager = spec.get_manager()
        yield Scheduler(manager, worker)
        manager.shutdown()
        manager = None
        # kvtier released every view of the region, so vLLM could unmap it (it keeps a mapping
        # that still has exports, and says so).
        assert spec._scheduler_mmap.mmap_obj is None, "the scheduler-side mapping was kept"
    finally:
        if manager is not None:
            manager.shutdown()
        worker.close()
        for path in glob.glob(f"/dev/shm/vllm_offload_{cfg.engine_id}*"):
            with contextlib.suppress(OSError):
                os.unlink(path)


def test_an_unknown_vllm_is_refused_when_vllms_factory_builds_the_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compat, "VLLM_VERSION", "0.35.0")
    with pytest.raises(KvtierError) as err:
        OffloadingSpecFactory.create_spec(offloading_config(extra({})))
    assert "vLLM 0.35.0 is installed" in str(err.value) and "\n" not in str(err.value)


def test_vllms_factory_loads_the_spec_and_the_worker_side_stays_vllms(tmp_path: Path) -> None:
    spec = OffloadingSpecFactory.create_spec(
        offloading_config(extra({"secondary_tiers": [fs_tier(tmp_path)]}))
    )
    assert type(spec) is KvtierOffloadingSpec
    assert isinstance(spec, TieringOffloadingSpec)
    # Reuse, not a copy: the worker half is vLLM's own code, inherited unchanged.
    assert type(spec).get_worker is TieringOffloadingSpec.get_worker
    assert type(spec).create_worker is TieringOffloadingSpec.create_worker
    assert spec.num_chunks == 8 and spec.kv_bytes_per_chunk == ROW_BYTES
    assert spec.kvtier_config["block_bytes"] == ROW_BYTES
    assert spec.kvtier_config["cpu_bytes_to_use"] == 8 * ROW_BYTES


def test_blocks_written_by_the_worker_process_reach_fs_and_come_back_through_a_promotion(
    tmp_path: Path,
) -> None:
    keys = offload_keys(4, salt=b"roundtrip")
    with stack({"secondary_tiers": [fs_tier(tmp_path)]}) as s:
        assert s.worker.created, "the worker process must create the region, as vLLM's workers do"
        assert isinstance(s.manager, KvtierOffloadingManager)
        out = s.store(keys)
        assert list(out.keys_to_store) == keys
        assert s.lookup(keys) == [LookupResult.HIT] * 4
        s.settle()  # write-through: the engine's fs jobs read the chunks the worker wrote
        assert s.manager.engine.stats()["tiers"]["fs0"]["stores"] == 4
        assert len(list(tmp_path.rglob("*"))) > 0

        s.reset()  # the primary tier forgets everything; only fs holds the blocks now
        s.worker.call("wipe")  # and the chunks hold other bytes, so the load must really copy
        assert s.lookup(keys) == [LookupResult.HIT] * 4
        assert s.first == [LookupResult.HIT_PENDING] * 4  # promoted from fs, then readable
        rows = s.load(keys)
        for key, row in zip(keys, rows, strict=True):
            assert np.array_equal(row, payload(key)), "promoted bytes differ from what the worker stored"
        stats = s.manager.engine.stats()
        assert stats["promotions"] == 4 and stats["tiers"]["fs0"]["hits"] >= 4


def test_the_engines_eviction_policy_picks_the_victim_and_vllm_sees_it(tmp_path: Path) -> None:
    keys = offload_keys(5, salt=b"lru")
    with stack({"eviction_policy": "lru"}, chunks=4, events=True) as s:
        s.store(keys[:4])
        assert s.lookup(keys[:1]) == [LookupResult.HIT]  # keys[0] is now the most recent
        list(s.manager.take_events())
        out = s.store(keys[4:])
        assert list(out.keys_to_store) == [keys[4]]
        assert out.evicted_keys == [keys[1]]  # LRU: the oldest untouched block, not keys[0]
        events = list(s.manager.take_events())
        assert [(e.removed, e.keys) for e in events] == [(True, [keys[1]]), (False, [keys[4]])]
        assert s.lookup([keys[1]]) == [LookupResult.MISS]
        assert s.lookup([keys[0]]) == [LookupResult.HIT]


def test_a_policy_vllm_does_not_have_is_accepted(tmp_path: Path) -> None:
    # vLLM's own CachePolicyFactory knows lru and arc; kvtier's sieve/s3fifo run inside vLLM here.
    keys = offload_keys(3, salt=b"sieve")
    with stack({"eviction_policy": "s3fifo"}, chunks=2) as s:
        s.store(keys[:2])
        out = s.store(keys[2:])
        assert list(out.keys_to_store) == [keys[2]] and len(out.evicted_keys) == 1
        assert s.manager.engine.policy.__class__.__name__.lower().startswith("s3fifo")


def test_write_back_writes_to_fs_only_when_the_policy_evicts(tmp_path: Path) -> None:
    keys = offload_keys(3, salt=b"wb")
    with stack({"write_policy": "write_back", "secondary_tiers": [fs_tier(tmp_path)]}, chunks=2) as s:
        s.store(keys[:2])
        s.settle()
        assert s.manager.engine.stats()["tiers"]["fs0"].get("stores", 0) == 0
        out = s.store(keys[2:])  # evicts keys[0]: flushed to fs before its chunk is reused
        s.settle()
        if out is None:  # the victim's flush was still running: vLLM retries the store next step
            out = s.store(keys[2:])
            s.settle()
        assert list(out.keys_to_store) == [keys[2]]
        assert s.manager.engine.stats()["tiers"]["fs0"]["stores"] == 1
        s.reset()
        s.worker.call("wipe")
        assert s.lookup(keys[:1]) == [LookupResult.HIT]
        assert np.array_equal(s.load(keys[:1])[0], payload(keys[0]))


@pytest.mark.parametrize(("bandwidth", "answer"), [(1e3, LookupResult.MISS), (1e12, LookupResult.HIT)])
def test_the_cost_gate_decides_whether_vllm_loads_or_recomputes(
    tmp_path: Path, bandwidth: float, answer: LookupResult
) -> None:
    key = offload_keys(1, salt=b"cost")
    cost = {
        "prefill_seconds_per_token": 1e-4,
        "tiers": {"fs0": {"load_bandwidth": bandwidth, "load_latency": 0}},
    }
    with stack({"secondary_tiers": [fs_tier(tmp_path)], "cost_model": cost}) as s:
        s.store(key)
        s.settle()
        s.reset()
        assert s.lookup(key) == [answer]
        skipped = s.manager.engine.stats()["promotions_skipped_cost"]
        assert skipped == (1 if answer is LookupResult.MISS else 0)


def test_a_hit_stays_loadable_while_a_later_chunk_asks_for_a_promotion(tmp_path: Path) -> None:
    hit, in_fs = offload_keys(2, salt=b"pin")
    with stack({"secondary_tiers": [fs_tier(tmp_path)]}, chunks=1) as s:
        s.store([in_fs])
        s.settle()
        s.reset()  # in_fs is only in fs now
        s.store([hit])  # the one chunk holds hit
        s.settle()  # its write-through copy is done: the chunk is unpinned
        ctx = s.request()
        with manager_lock(s.manager):  # one step of the prefix scan, then the pin (scheduler.py 786, 1474)
            assert s.manager.lookup(hit, ctx) is LookupResult.HIT
            # Promoting in_fs would need hit's chunk: refused (no evictable slot), so vLLM recomputes.
            assert s.manager.lookup(in_fs, ctx) is LookupResult.MISS
            spec = s.manager.prepare_load([hit], ctx)
        assert np.array_equal(s.worker.call("load", spec.block_ids)[0], payload(hit))
        with manager_lock(s.manager):
            s.manager.complete_load({hit}, ctx)
            s.manager.on_request_finished(ctx)
        s.end_step([ctx.req_id])
        # Next step nothing is pinned any more: in_fs can be promoted into the chunk now.
        assert s.lookup([in_fs]) == [LookupResult.HIT], s.manager.engine.stats()


def test_blocks_promoted_for_a_waiting_request_stay_until_it_is_admitted(tmp_path: Path) -> None:
    """The missed-hit race (docs/vllm.md): a deferred request's promoted blocks are not evicted by
    another request's store before vLLM rescans and admits it, so each is loaded once and used."""
    first, second, other = offload_keys(3, salt=b"held")
    with stack({"secondary_tiers": [fs_tier(tmp_path)]}, chunks=2) as s:
        s.store([first, second])
        s.settle()
        s.reset()  # both only in fs now
        waiting = s.request()
        with manager_lock(s.manager):  # the prefix scan starts both promotions: the request is deferred
            assert [s.manager.lookup(k, waiting) for k in (first, second)] == [LookupResult.HIT_PENDING] * 2
        s.end_step()
        s.settle()  # both landed while the request waits for its next scan
        # Another request's store needs a slot: the waiting request's blocks are not the victims.
        out = s.store([other])
        assert out is None or not out.keys_to_store, out
        with manager_lock(s.manager):
            assert [s.manager.lookup(k, waiting) for k in (first, second)] == [LookupResult.HIT] * 2
            spec = s.manager.prepare_load([first, second], waiting)
        rows = s.worker.call("load", spec.block_ids)
        assert all(np.array_equal(r, payload(k)) for r, k in zip(rows, (first, second), strict=True))
        with manager_lock(s.manager):
            s.manager.complete_load({first, second}, waiting)
            s.manager.on_request_finished(waiting)
        s.end_step([waiting.req_id])
        assert s.manager.engine.stats()["promotions"] == 2, s.manager.engine.stats()
        # Admitted and done: its blocks are evictable again, so the other request's store fits now.
        out = s.store([other])
        assert out is not None and list(out.keys_to_store) == [other]


def test_reset_keeps_chunks_of_transfers_in_flight_until_the_workers_are_done(tmp_path: Path) -> None:
    keys = offload_keys(2, salt=b"fence")
    with stack({}, chunks=2) as s:
        ctx = s.request()
        with manager_lock(s.manager):
            out = s.manager.prepare_store(keys, ctx)
            s.manager.reset_cache()  # vLLM drops the job; its worker may still be copying
            assert s.manager.prepare_store(offload_keys(1, salt=b"other"), ctx) is None
            s.manager.on_reset_flushed()
            again = s.manager.prepare_store(offload_keys(1, salt=b"other"), ctx)
        assert len(out.keys_to_store) == 2 and again is not None and len(again.keys_to_store) == 1


def test_on_vllm_032_a_later_completed_transfer_releases_the_chunks_fenced_at_a_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM 0.32 never calls on_reset_flushed: its workers wait for the dropped jobs at the start of
    # the next step, so a transfer prepared after the reset completing proves they are done.
    monkeypatch.setattr(compat, "HAS_RESET_FLUSHED", False)
    keys = offload_keys(2, salt=b"fence32")
    with stack({}, chunks=3) as s:
        ctx = s.request()
        with manager_lock(s.manager):
            out = s.manager.prepare_store(keys, ctx)
            s.manager.reset_cache()  # both chunks stay reserved: a worker may still copy into them
            first = s.manager.prepare_store(offload_keys(1, salt=b"after"), ctx)
            assert first is not None and len(first.keys_to_store) == 1
            assert s.manager.prepare_store(offload_keys(2, salt=b"more"), ctx) is None
            s.manager.complete_store(set(first.keys_to_store), ctx)  # a post-reset job completed
            more = s.manager.prepare_store(offload_keys(2, salt=b"more"), ctx)
        assert len(out.keys_to_store) == 2
        assert more is not None and len(more.keys_to_store) == 2


@pytest.mark.parametrize(
    ("more", "key"),
    [
        ({"eviction_policy": "arc"}, "eviction_policy"),
        ({"secondary_tiers": []}, "secondary_tiers"),
        ({"kvtier": {"block_bytes": 4096}}, "kvtier.block_bytes"),
        ({"kvtier": {"cpu_bytes_to_use": 4096}}, "kvtier.cpu_bytes_to_use"),
        ({"kvtier": {"eviction_policy": "nope"}}, "eviction_policy"),
        ({"kvtier": 7}, "kvtier"),
    ],
)
def test_a_bad_config_fails_in_vllms_factory_with_a_one_line_error(more: dict[str, Any], key: str) -> None:
    cfg = offloading_config({**extra({}), **more})
    with pytest.raises(KvtierError) as err:  # ConfigError; an unknown policy: UnknownPluginError
        OffloadingSpecFactory.create_spec(cfg)
    assert key in str(err.value) and "\n" not in str(err.value)


def test_a_kvtier_config_file_path_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "kvtier.json"
    path.write_text('{"eviction_policy": "sieve", "write_policy": "write_back"}', encoding="utf-8")
    spec = OffloadingSpecFactory.create_spec(offloading_config(extra(str(path))))
    assert spec.kvtier_config["eviction_policy"] == "sieve"


def test_a_layout_change_changes_the_namespace() -> None:
    a = OffloadingSpecFactory.create_spec(offloading_config(extra({})))
    b = OffloadingSpecFactory.create_spec(offloading_config(extra({}), tokens_per_block=32))
    c = OffloadingSpecFactory.create_spec(offloading_config(extra({})))
    assert a.kvtier_config["model"] != b.kvtier_config["model"]
    assert a.kvtier_config["model"] == c.kvtier_config["model"]  # engine id is not in it


def _check(raw: Mapping[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from kvtier.cli.main import main

    code = main(["check", json.dumps(raw)])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_kvtier_check_validates_the_spec_forms_kvtier_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kvtier check`` on the spec form reads the ``kvtier`` block itself: its tiers are
    round-tripped, and a typo in it or a key vLLM decides fails naming the key."""
    good = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": extra({"eviction_policy": "sieve",
                                                "secondary_tiers": [fs_tier(tmp_path / "kv")]},
                                               chunks=512)}  # fmt: skip
    # block_bytes is vLLM's chunk at run time; check probes with kvtier's default block size.
    code, out = _check(good, capsys)
    assert code == 0, out
    assert "fs0" in out and "sieve" in out
    for block, key in (
        ({"evicton_policy": "lru"}, "evicton_policy"),
        ({"block_bytes": 4096}, "kvtier.block_bytes"),
        ({"secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path / "x"), "thraeds": 2}]}, "thraeds"),
    ):
        bad = {**good, "kv_connector_extra_config": extra(block, chunks=512)}
        code, out = _check(bad, capsys)
        assert code != 0 and key in out, (block, out)
    assert not (tmp_path / "x").exists()  # nothing written before the whole config validated


DOC = Path(__file__).resolve().parents[2] / "docs" / "vllm.md"
_DOC_SECTION = "## kvtier's whole engine as vLLM's offloading spec"


def _doc_config() -> dict[str, Any]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(_DOC_SECTION) :]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    found = re.findall(r"--kv-transfer-config '(\{.*\})'$", section, re.MULTILINE)
    assert len(found) == 1, "the spec section shows one vllm serve config"
    raw: dict[str, Any] = json.loads(found[0])
    return raw


def test_the_documented_config_runs_as_written(tmp_path: Path) -> None:
    raw = _doc_config()
    assert raw["kv_connector"] == "OffloadingConnector"
    doc_extra = raw["kv_connector_extra_config"]
    assert doc_extra["spec_module_path"] == "kvtier.integrations.vllm"
    # Swapped only: a temporary root, a capacity this file system holds, two chunks of /dev/shm.
    local = json.loads(json.dumps(doc_extra))
    local["cpu_bytes_to_use"] = 2 * ROW_BYTES
    for tier in local["kvtier"]["secondary_tiers"]:
        tier["root_dir"], tier["max_bytes"] = str(tmp_path), "4MiB"
    keys = offload_keys(3, salt=b"doc")
    with stack({}, raw_extra=local) as s:
        assert s.manager.engine.config.write_policy == "write_back"
        s.store(keys[:2])
        s.settle()
        out = s.store(keys[2:])  # evicts one block: the write-back flush to fs
        s.settle()
        if out is None:  # the victim's flush was still running: vLLM retries next step
            out = s.store(keys[2:])
            s.settle()
        assert list(out.keys_to_store) == [keys[2]]
        assert s.manager.engine.stats()["tiers"]["fs0"]["stores"] == 1
        s.reset()
        s.worker.call("wipe")
        # Only the policy's victim went to fs (write-back): it comes back by promotion, the other not.
        answers = {k: s.lookup([k]) for k in keys[:2]}
        (victim,) = [k for k, a in answers.items() if a == [LookupResult.HIT]]
        assert sorted(a[0].name for a in answers.values()) == ["HIT", "MISS"]
        assert np.array_equal(s.load([victim])[0], payload(victim))


# -- vLLM's kv_hints: kvtier's pin action (kvtier.integrations.vllm.hints) ------------------------
def _pin_request(s: Scheduler, req_id: str, action: Mapping[str, Any]) -> ReqContext:
    """A request carrying vLLM's own KvHintsEnvelope, as ``_create_req_context`` builds it."""
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

    hints = KvHintsEnvelope(protocol_version="0.1", message_id=f"msg-{req_id}", actions=[
        KvHintAction(action_id="route", action_type="kv.fetch", action_version="1.0", payload={}),
        KvHintAction(**action),
    ])  # fmt: skip
    ctx = ReqContext(req_id=req_id, kv_hints=hints)
    with manager_lock(s.manager):
        s.manager.on_new_request(ctx)
    return ctx


def _pin_action(ttl: Any, version: str = "1.0") -> dict[str, Any]:
    return {
        "action_id": "keep", "action_type": "kvtier.pin", "action_version": version, "payload": {"ttl_s": ttl}
    }  # fmt: skip


def _store_as(s: Scheduler, ctx: ReqContext, keys: Sequence[bytes]) -> None:
    with manager_lock(s.manager):
        out = s.manager.prepare_store(list(keys), ctx)
    assert out is not None and list(out.keys_to_store) == list(keys)
    s.worker.call("store", out.store_spec.block_ids, [payload(k) for k in out.keys_to_store])
    with manager_lock(s.manager):
        s.manager.complete_store(set(out.keys_to_store), ctx)
        s.manager.on_request_finished(ctx)
    s.end_step([ctx.req_id])


def _resident(s: Scheduler, keys: Sequence[bytes]) -> list[bool]:
    """Whether each key is a HIT, asked by a request that then finishes (so it holds nothing)."""
    ctx = s.request()
    with manager_lock(s.manager):
        found = [s.manager.lookup(k, ctx) is LookupResult.HIT for k in keys]
        s.manager.on_request_finished(ctx)
    s.end_step([ctx.req_id])
    return found


@pytest.mark.parametrize("policy", ["prefix", "lru"])
def test_a_kv_hints_pin_keeps_the_requests_blocks_until_its_ttl_runs_out(policy: str) -> None:
    ttl = 1.0
    pinned = offload_keys(2, salt=b"pinned-" + policy.encode())
    flood = offload_keys(6, salt=b"flood-" + policy.encode())
    with stack({"eviction_policy": policy, "pin_share": 0.5}, chunks=4) as s:
        ctx = _pin_request(s, "pinned", _pin_action(ttl))
        started = time.monotonic()
        _store_as(s, ctx, pinned)
        for i in range(0, 6, 2):  # every other block goes through the two unpinned chunks
            out = s.store(flood[i : i + 2])
            assert out is not None and list(out.keys_to_store) == flood[i : i + 2]
        assert time.monotonic() - started < ttl, "too slow a machine for this TTL"
        assert _resident(s, pinned) == [True, True]
        assert _resident(s, flood[:4]) == [False] * 4
        assert s.manager.engine.stats()["primary"]["timed_pins"] == 2
        time.sleep(max(0.0, started + ttl + 0.05 - time.monotonic()))
        # The pins have run out: a store needing every chunk gets all four (with the pins held it
        # would get two and vLLM would be told the rest did not fit).
        after = offload_keys(4, salt=b"after-" + policy.encode())
        out = s.store(after)
        assert out is not None and list(out.keys_to_store) == after
        assert s.manager.engine.stats()["primary"]["timed_pins"] == 0
        assert _resident(s, pinned) == [False, False]


def test_a_kv_hints_pin_keeps_the_blocks_a_request_hits_and_is_bounded_by_pin_share() -> None:
    keys = offload_keys(4, salt=b"hit-pin")
    with stack({"eviction_policy": "prefix", "pin_share": 0.25}, chunks=4) as s:
        s.store(keys)  # stored by a request with no hint: nothing pinned
        assert s.manager.engine.stats()["primary"]["timed_pins"] == 0
        ctx = _pin_request(s, "reader", _pin_action(60))
        with manager_lock(s.manager):
            assert [s.manager.lookup(k, ctx) for k in keys[:2]] == [LookupResult.HIT] * 2
            s.manager.on_request_finished(ctx)
        s.end_step([ctx.req_id])
        stats = s.manager.engine.stats()["primary"]
        # pin_share 0.25 of 4 chunks: one block holds a pin, the second is refused, not queued.
        assert (stats["timed_pins"], stats["timed_pins_refused"]) == (1, 1)
        s.store(offload_keys(4, salt=b"flood-hit"))  # three chunks turn over; the pinned one stays
        assert _resident(s, keys[:1]) == [True]
        s.reset()  # vLLM's reset_cache: every block is stale, pinned ones too
        assert _resident(s, keys[:1]) == [False]


@pytest.mark.parametrize(
    ("action", "field"),
    [
        (_pin_action(float("inf")), "kv_hints.actions[1].payload.ttl_s"),
        (_pin_action(-1), "kv_hints.actions[1].payload.ttl_s"),
        (_pin_action(7200), "kv_hints.actions[1].payload.ttl_s"),
        (_pin_action("60"), "kv_hints.actions[1].payload.ttl_s"),
        (_pin_action(60, version="2.0"), "kv_hints.actions[1].action_version"),
    ],
    ids=["inf", "negative", "over-max", "string", "version"],
)
def test_a_malformed_pin_hint_is_logged_in_one_line_and_the_request_runs_unpinned(
    action: dict[str, Any], field: str, caplog: pytest.LogCaptureFixture
) -> None:
    from kvtier.integrations.vllm.logonce import reset_log_once

    reset_log_once()
    keys = offload_keys(2, salt=field.encode())
    with stack({"eviction_policy": "prefix", "pin_max_ttl_s": 3600}, chunks=2) as s:
        with caplog.at_level("WARNING", logger="kvtier.integrations.vllm"):
            ctx = _pin_request(s, "bad", action)
        _store_as(s, ctx, keys)
        assert s.manager.bad_hints == 1
        assert s.manager.engine.stats()["primary"]["timed_pins"] == 0
        (line,) = [r.getMessage() for r in caplog.records if "kv_hints" in r.getMessage()]
        assert field in line and "\n" not in line
        s.store(offload_keys(2, salt=b"after-bad"))  # nothing pinned: both chunks turn over
        assert _resident(s, keys) == [False, False]


# -- the vLLM 0.33 facts the design depends on ----------------------------------------------------
def test_contract_workers_build_their_kv_caches_before_the_scheduler_exists() -> None:
    from vllm.v1.engine.core import EngineCore

    src = inspect.getsource(EngineCore.__init__)
    assert src.index("self._initialize_kv_caches(") < src.index(
        "self.scheduler: SchedulerInterface = Scheduler("
    )


def test_contract_the_region_is_shared_by_name_and_the_scheduler_maps_all_of_it() -> None:
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

    assert 'f"/dev/shm/vllm_offload_{engine_id}.mmap"' in inspect.getsource(SharedOffloadRegion.__init__)
    assert "FileExistsError" in inspect.getsource(SharedOffloadRegion.__init__)
    assert "def create_kv_memoryview" in inspect.getsource(SharedOffloadRegion)
    worker = inspect.getsource(TieringOffloadingSpec.create_worker)
    # No barrier: the path stays linked after the workers map it, so the scheduler can open it.
    assert "SharedOffloadRegion(" in worker and "barrier" not in worker
    assert "rank=None" in inspect.getsource(TieringOffloadingSpec.get_manager)


def test_contract_the_scheduler_completes_transfers_by_key_set_and_never_touches() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler

    src = inspect.getsource(scheduler.OffloadingConnectorScheduler)
    line = compat.parse_version(compat.VLLM_VERSION)
    if line is not None and line >= (0, 34):
        # 0.34: the job's keys are an ordered, de-duplicated tuple of the same keys (the manager
        # books handles by frozenset, so either form finds them); a failed store says so.
        assert "keys=tuple(dict.fromkeys(store_output.keys_to_store))" in src
        assert "keys=tuple(dict.fromkeys(keys_to_load))" in src
        assert "ordered_keys_to_store = tuple(dict.fromkeys(store_output.keys_to_store))" in src
        assert re.search(r"self\.manager\.complete_store\(\s*job_status\.keys,", src)
        assert "success=not job_status.failed" in src
    else:
        assert "keys=set(store_output.keys_to_store)" in src
        assert "keys=set(keys_to_load)" in src
        assert "self.manager.complete_store(job_status.keys, req_status.req_context)" in src
    assert "self.manager.complete_load(job_status.keys, req_status.req_context)" in src
    assert "self.manager.touch(" not in src


def test_contract_vllm_carries_kv_hints_to_the_offloading_manager() -> None:
    """The pin hint's path: the request's envelope -> ReqContext.kv_hints -> on_new_request, and
    the same context object on complete_store (scheduler.py ``_create_req_context``)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

    assert [f for f in KvHintsEnvelope.__struct_fields__] == ["protocol_version", "message_id", "actions"]
    assert "payload" in KvHintAction.__struct_fields__
    src = inspect.getsource(scheduler._create_req_context)
    assert "kv_hints=req.kv_hints" in src
    # 0.32/0.33 on one line, 0.34 with success= on the lines after.
    calls = re.sub(r"\s+", "", inspect.getsource(scheduler))
    assert "complete_store(job_status.keys,req_status.req_context" in calls


def test_contract_vllms_cpu_worker_needs_a_gpu() -> None:
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    assert "is_cuda_alike() or current_platform.is_xpu()" in inspect.getsource(CPUOffloadingSpec.get_worker)
