"""The fs tier's temp directories (``tmp/`` and its shards): name shapes, clean-up, planted links.

Real directories and files; no fakes.
"""

from __future__ import annotations

import os
import re
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
        shape = re.compile(re.escape(t.dir) + r"(/[0-9a-f])?/([0-9]{1,10}-[0-9a-f]{8})\.[0-9]{1,20}")
        for candidate in (tail, f"{t.dir}/{tail}", f"{t.dir}/3/{tail}", f"{t.dir}/../{tail}"):
            m = shape.fullmatch(candidate)
            if m is not None and "\n" not in candidate:
                assert t.locate(candidate)[1] == candidate.rpartition("/")[2]
                assert t.owned_by(candidate, m.group(2)) and not t.owned_by(candidate, OTHER)
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


def test_a_shard_name_held_by_a_link_or_file_is_left_alone_and_its_temps_go_flat(tmp_path: Path) -> None:
    ns = tmp_path / "ns"
    (ns / "tmp").mkdir(parents=True, mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, ns / "tmp" / "a")
    (ns / "tmp" / "b").write_bytes(b"a file where a shard belongs")
    t = TempDirs(str(ns))
    try:
        assert t.unusable == 2
        for seq in (10, 11, 26):  # shards a, b (unusable) and a again
            path = t.path(TOKEN, seq)
            assert path == f"{t.dir}/{TOKEN}.{seq}"
            fd, name = t.locate(path)
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=fd))
        assert t.path(TOKEN, 12) == f"{t.dir}/c/{TOKEN}.12"
        assert t.remove_owned(TOKEN) == 3
    finally:
        t.close()
    assert not list(elsewhere.iterdir()) and (ns / "tmp" / "a").is_symlink()
    assert (ns / "tmp" / "b").read_bytes() == b"a file where a shard belongs"


def test_after_close_nothing_is_located(tmp_path: Path) -> None:
    t = _temps(tmp_path)
    path = t.path(TOKEN, 3)
    t.close()
    with pytest.raises(ValueError):
        t.locate(path)
    assert not t.exists(path) and not t.unlink(path)
