"""Checks of the fs tier's options, where they are read: one-line ``ConfigError`` naming the key.

Booleans must be booleans (``"yes"``, ``1`` are refused: a typo must not pass as true), durations
finite and positive, ``root_dir`` a non-empty path with ``~`` expanded, and ``max_bytes`` no larger
than the file system that holds the root (the message shows both sizes).

:func:`read_options` runs every check and creates nothing (it only reads: ``statvfs``, ``lstat``
of the root and namespace directories, the secret file), so the same function serves the tier's
constructor and :meth:`FsTier.check_options <kvtier.tiers.fs.tier.FsTier.check_options>`, which
validates a whole config before any tier touches the disk (``kvtier check`` and ``Engine``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from kvtier.config import parse_size
from kvtier.errors import ConfigError
from kvtier.tiers.async_tier import check_seconds
from kvtier.tiers.base import TierContext
from kvtier.tiers.fs.layout import Layout
from kvtier.tiers.fs.parts import FsOptions
from kvtier.tiers.fs.policy import build_policy, policy_capacity
from kvtier.tiers.fs.segment_index import idx_bytes
from kvtier.tiers.fs.segments import record_size
from kvtier.tiers.fs.trust import check_private_dir, load_secret

__all__ = [
    "SMALL_BLOCK_DEFAULT",
    "FsOptions",
    "check_bool",
    "check_choice",
    "check_max_bytes",
    "check_seconds",
    "nearest_existing",
    "read_options",
    "root_path",
    "segment_cap",
    "small_block_limit",
]

#: Default ``small_block_bytes``: blocks up to this size go to segments (docs/fs.md, "Small blocks").
SMALL_BLOCK_DEFAULT = 64 << 10
_SEG_MIN, _SEG_MAX = 1 << 20, 64 << 20
#: A segment holds at least this many records (so compaction always frees room).
SEG_MIN_RECORDS = 8

_VERIFY = ("always", "never")
_DIRECT = ("auto", "always", "never")
_READ_IO = ("auto", "direct", "buffered")


def read_options(context: TierContext, a: Mapping[str, Any]) -> FsOptions:
    """Check the fs tier's own options ``a`` (every keyword of its constructor but the worker
    options and ``primary_kv_view``/``context``); writes nothing. Raises :class:`ConfigError`."""
    if a["root_dir"] is None:
        raise ConfigError("root_dir", 'missing; give a directory such as "/mnt/nvme/kvtier"')
    verify, direct_io = a["verify"], a["direct_io"]
    if verify not in _VERIFY:
        raise ConfigError("verify", f"expected one of {', '.join(_VERIFY)}, got {verify!r}")
    if isinstance(direct_io, bool):
        direct_io = "always" if direct_io else "never"
    if direct_io not in _DIRECT:
        raise ConfigError("direct_io", f"expected one of {', '.join(_DIRECT)}, got {direct_io!r}")
    max_bytes = None if a["max_bytes"] is None else parse_size(a["max_bytes"], "max_bytes")
    fsync = check_bool("fsync", a["fsync"])
    full_backoff = check_seconds("full_backoff", a["full_backoff"])
    record_access = check_bool("record_access", a["record_access"])
    refresh_interval = check_seconds("refresh_interval", a["refresh_interval"])
    precreate = check_bool("precreate_dirs", a["precreate_dirs"])
    shared = check_bool("shared_root", a["shared_root"])
    read_io = check_choice("read_io", a["read_io"], _READ_IO)
    seg_cap = None
    if context.block_bytes <= small_block_limit(a["small_block_bytes"]):
        record = record_size(32, context.block_bytes, shared) + idx_bytes(32)
        seg_cap = segment_cap(a["segment_bytes"], max_bytes, record)
    layout = Layout(root_path(a["root_dir"]), context.namespace, context.block_bytes)
    check_max_bytes(max_bytes, layout.root_dir)
    mac = load_secret("root_dir", a["secret_env"], a["secret_file"]) if shared else None
    if not shared:
        for d in (layout.root_dir, layout.ns_dir):
            check_private_dir("root_dir", d)
    if max_bytes is not None and max_bytes < layout.file_size(32):
        raise ConfigError(
            "max_bytes", f"{max_bytes} bytes hold no block file of {layout.file_size(32)} bytes; raise it"
        )
    policy = build_policy(
        a["eviction_policy"], policy_capacity(max_bytes, layout.block_bytes), a["policy_options"] or {}
    )
    return FsOptions(
        layout, max_bytes, policy, verify == "always", fsync, direct_io, full_backoff, record_access,
        refresh_interval, precreate, shared, mac, read_io, seg_cap,
    )  # fmt: skip


def check_bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, f"expected true or false, got {value!r}")
    return value


def check_choice(key: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(key, f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def root_path(value: str | os.PathLike[str]) -> str:
    """``root_dir`` as an absolute path: ``~`` expanded, an empty string refused."""
    raw = os.fspath(value)
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError("root_dir", 'is empty; give a directory such as "/mnt/nvme/kvtier"')
    return os.path.abspath(os.path.expanduser(raw))


def nearest_existing(path: str) -> str:
    """``path``, or its nearest ancestor that exists (a root not created yet is measured on the
    file system that will hold it)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def check_max_bytes(max_bytes: int | None, root: str) -> None:
    """Refuse a ``max_bytes`` larger than the file system holding ``root`` (or its nearest
    existing ancestor)."""
    if max_bytes is None:
        return
    probe = nearest_existing(root)
    try:
        st = os.statvfs(probe)
    except OSError:
        return  # cannot tell: the tier's own accounting still bounds the tree
    total = st.f_blocks * st.f_frsize
    if total and max_bytes > total:
        raise ConfigError(
            "max_bytes",
            f"{max_bytes} bytes is more than the {total} bytes of the file system holding {probe}; "
            "lower it or choose a larger root_dir",
        )


def small_block_limit(value: object) -> int:
    """``small_block_bytes`` as bytes (``0`` turns the small-block path off)."""
    n = parse_size(value, "small_block_bytes")
    if n > 1 << 30:
        raise ConfigError("small_block_bytes", f"{n} bytes is not a small block; use <= 1GiB (0: off)")
    return n


def segment_cap(value: object, max_bytes: int | None, record: int) -> int | None:
    """Bytes one segment may grow to: ``segment_bytes``, or by default ``max_bytes / 16`` within
    1-64 MiB (4 KiB multiples). A segment must hold ``SEG_MIN_RECORDS`` records of ``record``
    bytes, and ``max_bytes`` two segments (compaction needs a second one). ``None``: by default,
    a ``max_bytes`` too small for two segments (under 2 MiB) keeps one file per block instead."""
    need = SEG_MIN_RECORDS * record
    if value is None:
        cap = _SEG_MAX if max_bytes is None else min(_SEG_MAX, max(_SEG_MIN, max_bytes // 16))
        cap = max(cap - cap % 4096, need)
        return None if max_bytes is not None and max_bytes < 2 * cap else cap
    cap = parse_size(value, "segment_bytes")
    if cap < need:
        raise ConfigError(
            "segment_bytes", f"{cap} bytes hold < {SEG_MIN_RECORDS} records of {record} bytes; raise it"
        )
    if max_bytes is not None and max_bytes < 2 * cap:
        raise ConfigError(
            "segment_bytes",
            f"max_bytes {max_bytes} holds fewer than two segments of {cap} bytes; lower segment_bytes "
            "or raise max_bytes",
        )
    return cap
