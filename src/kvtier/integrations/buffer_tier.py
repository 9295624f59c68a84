"""One kvtier tier over an engine's own host buffer, for engines whose storage API is synchronous
(SGLang HiCache) or task-based (LMCache's L2 adapters).

Contract:
    * The engine's buffer is viewed as rows of ``row_bytes`` (a 2-D byte ``memoryview``); the tier
      reads and writes those rows in place: no copy between the engine and the tier.
    * :meth:`BufferTier.submit` starts a store or load of ``(key, row)`` pairs and calls ``done``
      exactly once, from the poller thread, with the keys that made it. :meth:`BufferTier.run`
      does the same and waits. A job that has not finished by ``deadline`` seconds is waited for
      by draining the tier (so it never touches rows the engine has reused) and reported failed.
    * :meth:`BufferTier.exists` answers per key; a tier that does not know yet (``RETRY``) is asked
      again until ``deadline``, then the key counts as missing.
    * Tier failures never raise here: a failed job is a miss (load) or an unstored block (store).
    * Tier calls are serialized under one lock (the tier contract allows one caller at a time).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvtier.errors import ConfigError
from kvtier.keys import BlockKey, LookupResult

__all__ = ["BufferTier", "Done", "JobCounters", "check_deadline"]

#: Called once per job with the keys transferred.
Done = Callable[[frozenset[BlockKey]], None]
#: Rows of a transfer: a list or an integer array (what an adapter computed them as).
Rows = Sequence[int] | npt.NDArray[np.integer[Any]]

_POLL_SECONDS = 0.0005
_MAX_TIMINGS = 4096


def check_deadline(key: str, value: object) -> float:
    """``value`` as seconds in (0, 600], else a one-line :class:`ConfigError` naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < float(value) <= 600:
        raise ConfigError(key, f"expected seconds in (0, 600], got {value!r}")
    return float(value)


@dataclass(slots=True)
class JobCounters:
    """What went through the adapter (read by the engines' stats hooks); every block is one row, so
    :meth:`BufferTier.stats` derives the bytes moved from the blocks."""

    stored_blocks: int = 0
    loaded_blocks: int = 0
    failed_blocks: int = 0
    timed_out_jobs: int = 0


@dataclass(slots=True)
class _Pending:
    keys: tuple[BlockKey, ...]
    load: bool
    done: Done
    started: float


