"""Per-root health of a striped fs tier: fencing, probing, readmission, latency histograms.

A root is **fenced** when it shows a disk failure: a job error naming ``EIO``, ``EROFS`` (a
read-only remount), ``ENOSPC``/``EDQUOT`` (full), ``fence_errors`` failed jobs in a row of any other
kind, or a job still running at its deadline (a stall). While fenced its blocks are misses and its
stores go to the other roots. Every ``probe_interval`` seconds one probe runs on its own thread (never
the engine's): ``statvfs`` (room for two block files), then a small file created, written, read back
and removed in the root's ``tmp/``; a probe that succeeds within the deadline readmits the root; one
that hangs leaves it fenced and no second probe is started until it returns.

Everything here is memory and counters, guarded by the striped tier's lock, except :func:`probe_root`,
which does the probe's I/O.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field

__all__ = ["LATENCY_BOUNDS", "RootHealth", "disk_failure", "probe_root"]

#: Upper bounds (seconds) of the per-root job-latency histogram buckets (+Inf is the count).
LATENCY_BOUNDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)

# Job errors of the fs tier that mean the disk itself is failing (errno names as the store path
# writes them, strerror texts as the load path does, the back-pressure reason after ENOSPC).
_DISK_FAILURE = re.compile(
    r"\b(EIO|EROFS|ENOSPC|EDQUOT)\b|Input/output error|Read-only file system|No space left|"
    r"quota exceeded|disk full",
    re.IGNORECASE,
)
#: Job errors that are no fault of the disk (another process evicted a block, a job was dropped by
#: the tier's own back-pressure gate for slowness, a part given up at its deadline, which counts as
#: a timeout, a file that is not a valid block: planted or damaged, a miss the tier already handles):
#: never counted against the root.
_NOT_DISK = re.compile(
    r"missing|not transferred|dropped|throttl|shut down|abandoned|corrupt|foreign", re.IGNORECASE
)


def disk_failure(error: str | None) -> str | None:
    """The failure kind in a job ``error`` (``"eio"``, ``"readonly"``, ``"full"``), ``"error"`` for
    another error that counts against the root, or ``None`` for one that does not."""
    if not error:
        return None
    m = _DISK_FAILURE.search(error)
    if m is not None:
        text = m.group(0).lower()
        if text in ("erofs", "read-only file system"):
            return "readonly"
        if text in ("eio", "input/output error"):
            return "eio"
        return "full"
    if _NOT_DISK.search(error):
        return None
    return "error"


@dataclass(slots=True)
class RootHealth:
    """Counters and fencing state of one root (fields change under the striped tier's lock)."""

    fenced: bool = False
    reason: str = ""
    fenced_at: float = 0.0
    next_probe: float = 0.0
    probing: bool = False
    fences: int = 0
    readmits: int = 0
    errors: int = 0
    timeouts: int = 0
    probes: int = 0
    consecutive: int = 0
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS) + 1))
    latency_sum: float = 0.0

    def observe(self, seconds: float) -> None:
        """One finished job's latency."""
        i = 0
        while i < len(LATENCY_BOUNDS) and seconds > LATENCY_BOUNDS[i]:
            i += 1
        self.latency_counts[i] += 1
        self.latency_sum += seconds

    def fence(self, reason: str, now: float, probe_interval: float) -> bool:
        """Fence the root (``False`` if it already was)."""
        if self.fenced:
            return False
        self.fenced, self.reason, self.fenced_at = True, reason, now
        self.next_probe = now + probe_interval
        self.fences += 1
        return True

    def readmit(self) -> None:
        self.fenced, self.reason, self.consecutive = False, "", 0
        self.readmits += 1

    def buckets(self) -> list[list[float]]:
        """Cumulative ``[[upper_bound_seconds, count], ...]`` (the engine's histogram shape)."""
        out, total = [], 0
        for bound, n in zip(LATENCY_BOUNDS, self.latency_counts, strict=False):
            total += n
            out.append([bound, float(total)])
        return out


def probe_root(tmp_dir: str, name: str, need_free: int) -> str | None:
    """Probe a root's health (on the prober's own thread: a stalled disk blocks only it): ``None``
    when healthy, else why not. ``statvfs`` (not read-only, ``need_free`` bytes free), then
    ``tmp_dir/name`` created, written, synced, read back and removed."""
    try:
        st = os.statvfs(tmp_dir)
        if st.f_flag & os.ST_RDONLY:
            return "read-only file system"
        if st.f_bavail * st.f_frsize < need_free:
            return f"full: {st.f_bavail * st.f_frsize} bytes free, need {need_free}"
        data = os.urandom(4096)
        path = os.path.join(tmp_dir, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.pwrite(fd, data, 0)
            os.fsync(fd)
            back = os.pread(fd, len(data), 0)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
        if back != data:
            return "read back different bytes"
    except OSError as exc:
        return f"{exc.strerror or exc}"
    return None
