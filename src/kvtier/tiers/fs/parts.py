"""What every collaborator of one fs tier shares, handed over as one explicit, typed record: the
tier's parts (:class:`FsParts`) and its checked options (:class:`FsOptions`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvtier.policies.base import CachePolicy
from kvtier.tiers.backpressure import StoreGate
from kvtier.tiers.base import TierStats
from kvtier.tiers.fs.accounting import SharedAccounting
from kvtier.tiers.fs.index import FsIndex
from kvtier.tiers.fs.layout import Layout, ShardDirs
from kvtier.tiers.fs.trust import BlockMac
from kvtier.tiers.ratelog import RateLimitedLog

__all__ = ["FsOptions", "FsParts"]


@dataclass(frozen=True, slots=True)
class FsOptions:
    """The fs tier's options, checked (see :func:`~kvtier.tiers.fs.options.read_options`)."""

    layout: Layout
    max_bytes: int | None
    policy: CachePolicy
    verify: bool
    fsync: bool
    direct_io: str
    full_backoff: float
    record_access: bool
    refresh_interval: float
    precreate_dirs: bool
    shared_root: bool
    mac: BlockMac | None
    read_io: str
    #: Bytes one segment of the small-block path may grow to; ``None``: one file per block.
    segment_cap: int | None


@dataclass(frozen=True, slots=True)
class FsParts:
    """The parts of one :class:`~kvtier.tiers.fs.tier.FsTier` its store path, load path, segment
    store and scanner all use. ``index.lock`` (the tier's lock) guards the index and ``stats``.

    Attributes:
        name: the tier's instance name (log lines, thread names).
        layout: paths and names of the namespace directory.
        accounting: the byte accounting shared with other processes.
        index: the in-memory index.
        stats: the tier's counters.
        rlog: the tier's rate-limited log.
        options: the tier's checked options (``max_bytes``, ``fsync``, ``verify``, ...).
        rows: the primary buffer as rows (block ``slot`` is ``rows[slot, :block_bytes]``).
        gate: the tier's store gate (paused on ``ENOSPC`` for ``options.full_backoff`` seconds).
        dirs: the shard directories known to exist.
    """

    name: str
    layout: Layout
    accounting: SharedAccounting
    index: FsIndex
    stats: TierStats
    rlog: RateLimitedLog
    options: FsOptions
    rows: npt.NDArray[np.uint8]
    gate: StoreGate
    dirs: ShardDirs

    @property
    def block_bytes(self) -> int:
        """Payload bytes of one block."""
        return self.layout.block_bytes

    @property
    def mac(self) -> BlockMac | None:
        """Authenticates every block of a shared root (``None``: a private root)."""
        return self.options.mac