class BufferTier:
    """A kvtier tier built over ``rows`` (see the module doc).

    Args:
        tier_config: one ``secondary_tiers`` entry (``type``/``module_path`` plus the tier's keys).
        rows: the engine buffer as a 2-D byte memoryview ``(num_rows, row_bytes)``.
        namespace: the tier context's namespace (hex): tiers that persist keep namespaces apart.
        deadline: seconds a job or an existence check may take before it counts as failed.
        plugins: the trust boundary for ``module_path`` (``kvtier.config.PluginsConfig``).
    """

    def __init__(
        self,
        tier_config: Mapping[str, Any],
        *,
        rows: memoryview,
        namespace: str,
        deadline: float,
        name: str = "engine",
        plugins: Any = None,
    ) -> None:
        from kvtier.plugins import create_tier
        from kvtier.tiers.base import TierContext

        self.deadline = deadline
        shape = rows.shape or (0, 0)
        self.num_rows, self.row_bytes = int(shape[0]), int(shape[1])
        context = TierContext(name=name, block_bytes=self.row_bytes, namespace=namespace)
        self.tier = create_tier(dict(tier_config), primary_kv_view=rows, context=context, plugins=plugins)
        self.counters = JobCounters()
        #: ``(blocks transferred, seconds)`` per store / load job since the last :meth:`take_timings`.
        self._timings: tuple[list[tuple[int, float]], list[tuple[int, float]]] = ([], [])
        self._lock = threading.Lock()  # tier calls, job table
        self._wake = threading.Condition(self._lock)
        self._pending: dict[int, _Pending] = {}
        self._next_id = 1
        self._closed = False
        self._poller = threading.Thread(target=self._poll_loop, name="kvtier-buffer-tier", daemon=True)
        self._poller.start()

    # -- existence ---------------------------------------------------------------------------
    def exists(self, keys: Sequence[BlockKey], *, stop_at_miss: bool = False) -> list[bool]:
        """Whether each key can be loaded (``RETRY`` is asked again until the deadline).

        With ``stop_at_miss`` every answer after the first miss is ``False``, and the tier is not
        asked again about keys past a miss it already reported."""
        answers: list[bool | None] = [None] * len(keys)
        end = time.monotonic() + self.deadline
        while True:
            todo = [i for i, a in enumerate(answers) if a is None]
            if not todo:
                break
            try:
                with self._lock:
                    got = self.tier.lookup_many([keys[i] for i in todo])
            except Exception:  # a misbehaving plug-in: a miss, never an engine crash
                got = [LookupResult.MISS] * len(todo)
            retry = False
            for i, res in zip(todo, got, strict=True):
                if res is LookupResult.HIT:
                    answers[i] = True
                elif res is LookupResult.MISS:
                    answers[i] = False
                else:
                    retry = True
            if stop_at_miss:
                first = next((i for i, a in enumerate(answers) if a is not True), len(keys))
                if first == len(keys) or answers[first] is False:
                    break
            if not retry or time.monotonic() >= end:
                break
            time.sleep(0.001)
        out = [a is True for a in answers]
        if stop_at_miss and False in out:
            first = out.index(False)
            out[first:] = [False] * (len(out) - first)
        return out

    def touch(self, keys: Sequence[BlockKey]) -> None:
        """Tell the tier ``keys`` were just used (its eviction keeps them longest)."""
        if not keys:
            return
        with contextlib.suppress(Exception), self._lock:
            self.tier.touch(keys)

    # -- transfers ---------------------------------------------------------------------------
    def submit(self, keys: Sequence[BlockKey], rows: Rows, *, load: bool, done: Done) -> None:
        """Start a store (``load=False``) or load of ``keys[i]`` at row ``rows[i]``; ``done`` is
        called exactly once with the keys transferred."""
        from kvtier.jobs import TransferJob

        if not keys:
            done(frozenset())
            return
        slots = np.asarray(rows, dtype=np.int32)
        with self._lock:
            if self._closed:
                job_id = 0
            else:
                job_id = self._next_id
                self._next_id += 1
                job = TransferJob(job_id, tuple(keys), slots, is_promotion=load)
                self._pending[job_id] = _Pending(tuple(keys), load, done, time.monotonic())
                try:
                    (self.tier.submit_load if load else self.tier.submit_store)(job)
                except Exception:
                    self._pending.pop(job_id, None)
                    job_id = 0
                self._wake.notify_all()
        if job_id == 0:
            with self._lock:
                self._count(load, len(keys), frozenset(), 0.0)
            done(frozenset())

    def run(self, keys: Sequence[BlockKey], rows: Rows, *, load: bool) -> frozenset[BlockKey]:
        """:meth:`submit` and wait: the keys transferred."""
        box: list[frozenset[BlockKey]] = []
        ready = threading.Event()

        def finished(ok: frozenset[BlockKey]) -> None:
            box.append(ok)
            ready.set()

        self.submit(keys, rows, load=load, done=finished)
        if not ready.wait(self.deadline):
            # The job may still read or write the engine's rows: wait until nothing does, then
            # the (late) report comes through the poller as usual.
            with self._lock:
                self.counters.timed_out_jobs += 1
            self.drain()
            ready.wait(self.deadline)
        return box[0] if box else frozenset()

    def drain(self) -> None:
        """Block until no job reads or writes the engine's rows."""
        with contextlib.suppress(Exception):
            self.tier.drain()
        self._collect()

    # -- stats, close ----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            tier = self.tier.get_stats()
            c = self.counters
            return {
                "tier": dict(tier),
                **dataclasses.asdict(c),
                "bytes_written": c.stored_blocks * self.row_bytes,
                "bytes_read": c.loaded_blocks * self.row_bytes,
            }

    def take_timings(self) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        """``(stores, loads)``: ``(blocks, seconds)`` of each job since the last call."""
        with self._lock:
            out, self._timings = self._timings, ([], [])
            return out

    def close(self) -> None:
        """Drain, report every job still pending as failed, stop the poller, shut the tier down."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake.notify_all()
        with contextlib.suppress(Exception):
            self.tier.shutdown()
        self._collect()
        with self._lock:
            left = list(self._pending.values())
            self._pending.clear()
        for p in left:
            p.done(frozenset())
        self._poller.join(timeout=5)

    # -- internals -----------------------------------------------------------------------------
    def _poll_loop(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
            self._collect()
            time.sleep(_POLL_SECONDS)

    def _collect(self) -> None:
        with self._lock:
            try:
                results = self.tier.get_finished_jobs()
            except Exception:
                results = []
            finished: list[tuple[_Pending, frozenset[BlockKey]]] = []
            now = time.monotonic()
            for r in results:
                p = self._pending.pop(r.job_id, None)
                if p is None:
                    continue
                ok = frozenset(r.transferred(p.keys))
                self._count(p.load, len(p.keys), ok, now - p.started)
                finished.append((p, ok))
        for p, ok in finished:
            p.done(ok)

    def _count(self, load: bool, n: int, ok: frozenset[BlockKey], seconds: float) -> None:
        c = self.counters
        c.failed_blocks += n - len(ok)
        if load:
            c.loaded_blocks += len(ok)
        else:
            c.stored_blocks += len(ok)
        timings = self._timings[load]
        if len(timings) < _MAX_TIMINGS:  # bounded when nobody reads them
            timings.append((len(ok), seconds))
