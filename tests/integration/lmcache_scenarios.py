"""LMCache-side scenarios, run by tests/integration/test_lmcache.py with the LMCache venv's python.

Usage: ``python lmcache_scenarios.py SCENARIO L2_ADAPTER_JSON [ARGS...]``; prints one JSON line.

``manager_*`` scenarios run LMCache 0.5.6's own multi-process storage stack on CPU: the config comes
from LMCache's argument parser (``--l1-size-gb ... --l2-adapter '<JSON>'``), ``StorageManager``
builds the adapter through its plug-in factory, and its store and prefetch controllers drive it
(L1 write -> L2 store; L1 delete; prefetch -> L2 lookup-and-lock, load, unlock). ``adapter_*``
scenarios build the adapter with LMCache's plug-in factory from the same JSON and make the calls
those controllers make, to observe what the controllers hide (eventfds, task results, locks).
Nothing of LMCache is faked; no vLLM runs (the KV objects are written by the script).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import sys
import time
from typing import Any

import torch
from lmcache.v1.distributed.api import GroupedObjectKeys, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec
from lmcache.v1.distributed.config import parse_args
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
from lmcache.v1.distributed.storage_manager import StorageManager

LAYOUT = MemoryLayoutDesc(shapes=[torch.Size([2, 16, 8, 64])], dtypes=[torch.float16])  # 32 KiB objects
MODEL = "Qwen/Qwen3-0.6B"


def keys_for(seed: int, n: int, salt: str = "") -> list[ObjectKey]:
    return [
        ObjectKey(
            chunk_hash=hashlib.sha256(f"{seed}/{i}".encode()).digest(),
            model_name=MODEL,
            kv_rank=0,
            cache_salt=salt,
        )
        for i in range(n)
    ]


def fill(objs: list[Any], seed: int) -> str:
    """Seeded random bytes into each object; the digest of all of them."""
    g = torch.Generator().manual_seed(seed)
    h = hashlib.sha256()
    for o in objs:
        buf = torch.frombuffer(o.byte_array, dtype=torch.uint8)
        buf[:] = torch.randint(0, 256, (buf.numel(),), dtype=torch.uint8, generator=g)
        h.update(bytes(o.byte_array))
    return h.hexdigest()


# -- through LMCache's StorageManager --------------------------------------------------------------
def manager(raw: str) -> StorageManager:
    """LMCache's storage stack for ``--l2-adapter RAW``; a JSON list is the argument list of a whole
    ``lmcache server`` command line (from the docs), parsed by that command's own parser."""
    if raw.startswith("["):
        import argparse

        from lmcache.cli.commands.server import ServerCommand
        from lmcache.v1.distributed.config import parse_args_to_config

        parser = argparse.ArgumentParser()
        ServerCommand().add_arguments(parser)
        return StorageManager(parse_args_to_config(parser.parse_args(json.loads(raw))))
    cfg = parse_args(["--l1-size-gb", "0.0625", "--eviction-policy", "LRU", "--l2-adapter", raw])
    return StorageManager(cfg)


def wait_l2_stored(sm: StorageManager, n: int, timeout: float = 20) -> int:
    """Wait until the adapter reports ``n`` stored keys (LMCache's store controller runs async)."""
    end = time.monotonic() + timeout
    got = 0
    while time.monotonic() < end:
        (_desc, adapter), *_ = sm.l2_adapters()
        got = int(adapter.report_status().get("stored_keys", 0))
        if got >= n:
            break
        time.sleep(0.02)
    return got


def prefetch(sm: StorageManager, keys: list[ObjectKey], timeout: float = 20) -> tuple[list[int], str | None]:
    """LMCache's prefetch of ``keys``: the hit bits and the digest of what L1 then holds."""
    spec = PrefetchTaskSpec(key_groups=[GroupedObjectKeys(keys=keys, object_group_id=0, layout_desc=LAYOUT)])
    handle = sm.submit_prefetch_task(spec)
    end = time.monotonic() + timeout
    res = None
    while res is None and time.monotonic() < end:
        res = sm.query_prefetch_status(handle)
        time.sleep(0.01)
    if res is None:
        return [], None
    bits = [int(res.hit_cells[0].test(i)) for i in range(len(keys))]
    n = sum(bits)
    digest = None
    if n:
        got = keys[:n]
        with sm.read_prefetched_results(got) as objs:  # releases the read locks on exit
            if objs is not None:
                digest = hashlib.sha256(b"".join(bytes(o.byte_array) for o in objs)).hexdigest()
    return bits, digest


