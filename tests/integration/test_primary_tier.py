"""Primary tier: buffer backings, zero-copy view, slot states, pins, eviction through the policy.

The shared-memory tests start real Python processes (``subprocess``) that map the same segment by
name; one is killed with SIGKILL to leave a stale segment behind. Linux ``/dev/shm`` is required
(skipped elsewhere). The ``torch`` backing uses a plain CPU tensor here: no GPU on this host, so the
pinned-memory branch (taken only when ``torch.cuda.is_available()``) is not exercised.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from needs import need_module

from kvtier.engine import Engine
from kvtier.errors import ConfigError, MisuseError
from kvtier.keys import BlockKey
from kvtier.policies.lru import LRUPolicy
from kvtier.primary import PrimaryTier, SlotState
from kvtier.transfer.buffers import SHM_DIR, ShmBuffer, aligned_empty

needs_shm = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs Linux /dev/shm")


def K(i: int) -> BlockKey:
    return BlockKey(b"k%07d" % i)


def tier(n: int = 4, backing: str = "heap", block: int = 5000, **kw: object) -> PrimaryTier:
    return PrimaryTier(n, block, LRUPolicy(n), backing=backing, **kw)  # type: ignore[arg-type]


def test_heap_view_is_2d_zero_copy_and_page_aligned() -> None:
    p = tier(3, block=5000)
    v = p.primary_kv_view
    assert v.ndim == 2 and v.shape == (3, 8192) and v.format == "B" and not v.readonly
    assert v.strides == (8192, 1)
    assert p.rows.ctypes.data % 4096 == 0
    p.rows[1, 7] = 42
    assert v[1, 7] == 42  # same memory
    assert np.asarray(v).ctypes.data == p.rows.ctypes.data
    assert aligned_empty(10, 4096).ctypes.data % 4096 == 0


def test_none_backing_is_metadata_only() -> None:
    p = tier(5, backing="none")
    assert p.primary_kv_view.shape == (5, 0)
    assert p.rows.nbytes == 0
    assert p.config_info()["bytes"] == 0


def test_torch_backing_is_a_cpu_tensor_without_gpu() -> None:
    torch = need_module("torch", "torch")
    p = tier(2, backing="torch")
    t = p._buffer.tensor  # type: ignore[attr-defined]
    assert isinstance(t, torch.Tensor) and t.shape == (2, 8192) and t.dtype == torch.uint8
    assert t.is_pinned() is torch.cuda.is_available()  # no GPU here: plain CPU memory
    t[1, 3] = 9
    assert p.primary_kv_view[1, 3] == 9


def test_bad_arguments_raise_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="primary_backing"):
        tier(2, backing="disk")
    with pytest.raises(ConfigError, match="cpu_bytes_to_use"):
        PrimaryTier(0, 10, LRUPolicy(1))
    with pytest.raises(MisuseError, match="capacity"):
        PrimaryTier(2, 10, LRUPolicy(3))
    with pytest.raises(ConfigError, match="shm_name"):
        tier(2, backing="shm", shm_name="../etc/passwd")


def test_states_writing_ready_pinned_free() -> None:
    p = tier(2, backing="none")
    pos, slots, evicted, _fk, _fs, dropped = p.reserve([K(1), K(2)])
    assert pos == [0, 1] and sorted(slots) == [0, 1] and dropped == 0
    assert all(p.states[s] == SlotState.WRITING for s in slots)
    assert len(p.policy) == 0  # WRITING blocks are not evictable
    assert p.reserve([K(3)])[5] == 1  # everything WRITING: dropped
    p.commit([K(1), K(2)], slots)
    assert all(p.states[s] == SlotState.READY for s in slots)
    p.pin([slots[0]])
    p.pin([slots[0]])
    assert p.pinned_keys == {K(1)}
    pos, s3, evicted, *_ = p.reserve([K(3)])
    assert evicted == [K(2)]  # K(1) is pinned
    p.commit([K(3)], s3)
    assert p.reserve([K(4)])[5] == 0  # K(3) evicted
    p.unpin([slots[0]])
    assert p.pinned_keys == {K(1)}
    p.unpin([slots[0]])
    assert p.pinned_keys == frozenset()
    with pytest.raises(MisuseError):
        p.unpin([slots[0]])
    with pytest.raises(MisuseError):
        p.commit([K(1)], [slots[0]])  # not WRITING


def test_flush_dirty_victims_stay_readable_until_unpinned() -> None:
    p = tier(1, backing="none")
    _, s, *_ = p.reserve([K(1)])
    p.commit([K(1)], s)
    _, _s2, evicted, fk, fs, dropped = p.reserve([K(2)], flush_dirty=True)
    assert evicted == [] and fk == [K(1)] and dropped == 1
    assert p.states[fs[0]] == SlotState.FLUSHING and p.readable(fs[0])
    p.pin(fs)
    assert p.unpin(fs) == [K(1)]
    assert p.num_free == 1 and K(1) not in p.index


def test_drop_unpinned_keeps_pinned_and_writing() -> None:
    p = tier(3, backing="none")
    _, s, *_ = p.reserve([K(1), K(2)])
    p.commit([K(1), K(2)], s)
    p.reserve([K(3)])
    p.pin([s[0]])
    assert p.drop_unpinned() == [K(2)]
    assert set(p.index) == {K(1), K(3)}
    assert p.counts()["pinned"] == 1 and p.counts()["writing"] == 1


# -- shared memory -------------------------------------------------------------------------------
CHILD = textwrap.dedent(
    """
    import sys, time
    from kvtier.transfer.buffers import ShmBuffer
    name, mode = sys.argv[1], sys.argv[2]
    buf = ShmBuffer(name, 4, 4096)
    print("created" if buf.created else "attached", flush=True)
    if mode == "write":
        buf.rows[2, :5] = [1, 2, 3, 4, 5]
        buf.close()
    elif mode == "read":
        print(list(buf.rows[2, :5]), flush=True)
        buf.close()
    elif mode == "hang":
        buf.rows[0, 0] = 77
        print("ready", flush=True)
        time.sleep(60)
    """
)


def child(name: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, name, mode], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )


@pytest.fixture
def name() -> Iterator[str]:
    """A unique segment name; the 0-byte init-lock file kvtier leaves behind is removed after."""
    n = f"kvtier-test-{uuid.uuid4().hex[:8]}"
    yield n
    for f in shm_files(n):
        os.unlink(os.path.join(SHM_DIR, f))


def shm_files(name: str) -> list[str]:
    return sorted(f for f in os.listdir(SHM_DIR) if f.startswith(name))


@needs_shm
def test_two_processes_map_one_shared_memory_primary_tier(name: str) -> None:
    with Engine(
        {"cpu_bytes_to_use": 4 * 4096, "block_bytes": 4096, "primary_backing": "shm", "shm_name": name}
    ) as e:
        assert e.primary._buffer.created  # type: ignore[attr-defined]
        mode = stat.S_IMODE(os.stat(os.path.join(SHM_DIR, name)).st_mode)
        assert mode == 0o600
        w = child(name, "write")
        out, _ = w.communicate(timeout=30)
        assert out.split() == ["attached"] and w.returncode == 0
        assert list(e.primary.rows[2, :5]) == [1, 2, 3, 4, 5]  # the child's bytes
        e.primary.rows[2, :5] = [9, 8, 7, 6, 5]
        r = child(name, "read")
        out, _ = r.communicate(timeout=30)
        assert "[9, 8, 7, 6, 5]" in out.replace("np.uint8(", "").replace(")", "")
        assert name in shm_files(name)
    # The last user removed the segment.
    assert name not in shm_files(name)


@needs_shm
def test_stale_segment_of_a_killed_process_is_cleaned(name: str, caplog: pytest.LogCaptureFixture) -> None:
    h = child(name, "hang")
    assert h.stdout is not None
    assert h.stdout.readline().strip() == "created"
    assert h.stdout.readline().strip() == "ready"
    # While the owner lives, a second opener attaches and sees its bytes.
    live = ShmBuffer(name, 4, 4096)
    assert not live.created and live.rows[0, 0] == 77
    live.close()
    assert name in shm_files(name)
    h.kill()
    h.wait(timeout=30)
    assert h.stdout is not None
    h.stdout.close()
    assert name in shm_files(name)  # SIGKILL left it behind
    with caplog.at_level(logging.WARNING, logger="kvtier.transfer.buffers"):
        fresh = ShmBuffer(name, 4, 4096)
    assert fresh.created and fresh.rows[0, 0] == 0
    assert "stale" in caplog.text
    fresh.close()
    fresh.close()  # idempotent
    assert name not in shm_files(name)


@needs_shm
def test_size_mismatch_on_attach_is_a_config_error(name: str) -> None:
    a = ShmBuffer(name, 4, 4096)
    try:
        with pytest.raises(ConfigError, match="cpu_bytes_to_use"):
            ShmBuffer(name, 8, 4096)
    finally:
        a.close()
    assert name not in shm_files(name)


@needs_shm
def test_default_shm_name_is_private_and_removed() -> None:
    e = Engine({"cpu_bytes_to_use": 4096, "block_bytes": 4096, "primary_backing": "shm"})
    name = e.primary._buffer.name  # type: ignore[attr-defined]
    assert name.startswith(f"kvtier-{os.getpid()}-")
    e.close()
    assert shm_files(name) == []  # a private name leaves nothing behind, not even its init lock


@pytest.mark.parametrize("backing", ["heap", "torch"])
def test_engine_round_trip_on_each_byte_backing(backing: str) -> None:
    if backing == "torch":
        need_module("torch", "torch")  # CPU tensor here: no GPU on this host
    data = np.random.default_rng(7).integers(0, 256, (3, 5000), dtype=np.uint8)
    keys = [K(i) for i in range(3)]
    with Engine({"cpu_bytes_to_use": 4 * 8192, "block_bytes": 5000, "primary_backing": backing}) as e:
        assert e.store_blocks(keys, data) == 3
        out = np.zeros_like(data)
        assert e.load_blocks(keys, out) == 3
        assert np.array_equal(out, data)


@needs_shm
def test_second_engine_cannot_own_the_same_segment(name: str) -> None:
    # Two slot indexes over one buffer would give one slot to two keys and corrupt both blocks.
    cfg = {"cpu_bytes_to_use": 4 * 4096, "block_bytes": 4096, "primary_backing": "shm", "shm_name": name}
    with Engine(cfg) as e:
        with pytest.raises(ConfigError, match="already owned by another engine"):
            Engine(cfg)
        # A worker attaching to the bytes is still welcome, and sees the owner's data.
        e.primary.rows[1, :3] = [4, 5, 6]
        w = ShmBuffer(name, 4, 4096)
        assert list(w.rows[1, :3]) == [4, 5, 6]
        w.close()
    # Once the owner is gone another engine may own a (fresh) segment of that name.
    with Engine(cfg) as again:
        assert again.primary._buffer.created  # type: ignore[attr-defined]
    assert name not in shm_files(name)
