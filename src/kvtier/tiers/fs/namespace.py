"""Opening one fs tier's namespace directory: its shared accounting, the I/O mode its file system
takes, and (small blocks) its segment store; each failure a one-line ``ConfigError`` naming the
option to change."""

from __future__ import annotations

import os

from kvtier.errors import ConfigError
from kvtier.tiers.fs.accounting import SharedAccounting
from kvtier.tiers.fs.layout import Layout, probe_direct_io
from kvtier.tiers.fs.parts import FsParts
from kvtier.tiers.fs.segments import SegmentStore

__all__ = ["open_namespace", "open_segments", "pick_io"]


def open_namespace(layout: Layout, *, fsync: bool, shared_root: bool) -> SharedAccounting:
    """Create the namespace directory and open its shared accounting (``ConfigError`` naming
    ``root_dir`` when it cannot be written)."""
    token = f"{os.getpid()}-{os.urandom(4).hex()}"
    try:
        layout.ensure("root_dir")
        return SharedAccounting(
            layout.ns_dir, token, fsync=fsync, is_block_path=layout.is_block_path,
            owners=None if shared_root else (os.geteuid(),),
        )  # fmt: skip
    except OSError as exc:  # a read-only mount or directory, a file where a directory belongs
        where = exc.filename if isinstance(exc.filename, str) else layout.ns_dir
        raise ConfigError(
            "root_dir",
            f"cannot write the namespace directory: {where} ({exc.strerror or exc}); "
            "choose a writable root_dir or make it writable by this user",
        ) from exc


def pick_io(accounting: SharedAccounting, layout: Layout, direct_io: str, read_io: str) -> tuple[bool, bool]:
    """``(direct writes, direct reads)`` from the options and what the file system takes (the
    accounting is closed when ``direct_io: always`` cannot be had)."""
    probed = (direct_io != "never" or read_io == "direct") and probe_direct_io(accounting.tmp_dir)
    if direct_io == "always" and not probed:
        accounting.close()
        raise ConfigError("direct_io", f"O_DIRECT is not supported under {layout.ns_dir}; use auto or never")
    direct = probed and direct_io != "never"
    return direct, probed and (read_io == "direct" or (read_io == "auto" and direct))


def open_segments(parts: FsParts, seg_cap: int) -> SegmentStore:
    """The small-block path's segment store (the accounting is closed if it cannot open)."""
    try:
        return SegmentStore(parts, segment_bytes=seg_cap, owners=parts.accounting.tree.owners)
    except OSError as exc:  # seg/ is a link or not ours: the hostile-tree rules refuse it
        parts.accounting.close()
        raise ConfigError(
            "root_dir",
            f"cannot use {parts.layout.ns_dir}/seg ({exc.strerror or exc}); it must be a directory "
            "of yours, not a link: remove it",
        ) from exc
    except BaseException:
        parts.accounting.close()
        raise