def manager_round_trip(raw: str) -> dict[str, Any]:
    """Write 4 objects to L1, LMCache stores them to L2 (kvtier), L1 drops them, a prefetch loads
    them back from L2: byte-exact."""
    sm = manager(raw)
    keys = keys_for(1, 4)
    objs = sm.reserve_write(keys, LAYOUT)
    want = fill([objs[k] for k in keys], 1)
    sm.finish_write(keys)
    stored = wait_l2_stored(sm, 4)
    deleted, _skipped = sm.delete_l1_keys(keys, force=True)
    bits, digest = prefetch(sm, [*keys, *keys_for(2, 1)])
    (_d, adapter), *_ = sm.l2_adapters()
    usage = adapter.get_usage()
    status = adapter.report_status()
    sm.close()
    return {
        "stored": stored, "deleted": deleted, "bits": bits, "exact": digest == want,
        "usage_bytes": usage.total_bytes_used, "locked": status["locked_keys"],
        "tiers": sorted(status["tiers"]),
    }  # fmt: skip


def manager_writer(raw: str, seed: str) -> dict[str, Any]:
    sm = manager(raw)
    keys = keys_for(int(seed), 3)
    objs = sm.reserve_write(keys, LAYOUT)
    want = fill([objs[k] for k in keys], int(seed))
    sm.finish_write(keys)
    stored = wait_l2_stored(sm, 3)
    sm.close()
    return {"stored": stored, "digest": want}


def manager_reader(raw: str, seed: str, salt: str = "") -> dict[str, Any]:
    sm = manager(raw)
    bits, digest = prefetch(sm, keys_for(int(seed), 3, salt))
    sm.close()
    return {"bits": bits, "digest": digest}


# -- the adapter, built by LMCache's factory, called as the controllers call it --------------------
def adapter(raw: str) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    add_l2_adapters_args(parser)
    cfg = parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", raw]))
    return create_l2_adapter(cfg.adapters[0])


def objects(n: int, seed: int) -> tuple[list[Any], str]:
    """Objects outside any L1 arena (plain tensors): the adapter stages them (one copy)."""
    from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

    objs = []
    for _ in range(n):
        t = torch.zeros(32 * 1024, dtype=torch.uint8)
        meta = MemoryObjMetadata(shape=t.shape, dtype=torch.uint8, address=0, phy_size=t.numel(), ref_count=1)
        objs.append(TensorMemoryObj(raw_data=t, metadata=meta, parent_allocator=None))
    return objs, fill(objs, seed)


def wait_fd(fd: int, timeout: float) -> int:
    """Eventfd count after waiting up to ``timeout`` for it to become readable (0: not signalled)."""
    r, _w, _x = select.select([fd], [], [], timeout)
    return os.eventfd_read(fd) if r else 0


def store_and_wait(a: Any, keys: list[ObjectKey], objs: list[Any], timeout: float = 20) -> Any:
    """Submit one store task and wait for its result on the store eventfd (``None``: none came)."""
    t = a.submit_store_task(keys, objs)
    res: dict[int, Any] = {}
    end = time.monotonic() + timeout
    while t not in res and time.monotonic() < end:
        wait_fd(a.get_store_event_fd(), 1)
        res.update(a.pop_completed_store_tasks())
    return res.get(t)


