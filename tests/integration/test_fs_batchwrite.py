"""The fs tier's batched writer (one C call per store chunk) writes what the Python path writes.

Real files in a real tier's ``tmp/`` directory: the bytes of every temp file equal
:func:`~kvtier.tiers.fs.io.write_block`'s for the same key and payload (any key length, payload
size, O_DIRECT or buffered), the mode is 0600, an existing name or a planted link is refused
(``O_EXCL | O_NOFOLLOW``) and left alone, a full disk (a real 1 MiB tmpfs where the machine lets
us mount one) answers ``ENOSPC``. Runs only where the C helper builds (a compiler is present);
elsewhere the Python path is the only path and the rest of the fs suite covers it.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import subprocess
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.keys import BlockKey
from kvtier.tiers.base import TierContext
from kvtier.tiers.fs import FsTier
from kvtier.tiers.fs.batchwrite import BatchWriter, WriteItem, open_writer
from kvtier.tiers.fs.io import write_block
from kvtier.tiers.fs.layout import probe_direct_io


def _writer(rows: np.ndarray, ns_tag: int, fsync: bool = False) -> BatchWriter:
    w = open_writer(rows, payload_len=rows.shape[1], ns_tag=ns_tag, fsync=fsync)
    if w is None:
        pytest.skip("the batched writer is not available here (no C compiler)")
    return w


def _rows(n: int, block: int, seed: int) -> np.ndarray:
    """Page-aligned rows of exactly ``block`` bytes (an unaligned stride when it is not a page)."""
    rows = np.frombuffer(mmap.mmap(-1, n * block), np.uint8).reshape(n, block)
    rows[:] = np.random.default_rng(seed).integers(0, 256, rows.shape, dtype=np.uint8)
    return rows


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    key_lens=st.lists(st.integers(1, 300), min_size=1, max_size=5),
    block=st.sampled_from([4096, 8192, 1000, 65536]),
    direct=st.booleans(),
    fsync=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_same_bytes_as_the_python_writer(
    tmp_path: Path, key_lens: list[int], block: int, direct: bool, fsync: bool, seed: int
) -> None:
    d = tmp_path / os.urandom(4).hex()
    d.mkdir(mode=0o700)
    direct = direct and block % 4096 == 0 and probe_direct_io(str(d))
    rows = _rows(len(key_lens), block, seed)
    rng = np.random.default_rng(seed)
    keys = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in key_lens]
    ns_tag = int(rng.integers(0, 2**63))
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        w = _writer(rows, ns_tag, fsync)
        errs = w.write([WriteItem(fd, f"c{i}", i, k, direct) for i, k in enumerate(keys)])
        assert errs == [0] * len(keys)
        for i, k in enumerate(keys):
            write_block(f"p{i}", k, rows[i].data, ns_tag, direct=False, fsync=False, dir_fd=fd)
            c, p = d / f"c{i}", d / f"p{i}"
            assert c.read_bytes() == p.read_bytes()
            assert stat.S_IMODE(c.stat().st_mode) == 0o600
    finally:
        os.close(fd)


def test_an_existing_name_or_a_planted_link_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "tmp"
    d.mkdir(mode=0o700)
    (d / "taken").write_bytes(b"keep")
    victim = tmp_path / "victim"
    victim.write_bytes(b"never written through")
    (d / "link").symlink_to(victim)
    rows = _rows(3, 4096, 1)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        w = _writer(rows, 7)
        errs = w.write([WriteItem(fd, "taken", 0, b"k0", False), WriteItem(fd, "link", 1, b"k1", False),
                        WriteItem(fd, "fresh", 2, b"k2", False)])  # fmt: skip
    finally:
        os.close(fd)
    assert errs[0] == errno.EEXIST and errs[1] in (errno.EEXIST, errno.ELOOP) and errs[2] == 0
    assert (d / "taken").read_bytes() == b"keep"
    assert victim.read_bytes() == b"never written through"


def test_a_full_disk_answers_enospc(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)]
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        rows = _rows(8, 256 * 1024, 2)
        fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            errs = _writer(rows, 3).write([WriteItem(fd, f"b{i}", i, b"key%d" % i, False) for i in range(8)])
        finally:
            os.close(fd)
        assert errs[:3] == [0, 0, 0]  # 3 x 260 KiB fit in 1 MiB, the fourth does not
        assert errno.ENOSPC in errs[3:] and all(e in (0, errno.ENOSPC) for e in errs)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


class _Seam(FsTier):
    """A tier whose write seam is overridden (as fault-injection tests do): the Python path."""

    seen = 0

    def _write_file(self, tmp: str, key: BlockKey, slot: int) -> None:
        type(self).seen += 1
        super()._write_file(tmp, key, slot)


def test_a_tier_stores_through_it_and_an_overridden_seam_turns_it_off(tmp_path: Path) -> None:
    n, block = 6, 64 * 1024
    primary = h.aligned_primary(2 * n, block)
    keys = [h.key_of(f"w{i}") for i in range(n)]
    tier = h.make_tier(primary, tmp_path / "a")
    try:
        if tier._store._batch is None:
            pytest.skip("the batched writer is not available here (no C compiler)")
        calls: list[int] = []
        real = tier._store.write_file

        def seam(tmp: str, key: BlockKey, slot: int) -> None:
            calls.append(1)
            real(tmp, key, slot)

        tier._store._write = seam
        assert h.store(tier, primary, keys).success
        assert calls == []  # every block went through the batched call
        tier._load._batch = None  # read back on the Python path: an independent check of the bytes
        assert h.load(tier, primary, keys).success
        for i, k in enumerate(keys):
            assert primary.block(i).tobytes() == h.payload_of(k, block).tobytes()
    finally:
        tier.shutdown()
    ctx = TierContext(name="fs", block_bytes=block, namespace=h.NAMESPACE)
    seam = _Seam(primary_kv_view=primary.view, context=ctx, root_dir=str(tmp_path / "b"), small_block_bytes=0)
    try:
        assert seam._store._batch is None
        assert h.store(seam, primary, keys).success and _Seam.seen == n
    finally:
        seam.shutdown()


def test_one_call_writes_each_block_into_its_own_directory(tmp_path: Path) -> None:
    dirs = [tmp_path / f"d{i}" for i in range(3)]
    for d in dirs:
        d.mkdir(mode=0o700)
    fds = [os.open(d, os.O_RDONLY | os.O_DIRECTORY) for d in dirs]
    rows = _rows(6, 4096, 5)
    try:
        w = _writer(rows, 11)
        errs = w.write([WriteItem(fds[i % 3], f"b{i}", i, b"key%d" % i, False) for i in range(6)])
        assert errs == [0] * 6
        for i in range(6):
            write_block(f"p{i}", b"key%d" % i, rows[i].data, 11, direct=False, fsync=False, dir_fd=fds[i % 3])
        for i, d in enumerate(dirs):
            assert sorted(p.name for p in d.iterdir()) == sorted([f"b{i}", f"b{i + 3}", f"p{i}", f"p{i + 3}"])
            for j in (i, i + 3):
                assert (d / f"b{j}").read_bytes() == (d / f"p{j}").read_bytes()
    finally:
        for fd in fds:
            os.close(fd)
