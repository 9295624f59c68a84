"""A primary buffer for tier tests, and helpers that run an asynchronous tier's jobs and wait for them."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey
from kvtier.tiers.base import SecondaryTier, TierContext

__all__ = ["PrimaryBuffer", "run_job", "wait_for_jobs"]


@dataclass
class PrimaryBuffer:
    """A primary-tier buffer as a tier sees it: ``num_slots`` rows of ``row_stride`` bytes.

    ``view`` is the 2-D zero-copy memoryview handed to tiers; ``rows`` the same memory as numpy.
    Only the first ``block_bytes`` of a row are a block; the rest is padding tiers must not touch.
    """

    view: memoryview
    rows: npt.NDArray[np.uint8]
    block_bytes: int

    @classmethod
    def heap(cls, num_slots: int = 16, row_stride: int = 8192, block_bytes: int = 5000) -> PrimaryBuffer:
        """A zeroed numpy-backed buffer (the default of the conformance suite)."""
        rows = np.zeros((num_slots, row_stride), dtype=np.uint8)
        return cls(rows.data, rows, block_bytes)

    @classmethod
    def from_view(cls, view: memoryview, block_bytes: int) -> PrimaryBuffer:
        """Wrap an existing 2-D byte memoryview (shared memory, a torch tensor's buffer...)."""
        return cls(view, np.asarray(view), block_bytes)

    @property
    def num_slots(self) -> int:
        return int(self.rows.shape[0])

    def context(self, name: str = "tier", namespace: str = "kvtier-test") -> TierContext:
        """A :class:`TierContext` matching this buffer."""
        return TierContext(name=name, block_bytes=self.block_bytes, namespace=namespace)

    def block(self, slot: int) -> npt.NDArray[np.uint8]:
        """Zero-copy view of the block bytes of ``slot``."""
        return self.rows[slot, : self.block_bytes]

    def fill_random(self, slots: Iterable[int], seed: int) -> dict[int, bytes]:
        """Fill the blocks of ``slots`` with seeded random bytes; returns what was written."""
        rng = np.random.default_rng(seed)
        written: dict[int, bytes] = {}
        for slot in slots:
            data = rng.integers(0, 256, self.block_bytes, dtype=np.uint8)
            self.block(slot)[:] = data
            written[slot] = data.tobytes()
        return written


def wait_for_jobs(
    tier: SecondaryTier, job_ids: Iterable[int], timeout: float = 30.0, poll_interval: float = 0.002
) -> dict[int, JobResult]:
    """Poll ``get_finished_jobs`` until every job in ``job_ids`` is reported; return them by id.

    Raises ``AssertionError`` when a job is reported twice, a job nobody waits for is reported, or
    the timeout passes.
    """
    wanted = set(job_ids)
    got: dict[int, JobResult] = {}
    deadline = time.monotonic() + timeout
    while True:
        for result in tier.get_finished_jobs():
            if result.job_id in got:
                raise AssertionError(f"job {result.job_id} reported twice")
            if result.job_id not in wanted:
                raise AssertionError(f"job {result.job_id} reported but never submitted in this wait")
            got[result.job_id] = result
        if len(got) == len(wanted):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs {sorted(wanted - set(got))} not reported within {timeout}s")
        time.sleep(poll_interval)


def run_job(
    tier: SecondaryTier,
    job_id: int,
    keys: Sequence[BlockKey],
    slots: Sequence[int],
    *,
    load: bool,
    timeout: float = 30.0,
) -> JobResult:
    """Submit one store (or, with ``load``, one promotion load) of ``keys`` to ``slots`` and wait
    for its result (:func:`wait_for_jobs`)."""
    job = TransferJob(job_id, list(keys), np.asarray(slots, dtype=np.int32), is_promotion=load)
    (tier.submit_load if load else tier.submit_store)(job)
    return wait_for_jobs(tier, [job_id], timeout=timeout)[job_id]
