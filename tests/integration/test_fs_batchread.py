"""The fs tier's batched reader (one C call per load chunk) behaves exactly as its Python path.

Real files on a real directory tree, damaged the ways a hostile or failing disk damages them
(missing, flipped payload or header byte, another key's file, truncated, extended, a symlink, a
FIFO, another owner's file). The same damage is applied to two fresh trees; one tier loads
through the batched reader, the other on the Python path (``_load._batch = None``); the loaded
keys, the slot bytes, the corrupt count and the files left must be equal. Runs only where the C
helper builds (a compiler is present); elsewhere the Python path is the only path and the rest of
the fs suite covers it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.tiers.fs import FsTier
from kvtier.tiers.fs.batchread import BatchItem

from . import fs_helpers as h

BLOCK = 64 * 1024
KINDS = ("ok", "missing", "payload", "header", "other-key", "truncate", "extend", "symlink", "fifo", "owner")


def _damage(tier: FsTier, keys: list[bytes], kinds: list[str]) -> None:
    paths = [tier.layout.path_of(k) for k in keys]
    contents = [Path(p).read_bytes() for p in paths]  # before any damage (a swap reads another)
    for i, (path, kind) in enumerate(zip(paths, kinds, strict=True)):
        other = paths[(i + 1) % len(paths)]
        if kind == "missing":
            os.unlink(path)
        elif kind in ("payload", "header"):
            with open(path, "r+b") as f:
                at = os.fstat(f.fileno()).st_size - 7 if kind == "payload" else 13
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([byte[0] ^ 0x40]))
        elif kind == "other-key":
            Path(path).write_bytes(contents[(i + 1) % len(paths)])
        elif kind == "truncate":
            os.truncate(path, os.stat(path).st_size - 100)
        elif kind == "extend":
            with open(path, "ab") as f:
                f.write(b"x")
        elif kind == "symlink":
            os.unlink(path)
            os.symlink(other, path)
        elif kind == "fifo":
            os.unlink(path)
            os.mkfifo(path, 0o600)
        elif kind == "owner":
            os.chown(path, 12345, 12345)


def _run(
    root: Path, kinds: list[str], verify: str, batched: bool
) -> tuple[list[bytes], dict[int, bytes], int, set[str]]:
    n = len(kinds)
    primary = h.aligned_primary(2 * n, BLOCK)
    tier = h.make_tier(primary, root, verify=verify)
    try:
        if batched and not tier._load.batched:
            pytest.skip("the batched reader is not available here (no C compiler)")
        if not batched:
            tier._load._batch = None
        keys = [h.key_of(f"blk{i}") for i in range(n)]
        assert h.store(tier, primary, keys).success
        _damage(tier, keys, kinds)
        res = h.load(tier, primary, keys)  # slots poisoned first
        got = [bytes(k) for k in res.transferred(keys)]
        slots = {i: primary.block(i).tobytes() for i, k in enumerate(keys) if bytes(k) in got}
        ns = tier.layout.ns_dir
        left = {
            os.path.relpath(os.path.join(d, f), ns)
            for d, _, files in os.walk(ns)
            if os.path.relpath(d, ns).split(os.sep)[0] not in ("procs", "tmp", ".")
            for f in files
        }
        return got, slots, tier.get_stats()["corrupt"], left
    finally:
        tier.shutdown()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=8),
    verify=st.sampled_from(["always", "never"]),
)
def test_batched_reads_equal_the_python_path_on_any_damage(
    tmp_path: Path, kinds: list[str], verify: str
) -> None:
    case = tmp_path / os.urandom(4).hex()
    batched = _run(case / "c", kinds, verify, batched=True)
    python = _run(case / "py", kinds, verify, batched=False)
    assert batched == python
    got, slots, _, _ = batched
    for i, kind in enumerate(kinds):
        key = h.key_of(f"blk{i}")
        if kind == "ok":
            assert bytes(key) in got  # an undamaged block always loads
        if bytes(key) in got and not (kind == "payload" and verify == "never"):
            # never a wrong byte (``verify: never`` checks the header only, by definition)
            assert slots[i] == h.payload_of(key, BLOCK).tobytes()  # never a wrong byte


def test_the_batched_reader_is_used_for_cached_shards(tmp_path: Path) -> None:
    """Every block of a load after a store in the same process goes through one batched call."""
    n = 6
    primary = h.aligned_primary(2 * n, BLOCK)
    tier = h.make_tier(primary, tmp_path)
    try:
        if not tier._load.batched:
            pytest.skip("the batched reader is not available here (no C compiler)")
        keys = [h.key_of(f"c{i}") for i in range(n)]
        assert h.store(tier, primary, keys).success
        calls: list[int] = []
        real = tier._load._load_one
        tier._load._load_one = lambda *a, **k: calls.append(1) or real(*a, **k)  # type: ignore[method-assign]
        res = h.load(tier, primary, keys)
        assert res.success and calls == []
    finally:
        tier.shutdown()


def test_an_abandon_stops_the_batch_before_any_byte_lands(tmp_path: Path) -> None:
    """When the abandon count moved since the caller looked, no block is read into its slot."""
    n = 4
    primary = h.aligned_primary(2 * n, BLOCK)
    tier = h.make_tier(primary, tmp_path)
    try:
        reader = tier._load._batch
        if reader is None:
            pytest.skip("the batched reader is not available here (no C compiler)")
        keys = [h.key_of(f"a{i}") for i in range(n)]
        assert h.store(tier, primary, keys).success
        for slot in range(n, 2 * n):
            primary.block(slot)[:] = 0xEE
        items = [BatchItem(tier.layout.path_of(k), n + i, bytes(k), False, False) for i, k in enumerate(keys)]
        epoch0 = reader.epoch()
        reader.note_abandon()
        done, *_ = reader.read(items, epoch0)
        assert done == [None] * n  # not read: left to the Python path
        assert all((primary.block(s) == 0xEE).all() for s in range(n, 2 * n))
        done, *_ = reader.read(items, reader.epoch())
        assert done == [True] * n
        assert all(
            primary.block(n + i).tobytes() == h.payload_of(k, BLOCK).tobytes() for i, k in enumerate(keys)
        )
    finally:
        tier.shutdown()
