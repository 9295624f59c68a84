"""The ``fs`` tier: a bounded, checksummed, crash-safe, shareable directory of KV blocks.

What it guarantees (docs/fs.md has the full story):
    * **Never a wrong byte.** Every file is a :mod:`kvtier.codec` blob: header (key, namespace tag,
      lengths, xxh3-64) + payload. Loads check the length and the header always and the checksum
      unless ``verify="never"``; a bad file is a miss, counted in ``stats.corrupt`` and removed.
    * **Crash-safe writes.** Temp file in ``<ns>/tmp`` then ``rename`` into the tree; ``fsync=True``
      also syncs the file and its directory. A process killed at any point leaves no partial block.
    * **Bounded.** ``max_bytes`` is enforced through a flock-guarded accounting file shared by every
      process using the same ``root_dir`` (:mod:`kvtier.tiers.fs_accounting`): space is reserved
      before a temp file is written, so the tree never exceeds ``max_bytes``; victims come from a
      :class:`~kvtier.policies.base.CachePolicy` (``eviction_policy``, LRU by default).
    * **Warm restart.** A background thread rebuilds the index from the tree (names, sizes, mtimes);
      until it has passed a key's shard, a lookup that is not already known answers ``RETRY``.
    * **Never raises into the engine.** I/O errors are failed jobs, counted and logged (rate-limited);
      ``ENOSPC`` switches on back-pressure: stores are dropped and counted for ``full_backoff`` s.

Lookups are answered from the in-memory index (a dict membership test: no syscall).

The class is assembled from three parts: this module (API, submission, loads, bookkeeping),
:mod:`~kvtier.tiers.fs_store` (the store path) and :mod:`~kvtier.tiers.fs_scan` (keeping the index
equal to the tree); the per-block syscalls live in :mod:`~kvtier.tiers.fs_io`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from kvtier import codec
from kvtier.config import parse_size
from kvtier.errors import ConfigError
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.policies.base import CachePolicy
from kvtier.tiers.base import SecondaryTier, TierContext
from kvtier.tiers.fs_accounting import AccountingState, SharedAccounting
from kvtier.tiers.fs_io import read_block
from kvtier.tiers.fs_layout import Layout, probe_direct_io
from kvtier.tiers.fs_policy import make_policy
from kvtier.tiers.fs_scan import IndexSync
from kvtier.tiers.fs_store import Job, StorePath
from kvtier.tiers.ratelog import RateLimitedLog
from kvtier.transfer.workers import Priority, WorkerPool

__all__ = ["FsTier"]

log = logging.getLogger("kvtier.tiers.fs")
_VERIFY = ("always", "never")
_DIRECT = ("auto", "always", "never")
_ACCESS_GRANULARITY = 60.0  # seconds between two mtime refreshes of one block on load


class FsTier(StorePath, IndexSync, SecondaryTier):
    """KV blocks as files under ``root_dir/<namespace>/``.

    Options (config keys of the ``secondary_tiers`` entry):
        root_dir: directory shared by every process and namespace (required).
        max_bytes: capacity, an integer or a size such as ``"200GiB"``; ``None`` = unbounded.
        eviction_policy: registered policy name (``lru``, ``arc``, ...) that picks victims.
        policy_options: keyword options for that policy.
        verify: ``"always"`` (check every payload checksum on load) or ``"never"`` (header only).
        fsync: ``True`` syncs each file and its directory before a store is reported done.
        direct_io: ``"auto"`` (``O_DIRECT`` writes when the filesystem supports them and the slot
            is aligned), ``"always"`` (error if unsupported) or ``"never"``.
        threads: I/O worker threads. batch_blocks: blocks per worker task.
        full_backoff: seconds stores are dropped after ``ENOSPC``.
        record_access: refresh a file's mtime when it is loaded, at most once a minute (restart
            keeps the access order).
        log_interval: seconds between two log lines of the same kind.
        refresh_interval: seconds between two checks for other processes' stores and evictions.
        precreate_dirs: create all shard directories in the background after the start-up scan
            (a young tree then pays no mkdir on the store path).
    """

    medium: ClassVar[str] = "STORAGE"
    tolerates_off_thread_polling: ClassVar[bool] = True
    persistent: ClassVar[bool] = True
    shared: ClassVar[bool] = True

    def __init__(
        self,
        *,
        primary_kv_view: memoryview,
        context: TierContext,
        root_dir: str | os.PathLike[str] | None = None,
        max_bytes: int | str | None = None,
        eviction_policy: str = "lru",
        policy_options: dict[str, Any] | None = None,
        verify: str = "always",
        fsync: bool = False,
        direct_io: str | bool = "auto",
        threads: int = 4,
        batch_blocks: int = 4,
        full_backoff: float = 1.0,
        record_access: bool = True,
        log_interval: float = 10.0,
        refresh_interval: float = 0.5,
        precreate_dirs: bool = True,
    ) -> None:
        super().__init__(primary_kv_view=primary_kv_view, context=context)
        if root_dir is None:
            raise ConfigError("root_dir", 'missing; give a directory such as "/mnt/nvme/kvtier"')
        if verify not in _VERIFY:
            raise ConfigError("verify", f"expected one of {', '.join(_VERIFY)}, got {verify!r}")
        if isinstance(direct_io, bool):
            direct_io = "always" if direct_io else "never"
        if direct_io not in _DIRECT:
            raise ConfigError("direct_io", f"expected one of {', '.join(_DIRECT)}, got {direct_io!r}")
        if not isinstance(threads, int) or threads < 1:
            raise ConfigError("threads", f"expected an integer >= 1, got {threads!r}")
        if not isinstance(batch_blocks, int) or batch_blocks < 1:
            raise ConfigError("batch_blocks", f"expected an integer >= 1, got {batch_blocks!r}")
        self.max_bytes: int | None = None if max_bytes is None else parse_size(max_bytes, "max_bytes")
        self.layout = Layout(os.fspath(root_dir), context.namespace, context.block_bytes)
        if self.max_bytes is not None and self.max_bytes < self.layout.file_size(32):
            raise ConfigError(
                "max_bytes",
                f"{self.max_bytes} bytes hold no block file of {self.layout.file_size(32)} bytes; raise it",
            )
        # Policy capacity is in blocks; the byte limit is enforced by the accounting, the policy
        # only needs room for every block the bytes can hold.
        cap = (self.max_bytes // self.layout.block_bytes) + 1 if self.max_bytes else 1 << 40
        self._policy_name = eviction_policy
        self._policy_options = dict(policy_options or {})
        self._policy: CachePolicy = make_policy(eviction_policy, cap, self._policy_options)
        self.layout.ensure("root_dir")
        self.verify = verify == "always"
        self.fsync = bool(fsync)
        self.threads = threads
        self.batch_blocks = batch_blocks
        self.full_backoff = float(full_backoff)
        self.record_access = bool(record_access)
        self.refresh_interval = float(refresh_interval)
        self.precreate_dirs = bool(precreate_dirs)
        self._rlog = RateLimitedLog(log, log_interval)
        self._token = f"{os.getpid()}-{os.urandom(4).hex()}"
        self._acct = SharedAccounting(self.layout.ns_dir, self._token, fsync=self.fsync)
        probed = direct_io != "never" and probe_direct_io(self._acct.tmp_dir)
        if direct_io == "always" and not probed:
            self._acct.close()
            raise ConfigError(
                "direct_io", f"O_DIRECT is not supported under {self.layout.ns_dir}; use auto or never"
            )
        self.direct_io = probed

        self._lock = threading.Lock()
        self._index: dict[BlockKey, int] = {}
        self._access: dict[BlockKey, float] = {}
        self._storing: set[BlockKey] = set()
        self._init_store_path()
        self._loading: Counter[BlockKey] = Counter()
        self._results: deque[JobResult] = deque()
        self._jobs_open = 0
        self._seq = itertools.count()
        self._dirs_made: set[str] = set()
        self._full_until = 0.0
        self._closed = False
        # Warm restart state: top-level shards already scanned (lookups there are authoritative).
        self._top_done = bytearray(256)
        # One listing of the namespace directory (<= ~260 entries) now: top-level shards that do not
        # exist hold nothing, so lookups there are authoritative MISSes at once (a fresh tree never
        # answers RETRY).
        present = self.layout.present_tops()
        # A tree with every top-level shard was pre-created before (leaves appear on demand).
        self.precreate_dirs = self.precreate_dirs and len(present) < 256
        for top in range(256):
            if top not in present:
                self._top_done[top] = 1
        self._scan_done = False
        self._tombstones: set[BlockKey] = set()
        self.scan_files = 0
        self.scan_seconds = 0.0
        self._pool = WorkerPool(threads, name=f"kvtier-fs-{context.name}", logger=log)
        self._rescan_wanted = False
        self._wake = threading.Event()
        #: Set once the start-up scan and the shard-directory pre-creation are done.
        self.tree_ready = threading.Event()
        self._acct.on_events = self._apply_events
        self._acct.on_epoch_change = self._on_epoch_change
        self._scan_thread = threading.Thread(
            target=self._maintain, name=f"kvtier-fs-index-{context.name}", daemon=True
        )
        self._scan_thread.start()

    # -- lookups (engine thread; dict membership only) ---------------------------------------
    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        self.stats.lookups += 1
        if key in self._index:
            self.stats.hits += 1
            return LookupResult.HIT
        if self._scan_done or self._top_done[Layout.shard_of(key) >> 4]:
            return LookupResult.MISS
        return LookupResult.RETRY

    def lookup_many(self, keys: Sequence[BlockKey], req_context: Any = None) -> list[LookupResult]:
        if not self._scan_done:
            return [self.lookup(k) for k in keys]
        index, hit, miss = self._index, LookupResult.HIT, LookupResult.MISS
        out = [hit if k in index else miss for k in keys]  # ~60 ns a key, no syscall
        self.stats.lookups += len(keys)
        self.stats.hits += out.count(hit)
        return out

    @property
    def scan_done(self) -> bool:
        return self._scan_done

    def wait_scan(self, timeout: float | None = None) -> bool:
        """Block until the start-up scan finished (tests, tools)."""
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while not self._scan_done and time.monotonic() < deadline:
            time.sleep(0.002)
        return self._scan_done

    def refresh(self) -> None:
        """Apply other processes' stores and evictions now (normally done every refresh_interval)."""
        with self._acct.section():
            pass

    # -- job submission (engine thread; never blocks on I/O) ----------------------------------
    def _chunks(self, items: list[tuple[BlockKey, int]]) -> list[list[tuple[BlockKey, int]]]:
        per = max(1, min(self.batch_blocks, -(-len(items) // self.threads)))
        return [items[i : i + per] for i in range(0, len(items), per)]

    def _finish_now(self, job: TransferJob, success: bool, error: str | None = None) -> None:
        with self._lock:
            self._results.append(JobResult(job.job_id, success, None, 0, 0.0, error))

    def submit_store(self, job: TransferJob) -> None:
        if self._closed:
            with self._lock:
                self.stats.failed_jobs += 1
            self._finish_now(job, False, "tier is shut down")
            return
        if time.monotonic() < self._full_until:
            # Back-pressure: the disk said ENOSPC recently; do not queue bytes it cannot take.
            with self._lock:
                self.stats.dropped_stores += len(job.keys)
                self.stats.failed_jobs += 1
            self._finish_now(job, False, "disk full: store dropped (back-pressure)")
            return
        items: list[tuple[BlockKey, int]] = []
        skipped: set[BlockKey] = set()
        with self._lock:
            for key, slot in zip(job.keys, job.slot_ids, strict=True):
                if key in self._index or key in self._storing:
                    skipped.add(key)  # already held (or on its way): counts as stored
                    if key in self._policy:
                        self._policy.touch(key)  # offered again = in use: not the next victim
                    continue
                self._storing.add(key)
                items.append((key, int(slot)))
            if not items:
                self._results.append(JobResult(job.job_id, True))
                return
            chunks = self._chunks(items)
            state = Job(job, len(chunks), ok=skipped, items=items)
            self._grant_q.append(state)  # reserved with the jobs ahead of it when possible
            self._jobs_open += 1
        for chunk in chunks:
            self._pool.submit(Priority.STORE, functools.partial(self._store_chunk, state, chunk))

    def submit_load(self, job: TransferJob) -> None:
        if self._closed:
            with self._lock:
                self.stats.failed_jobs += 1
            self._finish_now(job, False, "tier is shut down")
            return
        items = [(k, int(s)) for k, s in zip(job.keys, job.slot_ids, strict=True)]
        if not items:
            self._finish_now(job, True)
            return
        chunks = self._chunks(items)
        with self._lock:
            self._loading.update(job.keys)
            state = Job(job, len(chunks))
            self._jobs_open += 1
        for chunk in chunks:
            self._pool.submit(Priority.LOAD, functools.partial(self._load_chunk, state, chunk))

    def get_finished_jobs(self) -> list[JobResult]:
        with self._lock:
            out = list(self._results)
            self._results.clear()
        return out

    def has_pending_work(self) -> bool:
        return self._jobs_open > 0 or bool(self._results)

    def drain(self) -> None:
        self._pool.wait_idle()

    def touch(self, keys: Iterable[BlockKey]) -> None:
        now = time.time()
        with self._lock:
            for k in keys:
                if k in self._index and k in self._policy:
                    self._policy.touch(k)
                    self._access[k] = now

    # -- completion bookkeeping -------------------------------------------------------------
    def _chunk_done(self, state: Job, ok: list[BlockKey], nbytes: int, error: str | None, load: bool) -> None:
        with self._lock:
            state.ok.update(ok)
            state.nbytes += nbytes
            if error and not state.error:
                state.error = error
            state.chunks_left -= 1
            if state.chunks_left:
                return
            job = state.job
            if load:
                self._loading.subtract(job.keys)
                for k in job.keys:
                    if self._loading[k] <= 0:
                        del self._loading[k]
            self._report_locked(state)

    def _report_locked(self, state: Job) -> None:
        job = state.job
        success = all(k in state.ok for k in job.keys)
        if not success:
            self.stats.failed_jobs += 1
        partial = None if success else frozenset(state.ok)
        seconds = time.perf_counter() - state.t0
        self._results.append(JobResult(job.job_id, success, partial, state.nbytes, seconds, state.error))
        self._jobs_open -= 1

    # -- loads -------------------------------------------------------------------------------
    def _load_chunk(self, state: Job, items: list[tuple[BlockKey, int]]) -> None:
        ok: list[BlockKey] = []
        nbytes = 0
        error: str | None = None
        try:
            for key, slot in items:
                err = self._load_one(key, slot)
                if err is None:
                    ok.append(key)
                    nbytes += self.block_bytes
                else:
                    error = error or err
        finally:
            now = time.time()
            with self._lock:
                self.stats.loads += len(ok)
                self.stats.bytes_read += nbytes
                for k in ok:
                    if k in self._index and k in self._policy:
                        self._policy.touch(k)
                        self._access[k] = now
            self._chunk_done(state, ok, nbytes, error, load=True)

    def _load_one(self, key: BlockKey, slot: int) -> str | None:
        """Fill ``slot`` with ``key``'s payload; ``None`` on success, else a short reason."""
        path = self.layout.path_of(key)
        try:
            read_block(path, key, self.slot_array(slot).data, self.layout.ns_tag, verify=self.verify)
        except FileNotFoundError:
            self._drop_stale(key)
            return "missing"
        except codec.CorruptBlockError as exc:
            self._drop_corrupt(key, path, exc.reason)
            return f"corrupt: {exc.reason}"
        except OSError as exc:
            self._rlog.warning("read", f"kvtier fs {self.name}: read failed for {path}: {exc}")
            return f"read error: {exc.strerror or exc}"
        # The access order survives a restart through mtime. Refreshing it costs an inode write,
        # so it is done at most once a minute per block (restart order is that coarse anyway).
        if self.record_access and time.time() - self._access.get(key, 0.0) > _ACCESS_GRANULARITY:
            with contextlib.suppress(OSError):
                os.utime(path)
        return None

    def _drop_stale(self, key: BlockKey) -> None:
        # Another process evicted it (or someone deleted it): forget it; nothing to account.
        with self._lock:
            if key in self._index:
                self._forget_locked(key)

    def _drop_corrupt(self, key: BlockKey, path: str, reason: str) -> None:
        self._rlog.warning("corrupt", f"kvtier fs {self.name}: removed corrupt block {path} ({reason})")
        with self._lock:
            self.stats.corrupt += 1
            if key in self._index:
                self._forget_locked(key)
        try:
            with self._acct.section() as st:
                self._acct.unlink_files(st, [path])
                self._acct.log_events(st, [(b"-", bytes(key))])
        except OSError as exc:
            self._rlog.warning("acct", f"kvtier fs {self.name}: cannot remove {path}: {exc}")

    # -- introspection -----------------------------------------------------------------------
    def usage(self, recover: bool = True) -> AccountingState:
        """The shared accounting (published + reserved bytes of every process); takes the lock.

        With ``recover`` (default) the sections of dead processes are cleaned up first.
        """
        return self._acct.snapshot(recover)

    def indexed_keys(self) -> set[BlockKey]:
        with self._lock:
            return set(self._index)

    def get_stats(self) -> dict[str, int]:
        with self._lock:  # workers resize the index concurrently
            d = self.stats.as_dict()
            d["index_blocks"] = len(self._index)
            d["index_bytes"] = sum(self._index.values())
        d["acct_sections"] = self._acct.sections
        d["scan_done"] = int(self._scan_done)
        d["scan_files"] = self.scan_files
        return d

    def config_info(self) -> dict[str, Any]:
        info = super().config_info()
        info.update(
            root_dir=self.layout.root_dir, ns_dir=self.layout.ns_dir, max_bytes=self.max_bytes,
            eviction_policy=self._policy_name, verify="always" if self.verify else "never",
            fsync=self.fsync, direct_io=self.direct_io, threads=self.threads,
        )  # fmt: skip
        return info

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._pool.wait_idle()
        self._pool.stop(timeout=10)
        self._scan_thread.join(timeout=30)
        self._acct.close()
