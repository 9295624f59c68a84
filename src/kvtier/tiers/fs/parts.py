"""What every collaborator of one fs tier shares, handed over as one explicit, typed record."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.tiers.base import TierStats
from kvtier.tiers.fs.accounting import SharedAccounting
from kvtier.tiers.fs.index import FsIndex
from kvtier.tiers.fs.layout import Layout
from kvtier.tiers.fs.trust import BlockMac
from kvtier.tiers.ratelog import RateLimitedLog

__all__ = ["FsParts"]


@dataclass(frozen=True, slots=True)
class FsParts:
    """The parts of one :class:`~kvtier.tiers.fs.tier.FsTier` its store path, load path and
    scanner all use. ``index.lock`` (the tier's lock) guards the index and ``stats``.

    Attributes:
        name: the tier's instance name (log lines, thread names).
        layout: paths and names of the namespace directory.
        accounting: the byte accounting shared with other processes.
        index: the in-memory index.
        stats: the tier's counters.
        rlog: the tier's rate-limited log.
        mac: authenticates every block of a shared root (``None``: a private root).
    """

    name: str
    layout: Layout
    accounting: SharedAccounting
    index: FsIndex
    stats: TierStats
    rlog: RateLimitedLog
    mac: BlockMac | None = None