def adapter_tasks(raw: str) -> dict[str, Any]:
    """Exactly-once completion, one eventfd signal per task, lock counts, bitmaps, usage."""
    a = adapter(raw)
    fds = [a.get_store_event_fd(), a.get_lookup_and_lock_event_fd(), a.get_load_event_fd()]
    keys = keys_for(5, 4)
    objs, want = objects(4, 5)
    t1 = a.submit_store_task(keys[:2], objs[:2])
    t2 = a.submit_store_task(keys[2:], objs[2:])
    signals = 0
    results: dict[int, Any] = {}
    end = time.monotonic() + 20
    while len(results) < 2 and time.monotonic() < end:
        signals += wait_fd(fds[0], 1)
        results.update(a.pop_completed_store_tasks())
    again = a.pop_completed_store_tasks()
    usage_after_store = a.get_usage().total_bytes_used
    # lookup-and-lock: 2 known keys, 1 unknown
    probe = [keys[0], keys_for(9, 1)[0], keys[3]]
    lt = a.submit_lookup_and_lock_task(probe, {0: LAYOUT})
    lookup_signals = wait_fd(fds[1], 10)
    bitmap = a.query_lookup_and_lock_result(lt)
    lookup_again = a.query_lookup_and_lock_result(lt)
    locks = [a.locked_count(k) for k in probe]
    # load into fresh objects: 4 keys + 1 unknown
    dst, _ = objects(5, 99)
    load_keys = [*keys, keys_for(9, 1)[0]]
    ld = a.submit_load_task(load_keys, dst)
    load_signals = wait_fd(fds[2], 20)
    lbits = a.query_load_result(ld)
    got = hashlib.sha256(b"".join(bytes(o.byte_array) for o in dst[:4])).hexdigest()
    a.submit_unlock(probe)
    locks_after = [a.locked_count(k) for k in probe]
    out = {
        "task_ids": [t1, t2],
        "results": {str(k): [v.is_successful(), v.bytes_transferred()] for k, v in results.items()},
        "store_signals": signals, "popped_again": len(again), "usage": usage_after_store,
        "lookup_bits": [int(bitmap.test(i)) for i in range(3)] if bitmap is not None else None,
        "lookup_signals": lookup_signals, "lookup_again": lookup_again is not None, "locks": locks,
        "locks_after_unlock": locks_after, "load_signals": load_signals,
        "load_bits": [int(lbits.test(i)) for i in range(5)] if lbits is not None else None,
        "exact": got == want, "distinct_fds": len(set(fds)) == 3,
    }  # fmt: skip
    a.close()
    return out


def adapter_down(raw: str) -> dict[str, Any]:
    """The tier's server is gone: store fails, lookup and load answer zero bits, in time."""
    a = adapter(raw)
    t0 = time.monotonic()
    keys = keys_for(7, 2)
    objs, _ = objects(2, 7)
    stored = store_and_wait(a, keys, objs)
    lt = a.submit_lookup_and_lock_task(keys, {0: LAYOUT})
    wait_fd(a.get_lookup_and_lock_event_fd(), 20)
    bm = a.query_lookup_and_lock_result(lt)
    ld = a.submit_load_task(keys, objs)
    wait_fd(a.get_load_event_fd(), 20)
    lb = a.query_load_result(ld)
    out = {
        "store_ok": stored.is_successful() if stored is not None else None,
        "lookup_bits": [int(bm.test(i)) for i in range(2)] if bm is not None else None,
        "load_bits": [int(lb.test(i)) for i in range(2)] if lb is not None else None,
        "seconds": time.monotonic() - t0,
    }
    a.close()
    return out


def mixed_salts(raw: str) -> dict[str, Any]:
    """One task whose keys carry two cache salts: each key is stored under its own salt (the same
    hash under the other salt misses), and loads byte-exact."""
    a = adapter(raw)
    plain, salted = keys_for(41, 2), keys_for(41, 2, "user7")
    keys = [plain[0], salted[1]]
    objs, want = objects(2, 41)
    stored = store_and_wait(a, keys, objs)
    probe = [salted[0], plain[1], plain[0], salted[1]]  # the stored hashes under the other salt first
    lt = a.submit_lookup_and_lock_task(probe, {0: LAYOUT})
    wait_fd(a.get_lookup_and_lock_event_fd(), 20)
    bm = a.query_lookup_and_lock_result(lt)
    a.submit_unlock(probe)
    dst, _ = objects(2, 99)
    ld = a.submit_load_task(keys, dst)
    wait_fd(a.get_load_event_fd(), 20)
    lb = a.query_load_result(ld)
    got = hashlib.sha256(b"".join(bytes(o.byte_array) for o in dst)).hexdigest()
    both = plain + salted
    out = {
        "store_ok": stored.is_successful() if stored is not None else None,
        "lookup_bits": [int(bm.test(i)) for i in range(4)] if bm is not None else None,
        "load_bits": [int(lb.test(i)) for i in range(2)] if lb is not None else None,
        "exact": got == want,
        "batch_is_single": a._block_keys(both) == [a._block_key(k, 0) for k in both]
        and a._block_keys(plain) == [a._block_key(k, 0) for k in plain],
    }
    a.close()
    return out


SCENARIOS = {
    f.__name__: f
    for f in (manager_round_trip, manager_writer, manager_reader, adapter_tasks, adapter_down, mixed_salts)
}

if __name__ == "__main__":
    name, raw, *rest = sys.argv[1:]
    print(json.dumps(SCENARIOS[name](raw, *[r for r in rest if r])), flush=True)  # type: ignore[operator]
