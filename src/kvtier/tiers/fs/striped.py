"""The fs tier over several disks (``root_dirs``): striping, per-disk limits, health and deadlines.

:class:`StripedFsTier` is what ``FsTier(root_dirs=[...])`` builds: one complete one-root
:class:`~kvtier.tiers.fs.tier.FsTier` per root (its own index, accounting file, event log, workers
and ``max_bytes`` share, so everything docs/fs.md says of one root holds per root, crash safety
included), and in front of them:

* **Placement** (:mod:`kvtier.tiers.fs.placement`): a new block goes to the admitted root with the
  highest rendezvous score for its key, weighted by the roots' capacities. Every process with the
  same roots places a key alike, and a restart with a root added or removed moves only that root's
  share. Lookups ask every admitted root's in-memory index (a dict test each, no system call), so
  a block is found wherever it is: one stored while its preferred root was fenced, or placed under
  an older set of roots, or spilled: a store whose root has its ``threads`` worth of blocks queued
  beyond the runner-up's (a burst of other jobs) goes to the runner-up.
* **Health** (:mod:`kvtier.tiers.fs.health`): a root whose jobs fail with a disk error, or that
  stalls past ``io_timeout``, is fenced: its blocks answer MISS, its stores go to the other roots;
  it is probed every ``probe_interval`` s off the engine's thread and readmitted when a probe passes.
* **Deadlines**: every job has one (``io_timeout`` s after submission). A job whose sub-jobs are
  not all back by then is reported at once: a load without the late root's keys (misses), a store
  as failed. The late root is fenced. The engine is never blocked: :meth:`drain` waits for each
  root at most ``io_timeout``. A late load chunk that has not started reading skips its reads
  (:meth:`FsTier.abandon <kvtier.tiers.fs.tier.FsTier.abandon>`); a read already inside the kernel
  cannot be called back (docs/fs.md, "When a disk fails").

Jobs are split by root into sub-jobs with ids of this tier's own; their results are merged back when
the engine polls (:meth:`get_finished_jobs`) and by a monitor thread that enforces deadlines and runs
probes, so a stalled root turns into misses within its deadline even between polls.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kvtier.config import parse_size
from kvtier.errors import ConfigError, MisuseError
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.tiers.async_tier import check_seconds
from kvtier.tiers.base import (
    SecondaryTier,
    TierContext,
)
from kvtier.tiers.fs.accounting import AccountingState
from kvtier.tiers.fs.health import RootHealth, disk_failure, probe_root
from kvtier.tiers.fs.layout import SIM_KEY_BYTES, block_file_size
from kvtier.tiers.fs.placement import Placement
from kvtier.tiers.fs.roots import RootClass, RootSpec, RootTier, check_fenced, read_roots
from kvtier.tiers.ratelog import RateLimitedLog

__all__ = ["RootTier", "StripedFsTier", "striped_defaults"]

log = logging.getLogger("kvtier.tiers.fs")

_IO_TIMEOUT = 5.0
_PROBE_INTERVAL = 1.0
_FENCE_ERRORS = 3
_COUNTERS = ("bytes_read", "bytes_written", "stores", "loads", "evictions", "corrupt", "dropped_stores")


def striped_defaults(options: Mapping[str, Any]) -> tuple[float, float, int]:
    """``(io_timeout, probe_interval, fence_errors)`` of ``options``, checked (``ConfigError``)."""
    io_timeout = check_seconds("io_timeout", _or(options.get("io_timeout"), _IO_TIMEOUT))
    probe = check_seconds("probe_interval", _or(options.get("probe_interval"), _PROBE_INTERVAL))
    fence = _or(options.get("fence_errors"), _FENCE_ERRORS)
    if isinstance(fence, bool) or not isinstance(fence, int) or not 1 <= fence <= 1000:
        raise ConfigError("fence_errors", f"expected an integer 1..1000, got {fence!r}")
    return io_timeout, probe, fence


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


@dataclass(eq=False)
class _Job:
    """A submitted job of the striped tier: its sub-jobs still out, and what came back."""

    job: TransferJob
    load: bool
    deadline: float
    t0: float = field(default_factory=time.perf_counter)
    pending: set[int] = field(default_factory=set)
    ok: set[BlockKey] = field(default_factory=set)
    nbytes: int = 0
    error: str | None = None


class StripedFsTier(SecondaryTier):
    """KV blocks striped over several fs roots (see the module doc).

    Options (besides every :class:`~kvtier.tiers.fs.tier.FsTier` option but ``root_dir``, applied
    to each root; ``threads`` is per root, so each disk gets its own workers):
        root_dirs: the roots, each a path or ``{"path": ..., "max_bytes": ...}``.
        max_bytes: the total; roots without their own share it by free space.
        io_timeout: seconds a job may take (default 5).
        probe_interval: seconds between two probes of a fenced root (default 1).
        fence_errors: failed jobs in a row (of errors that are not disk failures) that fence a root.
        simulate_fenced: root indexes ``replay --simulate`` and ``plan`` model as fenced (ignored by
            the real tier, which fences on what it sees).
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
        root_dirs: Sequence[Any],
        root_dir: Any = None,
        max_bytes: int | str | None = None,
        io_timeout: float | None = None,
        probe_interval: float | None = None,
        fence_errors: int | None = None,
        simulate_fenced: Sequence[int] | None = None,
        root_cls: RootClass,
        **options: Any,
    ) -> None:
        super().__init__(primary_kv_view=primary_kv_view, context=context)
        specs = self._specs(context, root_dir, root_dirs, max_bytes, options)
        self.io_timeout, self.probe_interval, self.fence_errors = striped_defaults(
            {"io_timeout": io_timeout, "probe_interval": probe_interval, "fence_errors": fence_errors}
        )
        self.specs = specs
        self.max_bytes = (
            None if any(s.max_bytes is None for s in specs) else sum(s.max_bytes or 0 for s in specs)
        )
        self.placement = Placement([s.path for s in specs], [s.weight for s in specs])
        self.rlog = RateLimitedLog(log, float(options.get("log_interval", 10.0)))
        #: One one-root tier per root, in ``root_dirs`` order.
        self.roots: list[RootTier] = []
        try:
            for i, spec in enumerate(specs):
                ctx = dataclasses.replace(context, name=f"{context.name}[{i}]")
                try:
                    tier = root_cls(
                        primary_kv_view=primary_kv_view, context=ctx, root_dir=spec.path,
                        max_bytes=spec.max_bytes, **options,
                    )  # fmt: skip
                except ConfigError as exc:
                    if exc.key_path in ("root_dir", "max_bytes"):
                        raise ConfigError(f"root_dirs[{i}]", exc.detail) from exc
                    raise
                self.roots.append(tier)
        except BaseException:
            for tier in self.roots:
                tier.shutdown()
            raise
        self.health = [RootHealth() for _ in specs]
        self._last_stats: list[dict[str, int]] = [{} for _ in specs]
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._jobs: dict[int, _Job] = {}
        self._subjobs: dict[int, tuple[int, _Job, Sequence[BlockKey]]] = {}
        #: Blocks of the sub-jobs each root has not reported yet (what a burst spills by).
        self._queued = [0] * len(specs)
        self._results: list[JobResult] = []
        self._closed = False
        self._stop = threading.Event()
        self._tick = min(max(self.io_timeout / 4, 0.01), 0.25)
        #: How long a call into a root may wait for its lock (held only across a few system calls
        #: when the disk is healthy) before the root counts as stalled.
        self._call_timeout = min(0.05, self.io_timeout / 10)
        self._monitor = threading.Thread(target=self._watch, name=f"kvtier-{self.name}-health", daemon=True)
        self._monitor.start()

    @staticmethod
    def _specs(
        context: TierContext, root_dir: Any, root_dirs: Any, max_bytes: Any, options: Mapping[str, Any]
    ) -> list[RootSpec]:
        if root_dir is not None:
            raise ConfigError("root_dir", "give root_dir (one disk) or root_dirs (several), not both")
        total = None if max_bytes is None else parse_size(max_bytes, "max_bytes")
        return read_roots(root_dirs, total, block_file_size(SIM_KEY_BYTES, context.block_bytes))

    @classmethod
    def check_options(  # type: ignore[override]
        cls, context: TierContext, options: Mapping[str, Any], *, root_cls: RootClass
    ) -> None:
        """Every check of the constructor that writes nothing: the roots, the striped options, and
        each root's :meth:`FsTier.check_options` with its own share of ``max_bytes``."""
        opts = dict(options)
        specs = cls._specs(
            context, opts.pop("root_dir", None), opts.pop("root_dirs"), opts.pop("max_bytes", None), opts
        )
        striped_defaults(opts)
        for key in ("io_timeout", "probe_interval", "fence_errors", "simulate_fenced"):
            opts.pop(key, None)
        check_fenced(options.get("simulate_fenced"), len(specs))
        for i, spec in enumerate(specs):
            try:
                root_cls.check_options(context, {**opts, "root_dir": spec.path, "max_bytes": spec.max_bytes})
            except ConfigError as exc:
                if exc.key_path in ("root_dir", "max_bytes"):
                    raise ConfigError(f"root_dirs[{i}]", exc.detail) from exc
                raise

    # -- lookups (engine thread; dict membership per admitted root) ---------------------------------
    def _admitted(self) -> list[int]:
        return [i for i, h in enumerate(self.health) if not h.fenced]

    def _holder(self, key: BlockKey, admitted: Iterable[int]) -> int | None:
        roots = self.roots
        for i in admitted:
            if key in roots[i].index.sizes:
                return i
        return None

    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        self.stats.lookups += 1
        retry = False
        for i in self._admitted():
            answer = self.roots[i].index.answer(key)
            if answer is LookupResult.HIT:
                self.stats.hits += 1
                return answer
            retry = retry or answer is LookupResult.RETRY
        return LookupResult.RETRY if retry else LookupResult.MISS

    def lookup_many(self, keys: Sequence[BlockKey], req_context: Any = None) -> list[LookupResult]:
        return [self.lookup(k, req_context) for k in keys]

    def touch(self, keys: Iterable[BlockKey]) -> None:
        keys = list(keys)
        for i in self._admitted():
            if self.roots[i].responsive(0.0):  # a hint: never worth waiting for a busy root
                self.roots[i].touch(keys)

    # -- jobs ------------------------------------------------------------------------------------
    def submit_store(self, job: TransferJob) -> None:
        slots = self._check_job(job)
        admitted = self._admitted()
        state = _Job(job, False, time.monotonic() + self.io_timeout)
        if self._closed or not admitted:
            why = "tier is shut down" if self._closed else "every root is fenced: store dropped"
            if not self._closed:
                self.stats.dropped_stores += len(job.keys)
            self._finish_now(state, why)
            return
        groups: dict[int, tuple[list[BlockKey], list[int]]] = {}
        choose, queued = self.placement.choose_two, self._queued
        for key, slot in zip(job.keys, slots, strict=True):
            if self._holder(key, admitted) is not None:
                state.ok.add(key)  # held (on its root or where a fenced root's store went)
                continue
            root, second = choose(bytes(key), admitted)
            assert root is not None
            # A burst: the key's root has a round of work (its threads' worth of blocks) queued
            # beyond the runner-up's, from other jobs; the runner-up takes it (lookups ask every root).
            if second is not None and queued[root] >= queued[second] + self.roots[root].threads:
                root = second
            ks, ss = groups.setdefault(root, ([], []))
            ks.append(key)
            ss.append(slot)
        self._launch(state, groups)

    def submit_load(self, job: TransferJob) -> None:
        slots = self._check_job(job)
        state = _Job(job, True, time.monotonic() + self.io_timeout)
        if self._closed:
            self._finish_now(state, "tier is shut down")
            return
        admitted = self._admitted()
        groups: dict[int, tuple[list[BlockKey], list[int]]] = {}
        for key, slot in zip(job.keys, slots, strict=True):
            root = self._holder(key, admitted)
            if root is None:
                state.error = state.error or "missing"
                continue
            ks, ss = groups.setdefault(root, ([], []))
            ks.append(key)
            ss.append(slot)
        self._launch(state, groups)

    def _launch(self, state: _Job, groups: dict[int, tuple[list[BlockKey], list[int]]]) -> None:
        job = state.job
        subs = []
        with self._lock:
            self._jobs[job.job_id] = state
            for root, (keys, slots) in groups.items():
                sub_id = next(self._ids)
                state.pending.add(sub_id)
                self._subjobs[sub_id] = (root, state, keys)
                self._queued[root] += len(keys)
                subs.append((root, TransferJob(
                    sub_id, keys, np.asarray(slots, dtype=np.int32), job.is_promotion, job.req_context,
                    job.submit_time,
                )))  # fmt: skip
            if not subs:
                self._complete_locked(state)
                return
        for root, sub in subs:
            tier = self.roots[root]
            if not tier.responsive(self._call_timeout):
                # A worker holds the root's lock in a stalled system call: calling in would block
                # the engine. Fence it; the sub-job is given up (a load's keys miss; a store fails).
                self._fence(root, "stalled: its lock is held by I/O that does not return")
                with self._lock:
                    self._forget_locked(sub.job_id)
                    state.pending.discard(sub.job_id)
                    state.error = state.error or f"root {root} stalled"
                    if not state.pending:
                        self._complete_locked(state)
                continue
            (tier.submit_load if state.load else tier.submit_store)(sub)

    def get_finished_jobs(self) -> list[JobResult]:
        self._poll()
        with self._lock:
            out, self._results = self._results, []
        return out

    def has_pending_work(self) -> bool:
        return bool(self._jobs) or bool(self._results)

    def drain(self) -> None:
        """Wait until no root still works on a job, at most ``io_timeout`` in all: a root still busy
        then is fenced (stalled) and its jobs are given up as their deadlines say."""
        end = time.monotonic() + self.io_timeout
        for i, tier in enumerate(self.roots):
            if not tier.wait_idle(max(end - time.monotonic(), 0.0)):
                self._fence(i, f"stalled: still busy {self.io_timeout:g} s into a drain")
        self._poll(force_deadline=True)

    # -- merging sub-jobs, deadlines, fencing ----------------------------------------------------------
    def _poll(self, force_deadline: bool = False) -> None:
        """Merge the roots' finished sub-jobs; give up sub-jobs past their job's deadline (and, with
        ``force_deadline``, those on fenced roots: a drain or shutdown does not wait for them)."""
        now = time.monotonic()
        with self._lock:
            for i, tier in enumerate(self.roots):
                # Never wait for a root's lock here: a worker stalled in I/O may hold it (its jobs
                # then meet their deadline below).
                for r in tier.finished_nowait() or ():
                    self._merge_locked(i, r)
            for state in [s for s in self._jobs.values() if s.pending]:
                expired = now >= state.deadline
                for sub_id in list(state.pending):
                    root = self._subjobs[sub_id][0]
                    if not (expired or (force_deadline and self.health[root].fenced)):
                        continue
                    self._forget_locked(sub_id)
                    state.pending.discard(sub_id)
                    self.roots[root].abandon(sub_id)
                    self.health[root].timeouts += 1
                    self._fence_locked(root, f"stalled: a job ran past io_timeout ({self.io_timeout:g} s)")
                    state.error = state.error or f"root {root} stalled past io_timeout"
                if not state.pending:
                    self._complete_locked(state)

    def _merge_locked(self, root: int, r: JobResult) -> None:
        entry = self._forget_locked(r.job_id)
        health = self.health[root]
        health.observe(r.seconds)
        if not r.success:
            kind = disk_failure(r.error)
            if kind is not None:
                health.errors += 1
                health.consecutive += 1
                if kind != "error":
                    self._fence_locked(root, f"{kind}: {r.error}")
                elif health.consecutive >= self.fence_errors:
                    self._fence_locked(root, f"{health.consecutive} failed jobs in a row: {r.error}")
        else:
            health.consecutive = 0
        if entry is None:
            return  # a sub-job given up at its deadline: its job was reported then
        _, state, keys = entry
        state.pending.discard(r.job_id)
        state.ok.update(r.transferred(keys))
        state.nbytes += r.nbytes
        if r.error and not state.error:
            state.error = r.error
        if not state.pending:
            self._complete_locked(state)

    def _forget_locked(self, sub_id: int) -> tuple[int, _Job, Sequence[BlockKey]] | None:
        entry = self._subjobs.pop(sub_id, None)
        if entry is not None:
            self._queued[entry[0]] -= len(entry[2])
        return entry

    def _complete_locked(self, state: _Job) -> None:
        job = state.job
        if self._jobs.pop(job.job_id, None) is None:
            return
        success = state.ok.issuperset(job.keys)
        error = None if success else state.error
        if not success:
            self.stats.failed_jobs += 1
            if error is None:
                error = f"{len(set(job.keys) - state.ok)} of {len(set(job.keys))} key(s) not transferred"
        partial = None if success else frozenset(state.ok)
        seconds = time.perf_counter() - state.t0
        self._results.append(JobResult(job.job_id, success, partial, state.nbytes, seconds, error))

    def _finish_now(self, state: _Job, error: str) -> None:
        state.error = error
        with self._lock:
            self._jobs[state.job.job_id] = state
            self._complete_locked(state)

    def _fence(self, root: int, reason: str) -> None:
        with self._lock:
            self._fence_locked(root, reason)

    def _fence_locked(self, root: int, reason: str) -> None:
        if self.health[root].fence(reason, time.monotonic(), self.probe_interval):
            self.rlog.warning(
                f"fence{root}",
                f"kvtier fs {self.name}: fenced root {self.specs[root].path} ({reason}); its blocks are "
                "misses and its stores go to the other roots until a probe passes",
            )

    def _check_job(self, job: TransferJob) -> list[int]:
        # Checked here, before any sub-job exists (a root raising mid-split would strand the others).
        slots: list[int] = np.asarray(job.slot_ids).tolist()
        n = self.rows.shape[0]
        for s in slots:
            if not 0 <= s < n:
                raise MisuseError(f"tier {self.name!r}: job {job.job_id} names slot {s} outside 0..{n - 1}")
        with self._lock:
            if job.job_id in self._jobs:
                raise MisuseError(f"tier {self.name!r}: job id {job.job_id} is already in flight")
        return slots

    # -- the monitor: deadlines between polls, probes of fenced roots -----------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self._tick):
            try:
                self._poll()
                self._start_probes()
            except Exception:  # never let the monitor die: log and keep watching
                self.rlog.warning("monitor", f"kvtier fs {self.name}: health monitor error", exc_info=True)

    def _start_probes(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [i for i, h in enumerate(self.health) if h.fenced and not h.probing and now >= h.next_probe]
            for i in due:
                self.health[i].probing = True
        for i in due:
            threading.Thread(
                target=self._probe, args=(i,), name=f"kvtier-{self.name}-probe{i}", daemon=True
            ).start()

    def _probe(self, root: int) -> None:
        tier = self.roots[root]
        acct = tier.accounting
        name = f"{acct.token}.{(1 << 62) + next(self._ids)}"  # a temp-file name of this process
        error = probe_root(acct.tmp_dir, name, 2 * tier.layout.file_size(SIM_KEY_BYTES))
        with self._lock:
            health = self.health[root]
            health.probing = False
            health.probes += 1
            health.next_probe = time.monotonic() + self.probe_interval
            if error is None and health.fenced:
                health.readmit()
                log.info("kvtier fs %s: readmitted root %s (probe passed)", self.name, self.specs[root].path)
            elif error is not None:
                health.reason = error

    # -- shutdown, introspection -----------------------------------------------------------------
    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._monitor.join(timeout=5)
        # A stalled root cannot finish its jobs: each root is shut down on its own thread and waited
        # for a bounded time, so the engine's exit never hangs on one disk.
        threads = [threading.Thread(target=t.shutdown, daemon=True) for t in self.roots]
        for t in threads:
            t.start()
        end = time.monotonic() + max(self.io_timeout, 5.0)
        for i, t in enumerate(threads):
            t.join(max(end - time.monotonic(), 0.0))
            if t.is_alive():
                log.warning(
                    "kvtier fs %s: root %s did not shut down in time (stalled)", self.name, self.specs[i].path
                )
        self._poll(force_deadline=True)
        with self._lock:
            for state in list(self._jobs.values()):
                state.error = state.error or "tier is shut down"
                state.pending.clear()
                self._complete_locked(state)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def scan_done(self) -> bool:
        return all(t.scan_done for t in self.roots)

    def wait_scan(self, timeout: float | None = None) -> bool:
        end = time.monotonic() + (timeout if timeout is not None else 1e9)
        return all(t.wait_scan(max(end - time.monotonic(), 0.0)) for t in self.roots)

    def refresh(self) -> None:
        for i in self._admitted():
            self.roots[i].refresh()

    def usage(self, recover: bool = True) -> list[AccountingState]:
        """Each root's shared accounting (takes each root's lock)."""
        return [t.usage(recover) for t in self.roots]

    def indexed_keys(self) -> set[BlockKey]:
        out: set[BlockKey] = set()
        for t in self.roots:
            out |= t.indexed_keys()
        return out

    def fenced_roots(self) -> list[int]:
        with self._lock:
            return [i for i, h in enumerate(self.health) if h.fenced]

    def latency(self) -> dict[str, dict[str, Any]]:
        """Per-root job-latency histograms (``{"root0": {"buckets", "sum", "count"}}``)."""
        with self._lock:
            return {
                f"root{i}": {"buckets": h.buckets(), "sum": h.latency_sum, "count": sum(h.latency_counts)}
                for i, h in enumerate(self.health)
            }

    def get_stats(self) -> dict[str, int]:
        """The tier's counters (lookups, hits, failed jobs of its own; transfers, evictions and
        corrupt blocks summed over the roots), ``roots``/``roots_fenced``, and per root ``rootN_*``:
        ``used_bytes``, ``max_bytes``, ``index_blocks``, ``fenced``, ``fences``, ``readmits``,
        ``errors``, ``timeouts``, ``probes``, ``stores``, ``loads``."""
        for i, t in enumerate(self.roots):
            # A root whose lock a stalled worker holds keeps its last stats (never wait on a disk).
            if t.responsive(self._call_timeout):
                self._last_stats[i] = t.get_stats()
        per = list(self._last_stats)
        with self._lock:
            out = self.stats.as_dict()
            for k in _COUNTERS:
                out[k] = out.get(k, 0) + sum(p.get(k, 0) for p in per)
            out["roots"] = len(self.roots)
            out["roots_fenced"] = sum(h.fenced for h in self.health)
            out["used_bytes"] = sum(p.get("used_bytes", 0) for p in per)
            out["index_blocks"] = sum(p.get("index_blocks", 0) for p in per)
            if self.max_bytes is not None:
                out["max_bytes"] = self.max_bytes
            for i, (p, h) in enumerate(zip(per, self.health, strict=True)):
                pre = f"root{i}_"
                for k in ("used_bytes", "max_bytes", "index_blocks", "stores", "loads"):
                    if k in p:
                        out[pre + k] = p[k]
                out.update({
                    pre + "fenced": int(h.fenced), pre + "fences": h.fences, pre + "readmits": h.readmits,
                    pre + "errors": h.errors, pre + "timeouts": h.timeouts, pre + "probes": h.probes,
                })  # fmt: skip
        return out

    def config_info(self) -> dict[str, Any]:
        info = super().config_info()
        info.update(
            roots=[{"path": s.path, "max_bytes": s.max_bytes} for s in self.specs], max_bytes=self.max_bytes,
            io_timeout=self.io_timeout, probe_interval=self.probe_interval, fence_errors=self.fence_errors,
            threads_per_root=self.roots[0].threads, root=self.roots[0].config_info(),
        )  # fmt: skip
        return info
