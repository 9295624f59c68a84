"""Transfer jobs between the primary tier and a secondary tier, and their results.

Field meanings follow vLLM's ``TransferJob``/``JobResult`` (``chunk_ids`` is called ``slot_ids``
here) so the vLLM adapter is a field-for-field translation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvtier.keys import BlockKey

__all__ = ["JobResult", "TransferJob", "wait_for_job"]


@dataclass(frozen=True, slots=True)
class TransferJob:
    """One batched copy between primary slots and a secondary tier.

    Attributes:
        job_id: unique per engine; every submitted job is reported exactly once.
        keys: block keys, one per slot.
        slot_ids: primary-tier slot index of ``keys[i]`` (``int32`` array, same length as ``keys``).
        is_promotion: ``True`` for loads into freshly reserved primary slots (secondary → primary).
        req_context: opaque request context from the caller (may be ``None``).
        submit_time: clock reading when the job was created (engine clock; virtual in simulation).
    """

    job_id: int
    keys: Sequence[BlockKey]
    slot_ids: npt.NDArray[np.int32]
    is_promotion: bool = False
    req_context: Any = None
    submit_time: float = 0.0

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.slot_ids):
            # Not an assert: a mismatched job would copy bytes to the wrong slot, even under -O.
            raise ValueError(
                f"TransferJob {self.job_id}: {len(self.keys)} keys but {len(self.slot_ids)} slot ids"
            )


@dataclass(frozen=True, slots=True)
class JobResult:
    """Completion report of one :class:`TransferJob`.

    Attributes:
        job_id: the job's id.
        success: ``True`` when every key was transferred.
        successful_keys: on partial success, the keys that were transferred (``None`` means all
            keys when ``success`` is true and none when it is false).
        nbytes: bytes moved.
        seconds: wall time spent on the transfer.
    """

    job_id: int
    success: bool
    successful_keys: frozenset[BlockKey] | None = None
    nbytes: int = 0
    seconds: float = 0.0
    error: str | None = field(default=None)

    def transferred(self, keys: Sequence[BlockKey]) -> list[BlockKey]:
        """Keys of ``keys`` that this result reports as transferred, in order."""
        if self.successful_keys is not None:
            return [k for k in keys if k in self.successful_keys]
        return list(keys) if self.success else []


def wait_for_job(tier: Any, job_id: int, timeout: float, *, drain: bool = False) -> JobResult:
    """Poll ``tier.get_finished_jobs()`` until ``job_id`` is reported and return its result.

    For callers that run one job at a time on a tier of their own (``kvtier check``, ``kvtier
    bench``): results of other jobs reported meanwhile are dropped. ``drain`` calls ``tier.drain()``
    before each poll, so a benchmark times the tier's I/O rather than the poll interval. Raises
    ``TimeoutError`` naming the tier and the job once ``timeout`` seconds have passed.
    """
    deadline = time.monotonic() + timeout
    while True:
        if drain:
            tier.drain()
        for result in tier.get_finished_jobs():
            if result.job_id == job_id:
                return result  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise TimeoutError(f"tier {tier.name!r}: job {job_id} not reported within {timeout:g} s")
        time.sleep(0.0005 if drain else 0.002)
