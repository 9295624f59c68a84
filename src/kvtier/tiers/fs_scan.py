"""Keeping the fs tier's in-memory index equal to the tree: start-up scan, shared events, rescans.

* **Start-up scan** (warm restart): a background thread walks the tree shard by shard
  (``os.scandir``, one ``stat`` per file) and indexes every well-formed block with its size and
  mtime; files that cannot be blocks of this namespace are counted as corrupt and removed. Until a
  key's top-level shard is done, a lookup that is not already known answers ``RETRY``. At the end the
  policy is rebuilt in global access (mtime) order, and a process that is alone repairs the shared
  byte total from what it saw.
* **Shared events**: other processes' stores and evictions arrive through the event log of
  :class:`~kvtier.tiers.fs_accounting.SharedAccounting`; the same thread polls it (one ``fstat``)
  every ``refresh_interval`` seconds when the tier is otherwise idle.
* **Rescan**: when the event log was cut back (it is bounded) a full rescan reconciles the index.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from kvtier.keys import BlockKey
from kvtier.policies.base import CachePolicy
from kvtier.tiers.base import TierStats
from kvtier.tiers.fs_accounting import AccountingState, SharedAccounting
from kvtier.tiers.fs_layout import Layout, ScanShard
from kvtier.tiers.fs_policy import make_policy
from kvtier.tiers.ratelog import RateLimitedLog

__all__ = ["IndexSync"]

log = logging.getLogger("kvtier.tiers.fs")
_KNOWN_TOP = frozenset({"config.json", "accounting.json", "events.log", "procs", "tmp"})


class IndexSync:
    """Mixin of :class:`~kvtier.tiers.fs.FsTier`: the index-maintenance half (see module doc)."""

    # Provided by FsTier.
    name: str
    stats: TierStats
    layout: Layout
    max_bytes: int | None
    refresh_interval: float
    precreate_dirs: bool
    tree_ready: threading.Event
    _dirs_made: set[str]
    _acct: SharedAccounting
    _lock: threading.Lock
    _index: dict[BlockKey, int]
    _access: dict[BlockKey, float]
    _policy: CachePolicy
    _policy_name: str
    _policy_options: dict[str, Any]
    _tombstones: set[BlockKey]
    _top_done: bytearray
    _scan_done: bool
    _closed: bool
    _rlog: RateLimitedLog
    _rescan_wanted: bool
    _wake: threading.Event
    scan_files: int
    scan_seconds: float
    _forget_locked: Callable[[BlockKey], None]
    _make_room: Callable[[AccountingState, int], int]

    # -- the maintenance thread --------------------------------------------------------------
    def _maintain(self) -> None:
        t0 = time.perf_counter()
        try:
            with self._acct.section() as st:
                self._acct.remove_stale_temp_files(st)
            self._remove_strays_at_top()
            self._scan_tree(initial=True)
        except Exception:  # the scan must never take the tier down; lookups then answer MISS
            log.exception("kvtier fs %s: start-up scan failed; serving what is indexed", self.name)
        finally:
            self.scan_seconds = time.perf_counter() - t0
            self._scan_done = True
        if self.precreate_dirs:
            try:
                self._precreate_dirs()
            except OSError as exc:  # a full or read-only disk: stores create them on demand
                self._rlog.warning("mkdir", f"kvtier fs {self.name}: cannot pre-create shard dirs: {exc}")
        self.tree_ready.set()
        while not self._closed:
            self._wake.wait(self.refresh_interval)
            self._wake.clear()
            if self._closed:
                return
            try:
                if self._rescan_wanted:
                    self._rescan_wanted = False
                    self._scan_tree(initial=False)
                elif self._acct.events_changed():
                    with self._acct.section():
                        pass  # reading the section applies the other processes' events
            except Exception:
                log.exception("kvtier fs %s: index refresh failed; will retry", self.name)

    def _precreate_dirs(self) -> None:
        """Create the 4,352 shard directories once, in the background (all 0700).

        On ext4 a mkdir costs ~0.4 ms; a young tree would otherwise pay one (or two) per store
        that lands in a new leaf, on the store path. Existing directories cost one failed mkdir.
        """
        for top in range(256):
            if self._closed:
                return
            top_dir = os.path.join(self.layout.ns_dir, f"{top:02x}")
            with contextlib.suppress(FileExistsError):
                os.mkdir(top_dir, 0o700)
            for mid in "0123456789abcdef":
                leaf = os.path.join(top_dir, mid)
                if leaf not in self._dirs_made:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(leaf, 0o700)
                    self._dirs_made.add(leaf)
            if self._acct.events_changed():  # stay responsive to the other processes meanwhile
                with self._acct.section():
                    pass

    def _scan_tree(self, initial: bool) -> None:
        """Walk every shard; on a rescan, also forget indexed keys whose file is gone."""
        seen: set[BlockKey] = set()
        started = time.time()
        for shard in self.layout.scan():
            if self._closed:
                return
            self._absorb(shard, seen)
            if initial:
                self._top_done[shard.top] = 1
        self._finish_scan(seen, started, initial)

    def _remove_strays_at_top(self) -> None:
        bad: list[tuple[str, str]] = []
        with os.scandir(self.layout.ns_dir) as it:
            for e in it:
                if e.name in _KNOWN_TOP or (len(e.name) == 2 and e.is_dir(follow_symlinks=False)):
                    continue
                if e.is_file(follow_symlinks=False) or e.is_symlink():
                    bad.append((e.path, "stray"))
        self._remove_bad(bad)

    def _remove_bad(self, bad: list[tuple[str, str]]) -> None:
        files = [p for p, _ in bad if os.path.islink(p) or not os.path.isdir(p)]
        for p, reason in bad:
            if p in files:
                self._rlog.warning("corrupt", f"kvtier fs {self.name}: removed {p} ({reason})")
            else:
                self._rlog.warning("stray", f"kvtier fs {self.name}: ignoring unexpected directory {p}")
        if not files:
            return
        with self._lock:
            self.stats.corrupt += len(files)
        with self._acct.section() as st:
            self._acct.unlink_files(st, files)

    def _absorb(self, shard: ScanShard, seen: set[BlockKey]) -> None:
        self.scan_files += len(shard.entries) + len(shard.bad)
        if shard.bad:
            self._remove_bad(shard.bad)
        if not shard.entries:
            return
        shard.entries.sort(key=lambda e: e[2])
        with self._acct.section(), self._lock:  # events first, then our inserts
            index, tomb = self._index, self._tombstones
            new = [e for e in shard.entries if e[0] not in index and e[0] not in tomb]
            seen.update(BlockKey(e[0]) for e in shard.entries)
            keys = [BlockKey(e[0]) for e in new]
            index.update((k, e[1]) for k, e in zip(keys, new, strict=True))
            self._access.update((k, e[2]) for k, e in zip(keys, new, strict=True))
            # Evictable at once, as far as the policy has room. A tree holding more blocks than
            # the policy's capacity (max_bytes was lowered) is trimmed oldest-first at the end of
            # the scan, when the global access order is known, never in shard order.
            room = self._policy.capacity - len(self._policy) - 1
            if room > 0:
                self._policy.insert_many(keys[-room:])

    def _finish_scan(self, seen: set[BlockKey], started: float, initial: bool) -> None:
        with self._acct.section() as st, self._lock:
            if not initial:
                # Keys indexed before this rescan began whose file was not found are gone.
                for k in [k for k in self._index if k not in seen and self._access.get(k, 0.0) < started]:
                    self._forget_locked(k)
            elif self._acct.alone(st) or self._acct.lost_state:
                # Nobody else wrote while we scanned: the index is the tree. Repair the totals.
                st.published = sum(self._index.values())
            snapshot = [(self._access.get(k, 0.0), k) for k in self._index]
        # Re-order the policy by access time across shards (the scan inserted shard by shard). The
        # sort and the rebuild run outside the tier lock so submissions never wait on them; what
        # changed meanwhile is reconciled under the lock afterwards.
        snapshot.sort(key=lambda e: e[0])
        fresh = make_policy(self._policy_name, self._policy.capacity, self._policy_options)
        excess = max(0, len(snapshot) - fresh.capacity + 1)
        oldest = [k for _, k in snapshot[:excess]]
        fresh.insert_many(k for _, k in snapshot[excess:])
        with self._acct.section() as st, self._lock:
            if oldest:
                for k in oldest:
                    self._forget_locked(k)
                self._acct.unlink_files(st, [self.layout.path_of(k) for k in oldest])
                self._acct.log_events(st, [(b"-", bytes(k)) for k in oldest])
                self.stats.evictions += len(oldest)
            for _, k in snapshot[excess:]:
                if k not in self._index:
                    fresh.remove(k)
            for k in self._index:
                if k not in fresh and len(fresh) < fresh.capacity:
                    fresh.insert(k)
            self._policy = fresh
            self._tombstones.clear()
            over = st.usage - self.max_bytes if self.max_bytes is not None else 0
        if over > 0:  # max_bytes was lowered since the last run
            with self._acct.section() as st:
                self._make_room(st, over)

    # -- events from other processes (called inside a section) --------------------------------
    def _apply_events(self, events: list[tuple[bytes, bytes]]) -> None:
        now = time.time()
        with self._lock:
            for op, raw in events:
                key = BlockKey(raw)
                if op == b"+":
                    self._tombstones.discard(key)
                    if key not in self._index:
                        self._index[key] = self.layout.file_size(len(key))
                        self._access[key] = now
                        if len(self._policy) < self._policy.capacity:
                            self._policy.insert(key)
                elif key in self._index:
                    self._forget_locked(key)
                elif not self._scan_done:
                    self._tombstones.add(key)  # the scan may still list it: do not resurrect

    def _on_epoch_change(self) -> None:
        # The log was cut back before we read all of it: what we missed is only on disk.
        self._rescan_wanted = True
        self._wake.set()
