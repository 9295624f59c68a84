"""Metadata-only stand-ins for secondary tiers, so ``--simulate`` covers a whole RAM + disk stack.

A simulate-mode engine has no buffer, so it cannot build real tiers (they move bytes). For capacity
planning the question a tier answers is only *which blocks does it hold*: a :class:`SimTier` answers
it and completes every job at once. The engine — promotions, write policies, admission, pins — runs
unchanged on top of it.

The simulator knows no tier by name. Each tier class describes itself through the
:meth:`SecondaryTier.simulation <kvtier.tiers.base.SecondaryTier.simulation>` hook, which returns a
:class:`~kvtier.tiers.base.SimulationProfile`: capacity in blocks, the eviction policy (built with
:func:`kvtier.plugins.create_policy`, sized as the tier sizes it), the chunking of store jobs, the
medium. The default reads ``max_bytes``/``eviction_policy``/``policy_options``; ``FsTier`` counts
its per-file header and makes room once per store job, as its group-commit reservation does. A new
tier is simulated by overriding the hook, never by editing this module.

Like the real tiers: a store of a block already held refreshes it (touch), a load refreshes the
loaded blocks, lookups do not; a store job is written in chunks, space for a chunk is made by
evicting blocks that are not part of the job still being written, and what still does not fit is
dropped (the leading blocks of a chunk win). What the model leaves out is timing: real tiers finish
jobs later, and the fs tier's worker threads may run a job's chunks in another order (with
``threads: 1`` they run in order, as here).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from kvtier.config import KvtierConfig, PluginsConfig
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.policies.base import CachePolicy
from kvtier.tiers.base import (
    PolicyFactory,
    PrimaryProfile,
    SecondaryTier,
    SimulationProfile,
    TierContext,
    TierStats,
)

__all__ = ["SimTier", "sim_tiers"]

_UNBOUNDED = 1 << 40


class SimTier(SecondaryTier):
    """A secondary tier that tracks keys only (no bytes) and finishes every job immediately.

    Args:
        name: the tier's instance name (as the real tier would have).
        block_bytes: payload bytes per block (for the byte counters).
        profile: what the modelled tier's simulation hook said it holds: its policy (orders the
            held keys and picks victims), capacity (``None`` = unbounded), chunking and medium.
    """

    medium: ClassVar[str] = "STORAGE"

    def __init__(
        self,
        *,
        primary_kv_view: memoryview,
        name: str,
        block_bytes: int,
        profile: SimulationProfile,
    ) -> None:
        # Not SecondaryTier.__init__: it requires rows that hold a block, and a simulate engine's
        # view has rows of length 0. Nothing here reads the view; the attributes are set as the
        # base class sets them so generic code (stats, config_info) works.
        self.primary_kv_view = primary_kv_view
        self.rows = np.asarray(primary_kv_view)
        self.context = TierContext(name, max(block_bytes, 1))
        self.stats = TierStats()
        self._policy = profile.policy
        self._chunk = profile.chunk_blocks
        self._max = profile.capacity_blocks if profile.capacity_blocks is not None else _UNBOUNDED
        self.medium = profile.medium  # type: ignore[misc]  # per instance: mirrors the modelled tier
        self._done: list[JobResult] = []

    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        self.stats.lookups += 1
        if key in self._policy:
            self.stats.hits += 1
            return LookupResult.HIT
        return LookupResult.MISS

    def lookup_many(self, keys: Sequence[BlockKey], req_context: Any = None) -> list[LookupResult]:
        return [self.lookup(k) for k in keys]

    def submit_store(self, job: TransferJob) -> None:
        pol = self._policy
        new: list[BlockKey] = []
        for key in job.keys:
            if key in pol:
                pol.touch(key)  # offered again = in use
            elif key not in new:
                new.append(key)
        writing = set(new)  # blocks of this job not written yet: never victims
        stored = dropped = 0
        per = self._chunk(len(new))
        for lo in range(0, len(new), per):
            chunk = new[lo : lo + per]
            free = self._max - len(pol)
            if free < len(chunk):
                evictable = len(pol) - sum(1 for k in writing if k in pol)
                want = min(len(chunk) - free, evictable)
                if want > 0:
                    victims = pol.evict(want, writing)
                    self.stats.evictions += len(victims)
                    free += len(victims)
            granted = max(0, min(len(chunk), free))
            for key in chunk[:granted]:
                pol.insert(key)
            stored += granted
            dropped += len(chunk) - granted
            writing.difference_update(chunk)
        self.stats.stores += stored
        self.stats.dropped_stores += dropped
        self.stats.bytes_written += stored * self.block_bytes
        ok = dropped == 0
        partial = None if ok else frozenset(k for k in job.keys if k in pol)
        self._done.append(JobResult(job.job_id, ok, partial, stored * self.block_bytes, 0.0))

    def submit_load(self, job: TransferJob) -> None:
        pol = self._policy
        found = [k for k in job.keys if k in pol]
        for key in found:
            pol.touch(key)
        nbytes = len(found) * self.block_bytes
        self.stats.loads += len(found)
        self.stats.bytes_read += nbytes
        ok = len(found) == len(job.keys)
        if not ok:
            self.stats.failed_jobs += 1
        self._done.append(JobResult(job.job_id, ok, None if ok else frozenset(found), nbytes, 0.0))

    def get_finished_jobs(self) -> list[JobResult]:
        out, self._done = self._done, []
        return out

    def drain(self) -> None:
        """Nothing to wait for: every job finished when it was submitted."""

    def config_info(self) -> dict[str, Any]:
        info = super().config_info()
        info.update({"simulated": True, "max_blocks": None if self._max == _UNBOUNDED else self._max})
        return info


def sim_tiers(config: KvtierConfig) -> list[Callable[[memoryview], SimTier]]:
    """Factories (``Engine(tiers=...)`` builds each on its view) of one :class:`SimTier` per
    ``config.secondary_tiers`` entry, named as the engine names the real tiers, each modelled by
    its tier class's :meth:`~kvtier.tiers.base.SecondaryTier.simulation` profile."""
    from kvtier.plugins import TIERS, tier_contexts

    factory = _policy_factory(config.plugins)
    contexts = tier_contexts(config)
    out: list[Callable[[memoryview], SimTier]] = []
    for tc, ctx in zip(config.secondary_tiers, contexts, strict=True):
        cls = TIERS.resolve(tc.type, tc.module_path, plugins=config.plugins, key_path=tc.key_path)
        hook = cls.simulation
        if cls.simulation_uses_primary:  # only then: an override without ``primary`` still works
            hook = functools.partial(hook, primary=_primary_profile(config))
        profile = hook(
            tc.options, block_bytes=config.block_bytes, policy_factory=factory, key_path=tc.key_path
        )
        out.append(functools.partial(_make, name=ctx.name, block_bytes=config.block_bytes, profile=profile))
    return out


def _policy_factory(plugins: PluginsConfig) -> PolicyFactory:
    """:func:`kvtier.plugins.create_policy` inside the config's plug-in trust boundary."""
    from kvtier.plugins import create_policy

    def make(
        policy: str, capacity: int, options: Mapping[str, Any] | None = None, *, key_path: str = ""
    ) -> CachePolicy:
        return create_policy(policy, capacity, options, plugins=plugins, key_path=key_path)

    return make


def _primary_profile(config: KvtierConfig) -> PrimaryProfile:
    """The config's primary tier: its slots, and its policy (as :mod:`kvtier.specs.tiering` builds it)."""
    from kvtier.plugins import create_policy

    return PrimaryProfile(
        config.num_primary_slots, config.row_stride, functools.partial(create_policy, config)
    )


def _make(view: memoryview, **kw: Any) -> SimTier:
    return SimTier(primary_kv_view=view, **kw)
