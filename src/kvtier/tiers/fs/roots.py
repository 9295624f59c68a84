"""The roots of a striped fs tier (``root_dirs``): paths and each root's share of ``max_bytes``.

``root_dirs`` is a list whose entries are a path (``"/mnt/nvme0/kv"``) or a mapping
``{"path": "/mnt/nvme1/kv", "max_bytes": "500GiB"}``. A root with its own ``max_bytes`` keeps it;
the others share what is left of the tier's ``max_bytes`` (the total) in proportion to the free
space of their file systems (read once, at start), so a half-full disk receives fewer blocks. Without
a total those roots are unbounded, and their placement weight is their free space.

Checked here, before anything is written (one-line ``ConfigError`` naming ``root_dirs[i]``): a
non-empty list, each path non-empty and listed once (after ``~`` expansion and resolving links),
per-root sizes no larger than the total, and every share able to hold a block file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvtier.config import parse_size
from kvtier.errors import ConfigError
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import BlockKey
from kvtier.tiers.base import SimulationProfile, SimulationRequest, TierContext
from kvtier.tiers.fs.accounting import AccountingState, SharedAccounting
from kvtier.tiers.fs.index import FsIndex
from kvtier.tiers.fs.layout import Layout
from kvtier.tiers.fs.options import nearest_existing, root_path

__all__ = ["RootClass", "RootSpec", "RootTier", "check_fenced", "free_bytes", "read_roots"]

#: Most roots one tier may stripe over (each has its own workers and descriptors).
MAX_ROOTS = 64


@dataclass(frozen=True, slots=True)
class RootSpec:
    """One root of a striped tier: its absolute ``path``, its ``max_bytes`` (``None``: unbounded)
    and its placement ``weight`` (capacity, or free bytes when unbounded)."""

    path: str
    max_bytes: int | None
    weight: float


def free_bytes(path: str) -> int:
    """Bytes available to this user on the file system holding ``path`` (or its nearest existing
    ancestor); 1 when it cannot be read (the root still gets a non-zero weight)."""
    try:
        st = os.statvfs(nearest_existing(path))
    except OSError:
        return 1
    return max(st.f_bavail * st.f_frsize, 1)


def read_roots(value: object, total: int | None, min_bytes: int, free: Any = free_bytes) -> list[RootSpec]:
    """Check ``root_dirs`` and split ``total`` (the tier's ``max_bytes``) over the roots without
    their own ``max_bytes``, by free space. ``min_bytes`` is the smallest useful share (one block
    file); ``free`` reads a path's free bytes (a seam for tests). Writes nothing."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value:
        raise ConfigError(
            "root_dirs", 'expected a non-empty list of directories, e.g. ["/mnt/nvme0/kv", "/mnt/nvme1/kv"]'
        )
    if len(value) > MAX_ROOTS:
        raise ConfigError("root_dirs", f"{len(value)} roots; at most {MAX_ROOTS}")
    paths: list[str] = []
    own: list[int | None] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(value):
        where = f"root_dirs[{i}]"
        if isinstance(entry, Mapping):
            unknown = set(entry) - {"path", "max_bytes"}
            if unknown:
                raise ConfigError(where, f"unknown key(s) {sorted(unknown)}; a root takes path and max_bytes")
            if "path" not in entry:
                raise ConfigError(
                    where, 'missing path; write {"path": "/mnt/nvme0/kv", "max_bytes": "100GiB"}'
                )
            raw, size = entry["path"], entry.get("max_bytes")
        else:
            raw, size = entry, None
        if not isinstance(raw, str | os.PathLike):
            raise ConfigError(where, f"expected a directory path, got {raw!r}")
        try:
            path = root_path(raw)
        except ConfigError as exc:
            raise ConfigError(where, exc.detail) from exc
        real = os.path.realpath(path)
        if real in seen:
            raise ConfigError(
                where, f"{path} is the same directory as root_dirs[{seen[real]}]; list each once"
            )
        seen[real] = i
        paths.append(path)
        own.append(None if size is None else parse_size(size, f"{where}.max_bytes"))
    fixed = sum(s for s in own if s is not None)
    if total is not None and fixed > total:
        raise ConfigError(
            "max_bytes", f"the roots' own max_bytes add up to {fixed}, more than max_bytes {total}; raise it"
        )
    shared = [i for i, s in enumerate(own) if s is None]
    frees = {i: float(free(paths[i])) for i in shared}
    sizes = list(own)
    if total is not None and shared:
        left = total - fixed
        weight_sum = sum(frees.values())
        for n, i in enumerate(shared):
            # Integer shares that add up to exactly what is left (the last takes the remainder).
            sizes[i] = (
                left - sum(sizes[j] or 0 for j in shared[:n])
                if n == len(shared) - 1
                else int(left * frees[i] / weight_sum)
            )
    out = []
    for i, (path, size) in enumerate(zip(paths, sizes, strict=True)):
        if size is not None and size < min_bytes:
            raise ConfigError(
                f"root_dirs[{i}]",
                f"{path} gets {size} bytes, less than one block file ({min_bytes} bytes); "
                "raise max_bytes or give this root its own max_bytes",
            )
        out.append(RootSpec(path, size, float(size) if size is not None else frees[i]))
    return out


class RootTier(Protocol):
    """What the striped tier uses of each root's tier: a one-root
    :class:`~kvtier.tiers.fs.tier.FsTier` (named by this protocol, not imported: the one-root tier
    builds the striped one)."""

    index: FsIndex
    layout: Layout
    accounting: SharedAccounting
    threads: int

    def submit_store(self, job: TransferJob) -> None: ...
    def submit_load(self, job: TransferJob) -> None: ...
    def get_finished_jobs(self) -> list[JobResult]: ...
    def touch(self, keys: Iterable[BlockKey]) -> None: ...
    def abandon(self, job_id: int) -> None: ...
    def wait_idle(self, timeout: float) -> bool: ...
    def responsive(self, timeout: float) -> bool: ...
    def finished_nowait(self) -> list[JobResult] | None: ...
    def shutdown(self) -> None: ...
    @property
    def scan_done(self) -> bool: ...
    def wait_scan(self, timeout: float | None = None) -> bool: ...
    def refresh(self) -> None: ...
    def usage(self, recover: bool = True) -> AccountingState: ...
    def indexed_keys(self) -> set[BlockKey]: ...
    def get_stats(self) -> dict[str, int]: ...
    def config_info(self) -> dict[str, Any]: ...


class RootClass(Protocol):
    """The class of the roots' tiers (:class:`~kvtier.tiers.fs.tier.FsTier` or a subclass)."""

    def __call__(self, **options: Any) -> RootTier: ...
    def check_options(self, context: TierContext, options: Mapping[str, Any]) -> None: ...
    def simulate(self, request: SimulationRequest) -> SimulationProfile: ...


def check_fenced(value: object, n: int) -> set[int]:
    """``simulate_fenced`` as a set of root indexes ``0..n-1`` (``ConfigError`` otherwise)."""
    if value is None:
        return set()
    ok = isinstance(value, Sequence) and not isinstance(value, str)
    items: list[object] = list(value) if isinstance(value, Sequence) and ok else []
    if not ok or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n for i in items):
        raise ConfigError("simulate_fenced", f"expected a list of root indexes 0..{n - 1}, got {value!r}")
    return {int(i) for i in items if isinstance(i, int)}
