"""Keeping the fs tier's in-memory index equal to the tree: start-up scan, shared events, rescans.

* **Start-up scan** (warm restart): a background thread walks the tree shard by shard
  (``os.scandir``, one ``stat`` per file) and indexes every well-formed block with its size and
  mtime; files that cannot be blocks of this namespace are counted as corrupt and removed. Until a
  key's top-level shard is done, a lookup that is not already known answers ``RETRY``. At the end the
  policy is rebuilt in global access (mtime) order, and a process that is alone repairs the shared
  byte total from what it saw.
* **Shared events**: other processes' stores and evictions arrive through the event log of
  :class:`~kvtier.tiers.fs.accounting.SharedAccounting`; the same thread polls it (one ``fstat``)
  every ``refresh_interval`` seconds when the tier is otherwise idle.
* **Rescan**: when the event log was cut back (it is bounded) a full rescan reconciles the index.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from kvtier.keys import BlockKey
from kvtier.policies.base import CachePolicy
from kvtier.tiers.fs.accounting import AccountingState
from kvtier.tiers.fs.layout import ScanShard
from kvtier.tiers.fs.parts import FsParts

__all__ = ["TreeScanner"]

log = logging.getLogger("kvtier.tiers.fs")
_KNOWN_TOP = frozenset({"config.json", "accounting.json", "events.log", "procs", "tmp"})


class TreeScanner:
    """The fs tier's maintenance thread: start-up scan, shared events, rescans (see module doc).

    Args:
        parts: the tier's shared parts (name, layout, accounting, index, stats, log, the shard
            directories, pre-created here); a tree above ``options.max_bytes`` is trimmed after the
            scan, the shared event log is polled every ``options.refresh_interval`` seconds when idle.
        new_policy: builds an empty policy of a given capacity (the start-up scan rebuilds the
            policy in global access order).
        make_room: evicts to free bytes inside a section (the store path's eviction).
        precreate_dirs: create every shard directory once the scan is done.

    Call :meth:`start` once; :meth:`request_stop` then :meth:`join` to end the thread. The tier
    wires :meth:`apply_events` and :meth:`on_epoch_change` into the accounting.
    """

    def __init__(
        self,
        parts: FsParts,
        *,
        new_policy: Callable[[int], CachePolicy],
        make_room: Callable[[AccountingState, int], int],
        precreate_dirs: bool,
    ) -> None:
        self.precreate_dirs = precreate_dirs
        self._new_policy = new_policy
        self._make_room = make_room
        self.parts = parts
        self._lock = parts.index.lock
        self._stopping = False
        self._rescan_wanted = False
        self._wake = threading.Event()
        self.scan_files = 0
        self.scan_seconds = 0.0
        #: Set once the start-up scan and the shard-directory pre-creation are done.
        self.tree_ready = threading.Event()
        self._thread = threading.Thread(
            target=self._maintain, name=f"kvtier-fs-index-{parts.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the thread to end (it checks between shards and after each wait)."""
        self._stopping = True
        self._wake.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the maintenance thread --------------------------------------------------------------
    def _maintain(self) -> None:
        t0 = time.perf_counter()
        try:
            with self.parts.accounting.section() as st:
                self.parts.accounting.remove_stale_temp_files(st)
            self._remove_strays_at_top()
            self._scan_tree(initial=True)
        except Exception:  # the scan must never take the tier down; lookups then answer MISS
            log.exception("kvtier fs %s: start-up scan failed; serving what is indexed", self.parts.name)
        finally:
            self.scan_seconds = time.perf_counter() - t0
            self.parts.index.scan_done = True
        if self.precreate_dirs:
            try:
                self._precreate_dirs()
            except OSError as exc:  # a full or read-only disk: stores create them on demand
                self.parts.rlog.warning(
                    "mkdir", f"kvtier fs {self.parts.name}: cannot pre-create shard dirs: {exc}"
                )
        self.tree_ready.set()
        while not self._stopping:
            self._wake.wait(self.parts.options.refresh_interval)
            self._wake.clear()
            if self._stopping:
                return
            try:
                if self._rescan_wanted:
                    self._rescan_wanted = False
                    self._scan_tree(initial=False)
                elif self.parts.accounting.events_changed():
                    with self.parts.accounting.section():
                        pass  # reading the section applies the other processes' events
            except Exception:
                log.exception("kvtier fs %s: index refresh failed; will retry", self.parts.name)

    def _precreate_dirs(self) -> None:
        """Create every shard directory once, in the background (all 0700): 272 in a new tree
        (4,352 in a tree of the older layout).

        A mkdir is an inode allocation (0.1-0.7 ms on this project's ext4); a young tree would
        otherwise pay one (or two) per store that lands in a new leaf, on the store path.
        Existing directories cost one failed mkdir.
        """
        layout = self.parts.layout
        for top in range(layout.top_count):
            if self._stopping:
                return
            self.parts.dirs.precreate_top(layout.top_dir(top))
            if self.parts.accounting.events_changed():  # stay responsive to the other processes meanwhile
                with self.parts.accounting.section():
                    pass

    def _scan_tree(self, initial: bool) -> None:
        """Walk every shard; on a rescan, also forget indexed keys whose file is gone."""
        seen: set[BlockKey] = set()
        started = time.time()
        absorbed = 0
        for shard in self.parts.layout.scan(self.parts.accounting.tree.owners):
            if self._stopping:
                return
            absorbed += self._absorb(shard, seen)
            if initial:
                self.parts.index.top_done[shard.top] = 1
        self._finish_scan(seen, started, initial, absorbed)

    def _remove_strays_at_top(self) -> None:
        bad: list[tuple[str, str]] = []
        top_chars = self.parts.layout.top_chars
        with os.scandir(self.parts.layout.ns_dir) as it:
            for e in it:
                if e.name in _KNOWN_TOP or (len(e.name) == top_chars and e.is_dir(follow_symlinks=False)):
                    continue
                if e.is_file(follow_symlinks=False) or e.is_symlink():
                    bad.append((e.path, "stray"))
        self._remove_bad(bad)

    def _remove_bad(self, bad: list[tuple[str, str]]) -> None:
        files = [p for p, _ in bad if os.path.islink(p) or not os.path.isdir(p)]
        for p, reason in bad:
            if p in files:
                self.parts.rlog.warning("corrupt", f"kvtier fs {self.parts.name}: removed {p} ({reason})")
            else:
                self.parts.rlog.warning(
                    "stray", f"kvtier fs {self.parts.name}: ignoring unexpected directory {p}"
                )
        if not files:
            return
        with self._lock:
            self.parts.stats.corrupt += len(files)
        with self.parts.accounting.section() as st:
            self.parts.accounting.unlink_files(st, files)

    def _absorb(self, shard: ScanShard, seen: set[BlockKey]) -> int:
        """Index the shard's blocks not indexed yet; how many."""
        self.scan_files += len(shard.entries) + len(shard.bad)
        if shard.bad:
            self._remove_bad(shard.bad)
        if not shard.entries:
            return 0
        shard.entries.sort(key=lambda e: e[2])
        with self.parts.accounting.section(), self._lock:  # events first, then our inserts
            sizes, tomb, policy = self.parts.index.sizes, self.parts.index.tombstones, self.parts.index.policy
            new = [e for e in shard.entries if e[0] not in sizes and e[0] not in tomb]
            seen.update(BlockKey(e[0]) for e in shard.entries)
            keys = [BlockKey(e[0]) for e in new]
            sizes.update((k, e[1]) for k, e in zip(keys, new, strict=True))
            self.parts.index.access.update((k, e[2]) for k, e in zip(keys, new, strict=True))
            # Evictable at once, as far as the policy has room. A tree holding more blocks than
            # the policy's capacity (max_bytes was lowered) is trimmed oldest-first at the end of
            # the scan, when the global access order is known, never in shard order.
            room = policy.capacity - len(policy) - 1
            if room > 0:
                policy.insert_many(keys[-room:])
        return len(keys)

    def _finish_scan(self, seen: set[BlockKey], started: float, initial: bool, absorbed: int) -> None:
        index = self.parts.index
        with self.parts.accounting.section() as st, self._lock:
            if not initial:
                # Keys indexed before this rescan began whose file was not found are gone.
                for k in [k for k in index.sizes if k not in seen and index.access.get(k, 0.0) < started]:
                    index.forget_locked(k)
            elif self.parts.accounting.alone(st) or self.parts.accounting.lost_state:
                # Nobody else wrote while we scanned: the index is the tree. Repair the totals.
                st.published = sum(index.sizes.values())
            snapshot = [(index.access.get(k, 0.0), k) for k in index.sizes]
            capacity = index.policy.capacity
            # A first scan that indexed nothing (an empty tree) leaves the policy as it is: it has
            # ordered every indexed block as this process stored or used it, and a rebuild by
            # access time would erase its history (S3-FIFO's ghost and counts, ARC's lists) at a
            # moment set by thread timing. Keys beyond its capacity still need the rebuild.
            keep = initial and not absorbed and len(index.policy) == len(index.sizes)
        plan = None if keep else self._rebuilt(snapshot, capacity)
        with self.parts.accounting.section() as st, self._lock:
            if plan is not None:
                self._adopt_locked(st, *plan)
            index.tombstones.clear()
            limit = self.parts.options.max_bytes
            over = st.usage - limit if limit is not None else 0
        if over > 0:  # max_bytes was lowered since the last run
            with self.parts.accounting.section() as st:
                self._make_room(st, over)

    def _rebuilt(
        self, snapshot: list[tuple[float, BlockKey]], capacity: int
    ) -> tuple[CachePolicy, list[BlockKey], list[tuple[float, BlockKey]]]:
        """A policy ordering ``snapshot``'s blocks by access time (the scan inserted shard by shard),
        the oldest blocks beyond its room, and the snapshot entries it holds. Built outside the
        tier lock so submissions never wait on it; :meth:`_adopt_locked` reconciles what changed."""
        snapshot.sort(key=lambda e: e[0])
        fresh = self._new_policy(capacity)
        excess = max(0, len(snapshot) - fresh.capacity + 1)
        fresh.insert_many(k for _, k in snapshot[excess:])
        return fresh, [k for _, k in snapshot[:excess]], snapshot[excess:]

    def _adopt_locked(
        self,
        st: AccountingState,
        fresh: CachePolicy,
        oldest: list[BlockKey],
        kept: list[tuple[float, BlockKey]],
    ) -> None:
        """Make ``fresh`` (built from ``kept``) the index's policy, evicting ``oldest`` (tier lock
        and a section held); blocks indexed or forgotten since the snapshot are reconciled."""
        index = self.parts.index
        if oldest:
            for k in oldest:
                index.forget_locked(k)
            self.parts.accounting.unlink_files(st, [self.parts.layout.path_of(k) for k in oldest])
            self.parts.accounting.log_events(st, [(b"-", bytes(k)) for k in oldest])
            self.parts.stats.evictions += len(oldest)
        for _, k in kept:
            if k not in index.sizes:
                fresh.remove(k)
        for k in index.sizes:
            if k not in fresh and len(fresh) < fresh.capacity:
                fresh.insert(k)
        index.policy = fresh

    # -- events from other processes (called inside a section) --------------------------------
    def apply_events(self, events: list[tuple[bytes, bytes]]) -> None:
        """Other processes' ``+`` (stored) and ``-`` (removed) events, from the accounting."""
        now = time.time()
        index = self.parts.index
        with self._lock:
            for op, raw in events:
                key = BlockKey(raw)
                if op == b"+":
                    index.tombstones.discard(key)
                    if key not in index.sizes:
                        index.add_locked(key, self.parts.layout.file_size(len(key)), now)
                elif key in index.sizes:
                    index.forget_locked(key)
                elif not index.scan_done:
                    index.tombstones.add(key)  # the scan may still list it: do not resurrect

    def on_epoch_change(self) -> None:
        """The log was cut back before we read all of it: what we missed is only on disk."""
        self._rescan_wanted = True
        self._wake.set()
