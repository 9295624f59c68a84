"""The fs tier's temp directories (``tmp/`` and its shards): name shapes, clean-up, planted links.

Real directories and files; no fakes.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.tiers.fs.temps import TEMP_SHARDS, TempDirs, temp_owner

TOKEN = "1234-0000abcd"
OTHER = "99-deadbeef"


def _temps(tmp_path: Path) -> TempDirs:
    ns = tmp_path / "ns"
    ns.mkdir(mode=0o700, exist_ok=True)
    return TempDirs(str(ns))


def test_names_spread_over_the_shards_and_locate_back(tmp_path: Path) -> None:
    t = _temps(tmp_path)
    try:
        shards = set()
        for seq in range(3 * TEMP_SHARDS):
            path = t.path(TOKEN, seq)
            fd, name = t.locate(path)
            assert name == f"{TOKEN}.{seq}" and temp_owner(name) == TOKEN
            shards.add(fd)
            assert t.owned_by(path, TOKEN) and not t.owned_by(path, OTHER)
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=fd))
            assert t.exists(path)
        assert len(shards) == TEMP_SHARDS
        on_disk = [os.path.join(d, f) for d, _, fs in os.walk(t.dir) for f in fs]
        assert sorted(on_disk) == sorted(t.path(TOKEN, s) for s in range(3 * TEMP_SHARDS))
        for d in os.listdir(t.dir):
            assert (Path(t.dir) / d).stat().st_mode & 0o777 == 0o700
    finally:
        t.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(max_size=60), st.from_regex(r"\A[0-9]{1,10}-[0-9a-f]{8}\.[0-9]{1,5}\Z")))
def test_locate_refuses_every_other_shape(tmp_path: Path, tail: str) -> None:
    t = _temps(tmp_path)  # the same directories for every example: nothing is created here
    try:
        for candidate in (tail, f"{t.dir}/{tail}", f"{t.dir}/3/{tail}", f"{t.dir}/../{tail}"):
            head, _, name = candidate.rpartition("/")
            ours = head in (t.dir, *(f"{t.dir}/{i:x}" for i in range(TEMP_SHARDS))) and temp_owner(name)
            if ours:
                assert t.locate(candidate)[1] == name
            else:
                with pytest.raises(ValueError):
                    t.locate(candidate)
                assert not t.unlink(candidate) and not t.exists(candidate)
    finally:
        t.close()


def test_clean_up_takes_only_the_dead_tokens_files_and_never_follows_a_link(tmp_path: Path) -> None:
    t = _temps(tmp_path)
    outside = tmp_path / "victim"
    outside.write_bytes(b"keep")
    try:
        mine = [t.path(TOKEN, s) for s in range(20)]
        theirs = [t.path(OTHER, s) for s in range(5)]
        for p in (*mine, *theirs):
            Path(p).write_bytes(b"x")
        flat_old = Path(t.dir, f"{TOKEN}.77")  # an earlier version's flat temp file
        flat_old.write_bytes(b"x")
        Path(t.dir, "7", "not-a-temp").write_bytes(b"x")
        Path(t.dir, "5", f"{TOKEN}.900").unlink(missing_ok=True)
        os.symlink(outside, Path(t.dir, "5", f"{TOKEN}.900"))  # a planted link of the right shape
        assert t.remove_owned(TOKEN) == len(mine) + 2  # the link itself is unlinked, not followed
        assert outside.read_bytes() == b"keep"
        assert not flat_old.exists() and Path(t.dir, "7", "not-a-temp").exists()
        assert all(Path(p).exists() for p in theirs)
        assert t.remove_owned("../../etc") == 0
        assert t.remove_stale(lambda owner: owner == OTHER) == 0
        assert t.remove_stale(lambda owner: False) == len(theirs)
    finally:
        t.close()


def test_a_shard_replaced_by_a_link_is_refused(tmp_path: Path) -> None:
    ns = tmp_path / "ns"
    (ns / "tmp").mkdir(parents=True, mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, ns / "tmp" / "a")
    with pytest.raises(OSError) as exc:
        TempDirs(str(ns))
    assert exc.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert not list(elsewhere.iterdir())
