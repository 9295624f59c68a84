"""The secondary-tier contract.

Deliberately close to vLLM 0.33's ``SecondaryTierManager`` so the vLLM adapter is thin: every method
is non-blocking except :meth:`SecondaryTier.drain` and :meth:`SecondaryTier.shutdown`; slow work is a
job, completions are polled with :meth:`SecondaryTier.get_finished_jobs`.

A tier reads and writes the primary tier's buffer directly through ``primary_kv_view``: a zero-copy
2-D ``memoryview`` of shape ``(num_slots, row_stride)``; block ``slot`` is the first ``block_bytes``
bytes of row ``slot``. ``self.rows`` is the same memory as a numpy ``uint8`` array, which is the
convenient way to slice it (multi-dimensional memoryviews cannot be indexed by row).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from kvtier.config import parse_size
from kvtier.errors import MisuseError
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.numbers import Ranges
from kvtier.policies.base import CachePolicy

__all__ = [
    "PolicyFactory",
    "PrimaryProfile",
    "RemovalLog",
    "SecondaryTier",
    "SimulationProfile",
    "SimulationRequest",
    "TierContext",
    "TierStats",
    "UNBOUNDED_BLOCKS",
    "policy_capacity",
    "whole_job",
]

#: Policy capacity of a tier without a bound.
UNBOUNDED_BLOCKS = 1 << 40


def policy_capacity(max_bytes: int | None, block_bytes: int) -> int:
    """Blocks a byte-bounded tier's policy must have room for: one per ``block_bytes`` of
    ``max_bytes``, plus one (the bytes themselves are enforced by the tier)."""
    return max_bytes // max(block_bytes, 1) + 1 if max_bytes else UNBOUNDED_BLOCKS


@dataclass(frozen=True, slots=True)
class TierContext:
    """What the engine tells every tier it builds (never part of the user's tier config).

    Attributes:
        name: instance name, unique within one engine (config ``name`` or ``"<type><index>"``).
        block_bytes: payload bytes of one block (``<= row_stride``).
        namespace: stable fingerprint of model, KV layout and tenant salt (hex). Tiers that persist
            or share data keep each namespace apart (a directory, a key prefix).
        clock: monotonic seconds; virtual in simulation.
    """

    name: str
    block_bytes: int
    namespace: str = "default"
    clock: Callable[[], float] = field(default=time.monotonic)


@dataclass(slots=True)
class TierStats:
    """Counters every tier keeps; the metrics exporter and ``replay`` report them by these names."""

    lookups: int = 0
    hits: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    stores: int = 0
    loads: int = 0
    evictions: int = 0
    corrupt: int = 0
    dropped_stores: int = 0
    failed_jobs: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def counted(self, answer: LookupResult) -> LookupResult:
        """``answer``, counted as one lookup (and a hit when it is ``HIT``)."""
        self.lookups += 1
        if answer is LookupResult.HIT:
            self.hits += 1
        return answer


class RemovalLog:
    """Keys a tier stopped holding, kept for a consumer that announces them (vLLM's KV events).

    Off until :meth:`enable` is called, and then :meth:`note` is one lock and an ``extend``; while
    off, :meth:`note` returns at once, so a tier reports unconditionally at no cost. A tier notes a
    key whenever one it held stops being loadable here: evicted by its policy or capacity, found
    missing or corrupt, removed by another process sharing the medium. Noting a key that was never
    announced is harmless (a consumer drops an unknown removal); missing one is not (a router would
    keep sending requests for a block that is gone). Thread-safe: tiers note from their workers.

    Args:
        limit: most keys kept between two :meth:`take` calls; past it the oldest are dropped and
            counted in :attr:`lost` (a consumer that stopped taking must not grow memory forever).
    """

    def __init__(self, limit: int = 1 << 20) -> None:
        if limit < 1:
            raise MisuseError(f"RemovalLog limit must be >= 1, got {limit!r}")
        self.limit = limit
        self.lost = 0
        self._keys: list[BlockKey] | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._keys is not None

    def enable(self) -> None:
        """Start keeping noted keys (idempotent)."""
        with self._lock:
            if self._keys is None:
                self._keys = []

    def note(self, keys: Iterable[BlockKey]) -> None:
        """``keys`` are no longer held (kept only while enabled)."""
        if self._keys is None:
            return
        with self._lock:
            if self._keys is None:
                return
            self._keys.extend(keys)
            over = len(self._keys) - self.limit
            if over > 0:
                del self._keys[:over]
                self.lost += over

    def take(self) -> list[BlockKey]:
        """The keys noted since the last call, oldest first (``[]`` while disabled)."""
        if not self._keys:
            return []
        with self._lock:
            out, self._keys = self._keys or [], []
        return out


class PolicyFactory(Protocol):
    """Builds an eviction policy by name: ``factory(name, capacity, options, key_path=...)``.

    The simulator passes :func:`kvtier.plugins.create_policy` bound to the config's ``plugins``
    trust boundary, so a simulated tier validates and builds its policy exactly as the real one.
    """

    def __call__(
        self, policy: str, capacity: int, options: Mapping[str, Any] | None = None, *, key_path: str = ""
    ) -> CachePolicy: ...


def whole_job(n: int) -> int:
    """Chunking of a tier that makes room for a store job all at once."""
    return max(n, 1)


@dataclass(frozen=True, slots=True)
class SimulationProfile:
    """How ``kvtier replay --simulate`` models a tier: *which* blocks it holds, never how fast.

    Attributes:
        capacity_blocks: blocks the tier holds at most (``None`` = unbounded).
        policy: an empty eviction policy, built and sized as the tier builds its own; it orders
            the held blocks (stores and loads refresh them) and picks victims.
        chunk_blocks: ``n -> blocks per chunk`` of a store job of ``n`` new blocks; room is made
            chunk by chunk and what does not fit is dropped (leading blocks of a chunk win).
        medium: the tier's medium (reported, and used by the cost model).
    """

    capacity_blocks: int | None
    policy: CachePolicy
    chunk_blocks: Callable[[int], int]
    medium: str


@dataclass(frozen=True, slots=True)
class PrimaryProfile:
    """The simulated engine's own primary tier, handed to the :meth:`SecondaryTier.simulation`
    hook of a tier whose model is built on it (``simulation_uses_primary``): the p2p tier models
    its peers' primary tiers, which run the same config.

    Attributes:
        slots: blocks the primary tier holds (``cpu_bytes_to_use // row_stride``).
        row_stride: bytes per primary slot (``block_bytes`` rounded up to 4 KiB).
        new_policy: ``capacity -> `` an empty policy built as the primary builds its own (name,
            module path, options, plug-in trust boundary).
    """

    slots: int
    row_stride: int
    new_policy: Callable[[int], CachePolicy]


@dataclass(frozen=True, slots=True)
class SimulationRequest:
    """What the simulator hands a tier's :meth:`SecondaryTier.simulate` hook.

    Attributes:
        options: the config entry's keys besides ``type``/``module_path``/``name`` (what the
            constructor would get).
        block_bytes: payload bytes of one block.
        policy_factory: builds the policy (so the simulator's plug-in trust boundary applies).
        key_path: where the entry sits in the config (``secondary_tiers[1]``), for error messages.
        primary: the simulated engine's primary tier; set only for a class that sets
            ``simulation_uses_primary``.
    """

    options: Mapping[str, Any]
    block_bytes: int
    policy_factory: PolicyFactory
    key_path: str = ""
    primary: PrimaryProfile | None = None

    def key(self, name: str) -> str:
        """``name`` under this entry's key path (``secondary_tiers[1].max_bytes``)."""
        return _key(self.key_path, name)

    def size(self, name: str) -> int | None:
        """Option ``name`` as bytes (:func:`~kvtier.config.parse_size`), ``None`` when absent."""
        raw = self.options.get(name)
        return None if raw is None else parse_size(raw, self.key(name))

    def policy(self, capacity: int) -> CachePolicy:
        """An empty policy of ``capacity`` blocks, named and configured by the entry's
        ``eviction_policy`` (default ``lru``) and ``policy_options``, built as the tier builds it."""
        options = self.options
        return self.policy_factory(
            str(options.get("eviction_policy", "lru")),
            capacity,
            options.get("policy_options") or {},
            key_path=self.key_path,
        )


class SecondaryTier(ABC):
    """A store of KV blocks behind the primary tier.

    The engine guarantees:
        * the slots of a submitted store job stay READY and pinned (unchanged) until the job is
          reported by :meth:`get_finished_jobs`; the slots of a load job are reserved (WRITING) for
          this tier alone until then;
        * methods are called from one thread at a time (under the engine's lock), unless the class
          sets ``tolerates_off_thread_polling`` and the engine polls from another thread.

    The implementer must:
        * never block in :meth:`lookup`, :meth:`submit_store`, :meth:`submit_load` or
          :meth:`get_finished_jobs` (do I/O on worker threads or asynchronously);
        * report every submitted job exactly once; a load may succeed partially (``successful_keys``);
        * never raise out of these methods for backend failures: a failed read is a failed job
          (and a later MISS), a failed write is a failed job; count it in :attr:`stats`;
        * never serve bytes other than those stored under the key (verify when the medium can lie);
        * note in :attr:`removals` every key it held that it stops holding (evicted, found missing
          or corrupt, removed by another process sharing the medium): consumers that announce what
          the tier holds (vLLM's KV events) learn removals only from there. A tier that stores
          nothing of its own (``stores_nothing``) notes nothing.

    Capabilities are class attributes so the engine never probes with try/except.
    """

    #: Where the bytes live: ``"CPU"`` (host memory), ``"STORAGE"`` (disk), ``"REMOTE"`` (network).
    medium: ClassVar[str] = "CPU"
    #: ``get_finished_jobs``/``lookup`` may be called from a thread other than the submitter's.
    tolerates_off_thread_polling: ClassVar[bool] = False
    #: Blocks survive a restart of the process.
    persistent: ClassVar[bool] = False
    #: Other processes/instances may read what this one stores.
    shared: ClassVar[bool] = False
    #: The simulator passes ``primary=`` (a :class:`PrimaryProfile`) to :meth:`simulation`.
    simulation_uses_primary: ClassVar[bool] = False
    #: Every numeric option and its allowed range (:mod:`kvtier.numbers`): checked for each
    #: configured entry before anything is built. A subclass extends its base's table.
    option_ranges: ClassVar[Ranges] = {}

    def __init__(self, *, primary_kv_view: memoryview, context: TierContext) -> None:
        if primary_kv_view.ndim != 2 or primary_kv_view.itemsize != 1:
            raise MisuseError(
                "primary_kv_view must be a 2-D byte memoryview (num_slots, row_stride), got "
                f"ndim={primary_kv_view.ndim} itemsize={primary_kv_view.itemsize}"
            )
        row_stride = primary_kv_view.shape[1] if primary_kv_view.shape else 0
        if not 0 < context.block_bytes <= row_stride:
            raise MisuseError(
                f"tier {context.name!r}: block_bytes={context.block_bytes} does not fit a row of "
                f"{row_stride} bytes"
            )
        self.primary_kv_view = primary_kv_view
        self.rows: npt.NDArray[np.uint8] = np.asarray(primary_kv_view)
        self.context = context
        self.stats = TierStats()
        #: Keys this tier stopped holding (see :class:`RemovalLog`); off until a consumer enables it.
        self.removals = RemovalLog()

    @classmethod
    def check_options(cls, context: TierContext, options: Mapping[str, Any]) -> None:
        """Check a config's ``options`` for this class without side effects (no file, directory,
        thread or socket is created): raise :class:`~kvtier.errors.ConfigError` naming the key.

        Called for every configured tier before any is built, so a bad later tier leaves nothing
        behind. The default checks nothing (the constructor still checks everything); a tier whose
        constructor writes (a directory, a connection) overrides it with its pure checks."""

    # -- simulation (no instance: the simulator never builds a real tier) ----------------------
    @classmethod
    def simulation(
        cls,
        options: Mapping[str, Any],
        *,
        block_bytes: int,
        policy_factory: PolicyFactory,
        key_path: str = "",
        primary: PrimaryProfile | None = None,
    ) -> SimulationProfile:
        """Describe how this tier is simulated, from its config entry's ``options``: the entry
        point the simulator calls, with the fields of a :class:`SimulationRequest` (``primary``
        only for classes that set ``simulation_uses_primary``, so an older override written
        without the argument keeps working). A tier describes itself by overriding
        :meth:`simulate`; overriding this method instead still works. Pure: no I/O, no threads."""
        return cls.simulate(SimulationRequest(options, block_bytes, policy_factory, key_path, primary))

    @classmethod
    def simulate(cls, request: SimulationRequest) -> SimulationProfile:
        """This tier's :class:`SimulationProfile` for ``request`` (name bad keys with
        :meth:`SimulationRequest.key`; build the policy through the request, so the simulator's
        plug-in trust boundary applies). Pure: no I/O, no threads.

        The default reads ``max_bytes`` (``max_bytes // block_bytes`` blocks; unbounded when
        absent), ``eviction_policy`` (default ``lru``) with ``policy_options``, sized
        ``max_bytes // block_bytes + 1``, and makes room for a store job all at once. A tier whose
        capacity or chunking differs (per-block overhead, its own options) overrides this, so a new
        tier is simulated without editing :mod:`kvtier.sim`.
        """
        max_bytes, block_bytes = request.size("max_bytes"), request.block_bytes
        capacity = None if max_bytes is None else max(max_bytes // max(block_bytes, 1), 1)
        policy = request.policy(policy_capacity(max_bytes, block_bytes))
        return SimulationProfile(capacity, policy, whole_job, cls.medium)

    # -- helpers for implementations ---------------------------------------------------------
    @property
    def name(self) -> str:
        return self.context.name

    @property
    def block_bytes(self) -> int:
        return self.context.block_bytes

    def slot_array(self, slot_id: int) -> npt.NDArray[np.uint8]:
        """Zero-copy view of the payload bytes of primary slot ``slot_id``."""
        return self.rows[int(slot_id), : self.context.block_bytes]

    # -- the contract ------------------------------------------------------------------------
    @abstractmethod
    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        """Whether ``key`` can be loaded: ``HIT``, ``MISS`` or ``RETRY`` (unknown yet). Non-blocking."""

    def lookup_many(self, keys: Sequence[BlockKey], req_context: Any = None) -> list[LookupResult]:
        """:meth:`lookup` for each key; tiers with a batched index override this."""
        return [self.lookup(k, req_context) for k in keys]

    @abstractmethod
    def submit_store(self, job: TransferJob) -> None:
        """Start copying ``job.keys[i]`` from primary slot ``job.slot_ids[i]``. Non-blocking.

        Keys already held are skipped (and count as stored). A tier with a capacity makes room by
        its own eviction. A full or failing medium reports the job as failed; it never raises.
        """

    @abstractmethod
    def submit_load(self, job: TransferJob) -> None:
        """Start filling primary slot ``job.slot_ids[i]`` with ``job.keys[i]``. Non-blocking.

        Keys that turn out missing or corrupt are left out of ``successful_keys``.
        """

    @abstractmethod
    def get_finished_jobs(self) -> list[JobResult]:
        """Results of jobs finished since the last call; each submitted job appears exactly once."""

    @abstractmethod
    def drain(self) -> None:
        """Block until no submitted job still reads or writes the primary buffer.

        Finished jobs stay queued for :meth:`get_finished_jobs`.
        """

    # -- optional hooks (defaults are correct for a simple tier) -----------------------------
    def has_pending_work(self) -> bool:
        """Whether submitted jobs have not been reported yet."""
        return False

    def touch(self, keys: Iterable[BlockKey]) -> None:
        """Hint: these keys were just used (tiers with their own eviction refresh their order)."""

    def get_stats(self) -> dict[str, int]:
        """Counters (see :class:`TierStats`); a tier may add its own."""
        return self.stats.as_dict()

    def config_info(self) -> dict[str, Any]:
        """Human-readable settings for ``kvtier check`` and logs."""
        return {"type": type(self).__name__, "medium": self.medium}

    def shutdown(self) -> None:
        """Drain and release resources (threads, sockets, files). Idempotent."""
        self.drain()

    def __enter__(self) -> SecondaryTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _key(key_path: str, key: str) -> str:
    return f"{key_path}.{key}" if key_path else key
