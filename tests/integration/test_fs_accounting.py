"""The shared accounting file seen by two holders (two "processes": flock is per open file, so two
SharedAccounting objects in one process exclude each other exactly as two processes do)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.tiers.fs import accounting as fs_accounting
from kvtier.tiers.fs.accounting import SharedAccounting


def _pair(tmp_path: Path) -> tuple[SharedAccounting, SharedAccounting]:
    a = SharedAccounting(str(tmp_path), "1-0000000a")
    b = SharedAccounting(str(tmp_path), "2-0000000b")
    return a, b


def test_each_holder_sees_the_others_writes_despite_its_parse_cache(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    try:
        for i in range(1, 6):
            with a.section() as st:
                st.published += 100
            with b.section() as st:  # must re-read what a wrote, not reuse its own last state
                assert st.published == 200 * i - 100
                st.published += 100
        with a.section() as st:
            assert st.published == 1000
            assert set(st.procs) == {"1-0000000a", "2-0000000b"}
    finally:
        b.close()
        a.close()


def test_a_failed_section_changes_nothing_and_the_next_one_rereads(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    try:
        with a.section() as st:
            st.published = 500
        with pytest.raises(RuntimeError), a.section() as st:
            st.published = 7  # never written: the section failed
            raise RuntimeError("boom")
        with a.section() as st:
            assert st.published == 500
        assert b.snapshot().published == 500
    finally:
        b.close()
        a.close()


def test_events_reach_the_other_holder_and_a_cut_back_log_asks_for_a_rescan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _pair(tmp_path)
    seen: list[tuple[bytes, bytes]] = []
    rescans: list[int] = []
    b.on_events = seen.extend
    b.on_epoch_change = lambda: rescans.append(1)
    try:
        with b.section():
            pass  # b starts following the log from here
        with a.section() as st:
            a.log_events(st, [(b"+", b"k1"), (b"+", b"k2")])
        with a.section() as st:
            a.log_events(st, [(b"-", b"k1")])
        with b.section():
            pass
        assert seen == [(b"+", b"k1"), (b"+", b"k2"), (b"-", b"k1")]
        with b.section() as st:
            b.log_events(st, [(b"+", b"mine")])  # our own records are not echoed back
        with b.section():
            pass
        assert len(seen) == 3
        # The log is cut back when it would pass EVENTS_MAX: the other holder is told to rescan
        # and then follows the new log from its start.
        monkeypatch.setattr(fs_accounting, "EVENTS_MAX", 1)
        with a.section() as st:
            a.log_events(st, [(b"+", b"k3")])
        with b.section():
            pass
        assert rescans == [1]
        assert seen[-1] == (b"+", b"k3")
    finally:
        b.close()
        a.close()


def test_a_dead_processs_pub_intents_and_temp_files_are_undone_in_both_temp_name_shapes(
    tmp_path: Path,
) -> None:
    """Temp files live in shards of tmp/ now; an intent written by an earlier version names a flat
    tmp/<token>.<n>. Both are undone: a temp file still there means its rename never happened."""
    a = SharedAccounting(str(tmp_path), "1-0000000a")
    dead = "99-deadbeef"  # no procs/ marker: dead
    flat = f"{a.temps.dir}/{dead}.5"
    sharded = a.temps.path(dead, 6)
    renamed = a.temps.path(dead, 7)  # its rename happened: no temp file left
    stray = a.temps.path(dead, 8)  # written, never journaled (the reservation covers it)
    for p in (flat, sharded, stray):
        Path(p).write_bytes(b"x" * 100)
    try:
        with a.section() as st:
            st.published += 300
            intent = [["pub", flat, 100], ["pub", sharded, 100], ["pub", renamed, 100]]
            st.procs[dead] = {"pid": 99, "reserved": 100, "intent": intent}
        b = SharedAccounting(str(tmp_path), "2-0000000b")  # its first section recovers the dead one
        try:
            st = b.snapshot()
            assert st.published == 100  # only the rename that happened stays counted
            assert dead not in st.procs and st.reserved == 0
            assert not any(Path(p).exists() for p in (flat, sharded, stray))
        finally:
            b.close()
    finally:
        a.close()
