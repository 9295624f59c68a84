"""Out-of-tree tiers for test_buffer_tier.py, loaded by ``module_path`` like a user's.

``HeldTier`` keeps every job until :meth:`drain` (a tier slower than the adapter's deadline);
``FaultyTier`` raises from every method (a broken plug-in).
"""

from __future__ import annotations

from typing import Any

from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey, LookupResult
from kvtier.tiers.base import SecondaryTier


class HeldTier(SecondaryTier):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.held: list[TransferJob] = []
        self.done: list[JobResult] = []

    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        return LookupResult.RETRY  # never knows: the adapter must give up at its deadline

    def submit_store(self, job: TransferJob) -> None:
        self.held.append(job)

    def submit_load(self, job: TransferJob) -> None:
        self.held.append(job)

    def get_finished_jobs(self) -> list[JobResult]:
        out, self.done = self.done, []
        return out

    def drain(self) -> None:
        self.done += [JobResult(j.job_id, True) for j in self.held]
        self.held = []


class FaultyTier(SecondaryTier):
    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        raise OSError("broken lookup")

    def submit_store(self, job: TransferJob) -> None:
        raise OSError("broken store")

    def submit_load(self, job: TransferJob) -> None:
        raise OSError("broken load")

    def get_finished_jobs(self) -> list[JobResult]:
        raise OSError("broken poll")

    def drain(self) -> None:
        raise OSError("broken drain")
