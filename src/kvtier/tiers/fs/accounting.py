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
import logging
import os
import stat
import struct
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import xxhash

from kvtier.tiers.fs.safe import ForeignFileError, SafeTree, open_dir
from kvtier.tiers.fs.temps import TempDirs, is_token

log = logging.getLogger("kvtier.tiers.fs")

__all__ = ["AccountingState", "SharedAccounting"]

ACCOUNTING_FILE = "accounting.json"
EVENTS_FILE = "events.log"
#: The event log is cut back to empty past this size; readers then rescan the tree.
EVENTS_MAX = 32 << 20
_EVT = struct.Struct("<cQH")  # op (b"+" stored, b"-" removed), writer id, key length; then the key
PROCS_DIR = "procs"
_OPS = (b"+", b"-")
#: Longest key an event may carry (the codec's limit).
MAX_EVENT_KEY = 0xFFFF
_READ_CHUNK = 1 << 16
#: Blocks published under one journaled intent (and leaf descriptors held at once).
_PUBLISH_GROUP = 64
_O_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_OPEN_MARKER = os.O_RDWR | _O_SAFE


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
    forged: int = 0  # entries dropped on decode (not a token, not an object); never written

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
            # Entries whose name is not a token, or whose value is not an object, are forged:
            # dropped here so no later step ever sees them (they are written back without them).
            raw = dict(doc["procs"])
            procs = {t: p for t, p in raw.items() if is_token(t) and isinstance(p, dict)}
            return cls(
                published=int(doc["published"]),
                procs=procs,
                forged=len(raw) - len(procs),
                gen=int(doc.get("gen", 0)),
                epoch=int(doc.get("epoch", 0)),
            )
        except (ValueError, KeyError, TypeError, RecursionError):
            return None


def _intent_items(raw: object) -> list[tuple[str, object, int]]:
    """The well-formed ``[kind, name, delta]`` items of an intent read from the file."""
    if not isinstance(raw, list):
        return []
    out: list[tuple[str, object, int]] = []
    for item in raw:
        if (
            isinstance(item, list) and len(item) == 3 and item[0] in ("pub", "del")
            and type(item[2]) is int and 0 <= item[2] < 1 << 62
        ):  # fmt: skip
            out.append((item[0], item[1], item[2]))
    return out


