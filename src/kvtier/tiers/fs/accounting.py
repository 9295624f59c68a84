"""Byte accounting for one fs namespace, shared by every process that uses the same ``root_dir``.

The design (see docs/fs.md, "Capacity and sharing"):

* One small JSON file, ``<ns>/accounting.json``, holds ``published`` (bytes of block files in the
  tree) and, per live process, ``reserved`` (bytes of temp files it may be writing) and ``intent``
  (the renames/unlinks of its current critical section). Usage = published + all reservations.
* Every change happens under ``flock(LOCK_EX)`` on that file (plus a thread lock, because flock is
  per open file and our worker threads share one). A process reserves bytes *before* it writes a temp
  file, so the bytes on disk never exceed ``max_bytes``, whatever the number of writers.
* Crash safety: a critical section writes the new totals *and* its intent in one ``pwrite`` before
  touching the tree, then clears the intent. If the process dies (SIGKILL) in between, the next
  process to take the lock sees its token is dead (its ``procs/<token>`` file is no longer flocked),
  undoes the part of the intent that did not happen (a temp file still present = rename not done;
  a victim still present = unlink not done), drops its reservation and deletes its temp files.
  So the totals stay exact across a crash even while another process keeps running.
* When a process finds itself alone (no other live token) after its start-up scan, it rewrites
  ``published`` from what the scan saw, which repairs anything the journal cannot know (a machine
  crash with an unsynced file, a hand-edited tree).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import xxhash

__all__ = ["AccountingState", "SharedAccounting"]

ACCOUNTING_FILE = "accounting.json"
EVENTS_FILE = "events.log"
#: The event log is cut back to empty past this size; readers then rescan the tree.
EVENTS_MAX = 32 << 20
_EVT = struct.Struct("<cQH")  # op (b"+" stored, b"-" removed), writer id, key length; then the key
PROCS_DIR = "procs"
_READ_CHUNK = 1 << 16
TMP_DIR = "tmp"


@dataclass
class AccountingState:
    """The decoded accounting file. ``intent`` items are ``[kind, name, delta]``.

    ``kind`` is ``"pub"`` (``name`` = temp path; ``delta`` bytes were added to published) or ``"del"``
    (``name`` = block path; ``delta`` bytes were subtracted).
    """

    published: int = 0
    procs: dict[str, dict[str, Any]] = field(default_factory=dict)
    gen: int = 0
    epoch: int = 0  # bumped each time the event log is cut back

    @property
    def reserved(self) -> int:
        return sum(int(p.get("reserved", 0)) for p in self.procs.values())

    @property
    def usage(self) -> int:
        return self.published + self.reserved

    def to_bytes(self) -> bytes:
        doc = {"version": 1, "published": self.published, "gen": self.gen, "epoch": self.epoch,
               "procs": self.procs}  # fmt: skip
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> AccountingState | None:
        if not data.strip():
            return None
        try:
            doc = json.loads(data)
            return cls(
                published=int(doc["published"]),
                procs=dict(doc["procs"]),
                gen=int(doc.get("gen", 0)),
                epoch=int(doc.get("epoch", 0)),
            )
        except (ValueError, KeyError, TypeError):
            return None


class SharedAccounting:
    """The flock-guarded accounting file of one namespace directory, seen from one process.

    ``token`` names this process (pid + random suffix) in the file, in ``procs/`` and in temp-file
    names. All methods may block briefly on the lock; call them from worker threads, not from the
    engine's thread.
    """

    def __init__(self, ns_dir: str, token: str, *, fsync: bool = False) -> None:
        self.ns_dir = ns_dir
        self.token = token
        self.fsync = fsync
        self.tmp_dir = os.path.join(ns_dir, TMP_DIR)
        self.procs_dir = os.path.join(ns_dir, PROCS_DIR)
        for d in (self.tmp_dir, self.procs_dir):
            os.makedirs(d, mode=0o700, exist_ok=True)
        self._tlock = threading.RLock()
        # Shared event log: every process appends "+key"/"-key" inside its sections and reads the
        # others' records at the start of each section, so indexes follow each other's stores and
        # evictions (see docs/fs.md). -1: skip to the end on the first read (the scan covers the past).
        self._ev_fd = os.open(os.path.join(ns_dir, EVENTS_FILE), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self._ev_off = -1
        self._ev_clean = False  # whether _ev_off is known to be the log's size (see _tail)
        self._size = 0  # bytes of the accounting file as last read or written (we hold the lock)
        self._last: tuple[bytes, AccountingState] | None = None  # what we last wrote, decoded
        self.events_lost = 0
        self.sections = 0  #: critical sections entered (the per-job cost the group commits cut)
        self._epoch = 0
        self._writer_id = xxhash.xxh3_64_intdigest(token.encode())
        self.on_events: Callable[[list[tuple[bytes, bytes]]], None] | None = None
        self.on_epoch_change: Callable[[], None] | None = None
        self._fd = os.open(os.path.join(ns_dir, ACCOUNTING_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        # Our liveness marker: held LOCK_EX for our whole life; the kernel drops it when we die.
        self._proc_path = os.path.join(self.procs_dir, token)
        self._proc_fd = os.open(self._proc_path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._proc_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.lost_state = False  # the file was missing/unreadable when we started
        with self.section() as st:
            self.recover_dead(st)
            st.procs[token] = {"pid": os.getpid(), "reserved": 0, "intent": None}
            st.gen += 1
            self.start_gen = st.gen
        self._closed = False

    # -- the critical section ------------------------------------------------------------------
    @contextlib.contextmanager
    def section(self) -> Iterator[AccountingState]:
        """Hold the lock, yield the current state, write it back on exit."""
        with self._tlock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            self.sections += 1
            try:
                st = self._read()
                self._tail(st)
                yield st
                self._write(st)
            except BaseException:
                self._last = None  # st may differ from the file now: parse it next time
                raise
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _read(self) -> AccountingState:
        # One pread of a generous size instead of fstat + pread: the document is a few hundred
        # bytes (a few KiB with many processes); a longer file is read in a second round.
        data = os.pread(self._fd, _READ_CHUNK, 0)
        while len(data) % _READ_CHUNK == 0 and data:
            more = os.pread(self._fd, _READ_CHUNK, len(data))
            if not more:
                break
            data += more
        self._size = len(data)
        if self._last is not None and data == self._last[0]:
            # Nobody wrote since our last section: the state we wrote is the file (sections never
            # keep their state object past the section), so skip the parse.
            return self._last[1]
        st = AccountingState.from_bytes(data) if data else None
        if st is None:
            self.lost_state = True
            return AccountingState()
        return st

    def _write(self, st: AccountingState) -> None:
        # One pwrite, never a truncate: JSON allows trailing blanks, so a shorter document is padded
        # to the old length (known from the section's read: every writer holds the lock). A process
        # killed between a pwrite and an ftruncate would otherwise leave a valid prefix followed by
        # garbage.
        data = st.to_bytes()
        if len(data) < self._size:
            data = data.ljust(self._size, b" ")
        os.pwrite(self._fd, data, 0)
        self._size = len(data)
        self._last = (data, st)
        if self.fsync:
            os.fsync(self._fd)

    def _tail(self, st: AccountingState) -> None:
        if self._ev_off < 0:
            self._ev_off, self._epoch = os.fstat(self._ev_fd).st_size, st.epoch
            self._ev_clean = True
            return
        if st.epoch != self._epoch:
            self._epoch, self._ev_off = st.epoch, 0
            if self.on_epoch_change is not None:
                self.on_epoch_change()
        # pread from where we stopped (no fstat): an empty read means nothing new. The log is only
        # cut back together with an epoch bump, so a shorter file was handled just above.
        data = os.pread(self._ev_fd, _READ_CHUNK, self._ev_off)
        while len(data) % _READ_CHUNK == 0 and data:
            more = os.pread(self._ev_fd, _READ_CHUNK, self._ev_off + len(data))
            if not more:
                break
            data += more
        if not data:
            self._ev_clean = True
            return
        events: list[tuple[bytes, bytes]] = []
        pos = 0
        while pos + _EVT.size <= len(data):
            op, writer, klen = _EVT.unpack_from(data, pos)
            end = pos + _EVT.size + klen
            if end > len(data):
                break
            if writer != self._writer_id:
                events.append((op, data[pos + _EVT.size : end]))
            pos = end
        self._ev_off += pos
        # Clean: we read up to the end of the file, so its size is _ev_off (appends happen only
        # under the lock we hold); log_events then needs no fstat.
        self._ev_clean = pos == len(data)
        if events and self.on_events is not None:
            self.on_events(events)

    def events_changed(self) -> bool:
        """Cheap, lock-free check (one fstat) whether another process appended events."""
        return self._ev_off >= 0 and os.fstat(self._ev_fd).st_size != self._ev_off

    def log_events(self, st: AccountingState, events: list[tuple[bytes, bytes]]) -> None:
        """Append ``(op, key)`` records (inside a section, after the tree changed)."""
        if not events:
            return
        data = b"".join(_EVT.pack(op, self._writer_id, len(k)) + k for op, k in events)
        try:
            size = self._ev_off if self._ev_clean else os.fstat(self._ev_fd).st_size
            if size + len(data) > EVENTS_MAX:
                os.ftruncate(self._ev_fd, 0)
                st.epoch += 1
                self._epoch = st.epoch
                size = 0
            os.write(self._ev_fd, data)
            # O_APPEND under the lock: the file now ends right after our records (when the tail
            # was clean); otherwise ask.
            self._ev_off = size + len(data) if self._ev_clean else os.fstat(self._ev_fd).st_size
            self._ev_clean = True
        except OSError:
            # Best effort (a full disk): the tree and the totals are already right; other
            # processes' indexes go stale, which costs them a miss, never a wrong byte.
            self.events_lost += len(events)

    def write_intent(self, st: AccountingState, intent: list[list[Any]]) -> None:
        """Persist ``st`` (deltas already applied) with ``intent`` before touching the tree."""
        st.procs[self.token]["intent"] = intent
        self._write(st)
        st.procs[self.token]["intent"] = None  # written again (cleared) when the section exits

    def me(self, st: AccountingState) -> dict[str, Any]:
        entry = st.procs.get(self.token)
        if entry is None:  # someone wiped the file: re-register (our reservations are re-added)
            entry = st.procs[self.token] = {"pid": os.getpid(), "reserved": 0, "intent": None}
        return entry

    # -- liveness and recovery -----------------------------------------------------------------
    def _is_alive(self, token: str) -> bool:
        if token == self.token:
            return True
        path = os.path.join(self.procs_dir, token)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def recover_dead(self, st: AccountingState) -> int:
        """Undo half-done sections of dead processes, drop their reservations and temp files.

        Must be called inside :meth:`section`. Returns the number of dead processes cleaned.
        """
        dead = [t for t in st.procs if not self._is_alive(t)]
        for token in dead:
            entry = st.procs.pop(token)
            for kind, name, delta in entry.get("intent") or ():
                if kind == "pub" and os.path.exists(name):
                    st.published -= int(delta)  # the rename never happened
                elif kind == "del" and os.path.exists(name):
                    st.published += int(delta)  # the unlink never happened
            self._remove_temp_files(token)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.procs_dir, token))
        # Marker files of processes that died before registering (or after a wiped file).
        with contextlib.suppress(OSError), os.scandir(self.procs_dir) as it:
            for e in it:
                if e.name not in st.procs and not self._is_alive(e.name):
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
                    self._remove_temp_files(e.name)
        st.published = max(0, st.published)
        return len(dead)

    def others_hold_bytes(self, st: AccountingState) -> bool:
        """Whether another registered process holds a reservation or an open intent (only those
        can be given back by :meth:`recover_dead`; it lists ``procs/`` and flock-probes each)."""
        return any(
            t != self.token and (int(p.get("reserved", 0)) or p.get("intent")) for t, p in st.procs.items()
        )

    def _remove_temp_files(self, token: str) -> None:
        prefix = token + "."
        with contextlib.suppress(OSError), os.scandir(self.tmp_dir) as it:
            for e in it:
                if e.name.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(e.path)

    def remove_stale_temp_files(self, st: AccountingState) -> int:
        """Delete temp files whose owner token is not a live registered process (inside a section)."""
        removed = 0
        with contextlib.suppress(OSError), os.scandir(self.tmp_dir) as it:
            for e in it:
                owner = e.name.rsplit(".", 1)[0]
                if owner in st.procs:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)
                    removed += 1
        return removed

    def alone(self, st: AccountingState) -> bool:
        """Whether no other process registered since we did (and none is registered now)."""
        return set(st.procs) == {self.token} and st.gen == self.start_gen

    # -- operations --------------------------------------------------------------------------
    def unlink_files(self, st: AccountingState, paths: list[str]) -> list[tuple[str, int]]:
        """Unlink block files inside a section, journaled. Returns ``(path, size)`` actually removed."""
        victims: list[tuple[str, int]] = []
        for p in paths:
            try:
                victims.append((p, os.stat(p, follow_symlinks=False).st_size))
            except FileNotFoundError:
                continue  # already gone (another process evicted it); it was subtracted then
        if not victims:
            return []
        st.published = max(0, st.published - sum(s for _, s in victims))
        self.write_intent(st, [["del", p, s] for p, s in victims])
        removed = []
        for p, s in victims:
            try:
                os.unlink(p)
                removed.append((p, s))
            except FileNotFoundError:
                st.published += s
            except OSError:
                st.published += s  # still there; keep counting it
        return removed

    def publish(self, st: AccountingState, items: list[tuple[str, str, int]]) -> list[bool]:
        """Rename temp files ``(tmp, final, size)`` into the tree, journaled; release reservations.

        A final path that already exists (another process stored the same key) keeps its file; the
        temp file is dropped. Returns, per item, whether the key is now in the tree.
        """
        me = self.me(st)
        plan: list[tuple[str, str, int, bool]] = []
        for tmp, final, size in items:
            plan.append((tmp, final, size, not os.path.exists(final)))
        me["reserved"] = max(0, int(me["reserved"]) - sum(s for _, _, s in items))
        st.published += sum(s for _, _, s, new in plan if new)
        self.write_intent(st, [["pub", tmp, s] for tmp, _, s, new in plan if new])
        ok: list[bool] = []
        for tmp, final, size, new in plan:
            try:
                if new:
                    os.rename(tmp, final)
                else:
                    os.unlink(tmp)
                ok.append(True)
            except OSError as exc:
                if new:
                    st.published -= size
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                ok.append(exc.errno == errno.ENOENT and not new)
        return ok

    def release(self, nbytes: int) -> None:
        """Give back a reservation whose temp file was never published (already deleted)."""
        if nbytes <= 0:
            return
        with self.section() as st:
            me = self.me(st)
            me["reserved"] = max(0, int(me["reserved"]) - nbytes)

    def snapshot(self, recover: bool = True) -> AccountingState:
        """A consistent copy of the file (for stats and tests), after cleaning up dead processes."""
        with self.section() as st:
            if recover:
                self.recover_dead(st)
            return AccountingState(st.published, json.loads(json.dumps(st.procs)), st.gen, st.epoch)

    def close(self) -> None:
        """Unregister (after the tier drained) and release the liveness lock. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError), self.section() as st:
            me = st.procs.pop(self.token, None)
            if me is not None and int(me.get("reserved", 0)):
                self._remove_temp_files(self.token)
        with contextlib.suppress(OSError):
            os.unlink(self._proc_path)
        for fd in (self._proc_fd, self._fd, self._ev_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