class SharedAccounting:
    """The flock-guarded accounting file of one namespace directory, seen from one process.

    ``token`` names this process (pid + random suffix) in the file, in ``procs/`` and in temp-file
    names. All methods may block briefly on the lock; call them from worker threads, not from the
    engine's thread.
    """

    def __init__(
        self,
        ns_dir: str,
        token: str,
        *,
        fsync: bool = False,
        is_block_path: Callable[[str], bool] | None = None,
        owners: Collection[int] | None = (os.geteuid(),),
    ) -> None:
        self.ns_dir = ns_dir
        self.token = token
        self.fsync = fsync
        self.procs_dir = os.path.join(ns_dir, PROCS_DIR)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.procs_dir, 0o700)
        if not is_token(token):
            raise ValueError(f"token {token!r} is not <pid>-<8 hex>")
        # Whatever fails below (a planted link, a non-regular file, a held lock) closes what was
        # opened so far: a tier that cannot start leaks no descriptor.
        with contextlib.ExitStack() as undo:
            # Held for our whole life and used as dir_fd: a tmp/ or procs/ later replaced by a symlink
            # is never followed (O_NOFOLLOW refuses one now).
            #: The temp files' directories (``tmp/`` and its shards).
            self.temps = TempDirs(ns_dir)
            undo.callback(self.temps.close)
            if self.temps.unusable:
                log.warning(
                    "kvtier fs: %d temp shard name(s) in %s are held by something else (left alone); "
                    "their temp files go to tmp/ itself",
                    self.temps.unusable,
                    self.temps.dir,
                )
            self.tmp_dir = self.temps.dir
            #: Confined access to the block files (links, FIFOs, other owners' files refused).
            self.tree = SafeTree(ns_dir, owners=owners)
            undo.callback(self.tree.close)
            self._procs_fd = open_dir(self.procs_dir)
            undo.callback(os.close, self._procs_fd)
            #: Whether a string is a block path of this namespace (checks ``del`` intents read back).
            self.is_block_path = is_block_path
            self._init_state(token)
            # Shared event log: every process appends "+key"/"-key" inside its sections and reads the
            # others' records at the start of each section, so indexes follow each other's stores and
            # evictions (see docs/fs.md). -1: skip to the end on the first read (the scan covers the past).
            self._ev_fd = os.open(
                os.path.join(ns_dir, EVENTS_FILE), os.O_RDWR | os.O_CREAT | os.O_APPEND | _O_SAFE, 0o600
            )
            undo.callback(os.close, self._ev_fd)
            self._fd = os.open(os.path.join(ns_dir, ACCOUNTING_FILE), os.O_RDWR | os.O_CREAT | _O_SAFE, 0o600)
            undo.callback(os.close, self._fd)
            for fd in (self._ev_fd, self._fd):
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(f"{ns_dir}: {ACCOUNTING_FILE}/{EVENTS_FILE} is not a regular file")
            # Our liveness marker: held LOCK_EX for our whole life; the kernel drops it when we die.
            self._proc_path = os.path.join(self.procs_dir, token)
            self._proc_fd = os.open(
                token, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=self._procs_fd
            )
            undo.callback(os.close, self._proc_fd)
            fcntl.flock(self._proc_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.lost_state = False  # the file was missing/unreadable when we started
            with self.section() as st:
                self.recover_dead(st)
                st.procs[token] = {"pid": os.getpid(), "reserved": 0, "intent": None}
                st.gen += 1
                self.start_gen = st.gen
            undo.pop_all()  # opened and registered: close() releases it all from now on
        self._closed = False

    def _init_state(self, token: str) -> None:
        """The in-memory state a new holder starts from (no file is touched)."""
        #: Counted forged entries (accounting names or intents that are not of our fixed shapes).
        self.forged = 0
        self._tlock = threading.RLock()
        self._ev_off = -1  # -1: skip to the end of the event log on the first read
        self._ev_clean = False  # whether _ev_off is known to be the log's size (see _tail)
        self._size = 0  # bytes of the accounting file as last read or written (we hold the lock)
        self._last: tuple[bytes, AccountingState] | None = None  # what we last wrote, decoded
        #: Bytes of the whole tree (every process) as of our last section; read without the lock.
        self.last_usage = 0
        self.events_lost = 0
        self.sections = 0  #: critical sections entered (the per-job cost the group commits cut)
        self._epoch = 0
        self._writer_id = xxhash.xxh3_64_intdigest(token.encode())
        self.on_events: Callable[[list[tuple[bytes, bytes]]], None] | None = None
        self.on_epoch_change: Callable[[], None] | None = None

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
        if st is not None and st.forged:
            self._note_forged(st.forged, "accounting entries that are not process tokens")
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
        self.last_usage = st.usage
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
            if op not in _OPS or not 0 < klen <= MAX_EVENT_KEY:
                # Not a record we write: the rest of this read is unreliable.
                self._note_forged(1, "an event-log record of unknown shape")
                pos = len(data)
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

    def _note_forged(self, n: int, what: str) -> None:
        """Count and log (the first few) forged names read from the tree."""
        self.forged += n
        if self.forged <= 10 * n:
            log.warning("kvtier fs: ignored %s under %s (forged or foreign; left alone)", what, self.ns_dir)

    # -- liveness and recovery -----------------------------------------------------------------
    def _is_alive(self, token: str) -> bool:
        if token == self.token:
            return True
        if not is_token(token):
            return False  # never joined as a path (callers check too)
        try:
            # No symlink, no FIFO wait: a marker is a regular file of ours or it is no marker.
            fd = os.open(token, _OPEN_MARKER, dir_fd=self._procs_fd)
        except OSError:
            return False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def is_alive(self, token: str) -> bool:
        """Whether process ``token`` holds its liveness marker (a token of the fixed shape only)."""
        return self._is_alive(token)

    def recover_dead(self, st: AccountingState) -> int:
        """Undo half-done sections of dead processes, drop their reservations and temp files.

        Must be called inside :meth:`section`. Returns the number of dead processes cleaned.
        """
        for token in [t for t in st.procs if not is_token(t)]:
            st.procs.pop(token)  # forged (from_bytes drops them too; a state built in memory may not)
            self._note_forged(1, "an accounting entry that is not a process token")
        dead = [t for t in st.procs if not self._is_alive(t)]
        for token in dead:
            entry = st.procs.pop(token)
            for item in _intent_items(entry.get("intent")):
                kind, name, delta = item
                if not isinstance(name, str) or not self._intent_name_ok(token, kind, name):
                    # Never looked up: a forged intent cannot probe or change anything.
                    self._note_forged(1, f"an intent naming {name!r}")
                    continue
                if kind == "pub" and self.temps.exists(name):
                    st.published -= delta  # the rename never happened
                elif kind == "del" and self.tree.lexists(name):
                    st.published += delta  # the unlink never happened
            self.temps.remove_owned(token)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(token, dir_fd=self._procs_fd)
        # Marker files of processes that died before registering (or after a wiped file). Names
        # that are not tokens are not ours: left alone.
        with contextlib.suppress(OSError), os.scandir(self._procs_fd) as it:
            for e in it:
                if is_token(e.name) and e.name not in st.procs and not self._is_alive(e.name):
                    with contextlib.suppress(OSError):
                        os.unlink(e.name, dir_fd=self._procs_fd)
                    self.temps.remove_owned(e.name)
        st.published = max(0, st.published)
        return len(dead)

    def others_hold_bytes(self, st: AccountingState) -> bool:
        """Whether another registered process holds a reservation or an open intent (only those
        can be given back by :meth:`recover_dead`; it lists ``procs/`` and flock-probes each)."""
        return any(
            t != self.token and (int(p.get("reserved", 0)) or p.get("intent")) for t, p in st.procs.items()
        )

    def _intent_name_ok(self, token: str, kind: object, name: object) -> bool:
        """Whether an intent item names what this code writes there: a temp file of ``token``
        (``pub``) or a block path of this namespace (``del``); the name is compared as a string
        against those fixed shapes, never resolved."""
        if not isinstance(name, str):
            return False
        if kind == "pub":
            return self.temps.owned_by(name, token)
        if kind == "del":
            return self.is_block_path is not None and self.is_block_path(name)
        return False

    def remove_stale_temp_files(self, st: AccountingState) -> int:
        """Delete temp files whose owner token is not a live registered process (inside a section).

        Only names of the temp-file shape are touched (an entry is unlinked, never followed)."""
        return self.temps.remove_stale(st.procs.__contains__)

    def alone(self, st: AccountingState) -> bool:
        """Whether no other process registered since we did (and none is registered now)."""
        return set(st.procs) == {self.token} and st.gen == self.start_gen

    # -- operations --------------------------------------------------------------------------
    def unlink_files(self, st: AccountingState, paths: list[str]) -> list[tuple[str, int]]:
        """Unlink block files inside a section, journaled. Returns ``(path, size)`` actually removed."""
        victims: list[tuple[str, int]] = []
        tree = self.tree
        for p in paths:
            try:
                st_ = tree.lstat(p)
                tree.check(st_, p)
                victims.append((p, st_.st_size))
            except FileNotFoundError:
                continue  # already gone (another process evicted it); it was subtracted then
            except ForeignFileError as exc:
                # Not provably ours (a link, a FIFO, another owner's file, a shard dir that is a
                # link): left in place, counted; it was never counted in published either.
                log.warning("kvtier fs: left %s in place (%s)", p, exc.reason)
            except OSError:
                continue
        if not victims:
            return []
        st.published = max(0, st.published - sum(s for _, s in victims))
        self.write_intent(st, [["del", p, s] for p, s in victims])
        removed = []
        for p, s in victims:
            try:
                tree.unlink_own(p)
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
        me["reserved"] = max(0, int(me["reserved"]) - sum(s for _, _, s in items))
        ok: list[bool] = []
        # Each group is journaled on its own (its renames only), so a crash between groups leaves
        # an intent that names exactly the renames that may be half-done; the reservation of a
        # dead process is dropped whole anyway. Groups bound the leaf descriptors held at once.
        for lo in range(0, len(items), _PUBLISH_GROUP):
            with contextlib.ExitStack() as leaves:
                ok += self._publish_group(st, items[lo : lo + _PUBLISH_GROUP], leaves)
        return ok

    def _publish_group(
        self, st: AccountingState, items: list[tuple[str, str, int]], leaves: contextlib.ExitStack
    ) -> list[bool]:
        # One confined walk per block serves both the existence check and the rename (the leaf
        # directory descriptor is kept until the group is done): 4 system calls fewer per block.
        plan: list[tuple[str, str, int, bool, int | None, str]] = []
        foreign: set[str] = set()
        for tmp, final, size in items:
            leaf_fd: int | None = None
            name = ""
            try:
                leaf_fd, name = leaves.enter_context(self.tree.leaf(final))
                self.tree.check(os.stat(name, dir_fd=leaf_fd, follow_symlinks=False), final)
                new = False
            except FileNotFoundError:
                new = True  # a missing shard level: the rename below fails and says so
            except OSError:  # ForeignFileError included: never renamed over, never through a link
                foreign.add(final)
                new = False
            plan.append((tmp, final, size, new, leaf_fd, name))
        st.published += sum(p[2] for p in plan if p[3])
        self.write_intent(st, [["pub", p[0], p[2]] for p in plan if p[3]])
        ok: list[bool] = []
        for tmp, final, size, new, leaf_fd, name in plan:
            try:
                tmp_fd, tmp_name = self.temps.locate(tmp)  # our own name: ValueError is a bug
                if new and leaf_fd is not None:
                    os.rename(tmp_name, name, src_dir_fd=tmp_fd, dst_dir_fd=leaf_fd)
                elif new:
                    self.tree.rename_in(tmp_fd, tmp_name, final)
                else:
                    os.unlink(tmp_name, dir_fd=tmp_fd)
                ok.append(final not in foreign)
            except OSError as exc:
                if new:
                    st.published -= size
                self.unlink_temp(tmp)
                ok.append(exc.errno == errno.ENOENT and not new and final not in foreign)
        return ok

    def unlink_temp(self, tmp: str) -> bool:
        """Remove our temp file ``tmp`` (by name in its shard of ``tmp/``, never through a link);
        whether it was there."""
        return self.temps.unlink(tmp)

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
                self.temps.remove_owned(self.token)
        with contextlib.suppress(OSError):
            os.unlink(self.token, dir_fd=self._procs_fd)
        self.tree.close()
        self.temps.close()
        for fd in (self._proc_fd, self._fd, self._ev_fd, self._procs_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
