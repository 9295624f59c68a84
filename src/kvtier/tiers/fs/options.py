"""Checks of the fs tier's scalar options, where they are read: one-line ``ConfigError`` naming the key.

Booleans must be booleans (``"yes"``, ``1`` are refused: a typo must not pass as true), durations
finite and positive, ``root_dir`` a non-empty path with ``~`` expanded, and ``max_bytes`` no larger
than the file system that holds the root (the message shows both sizes).
"""

from __future__ import annotations

import os

from kvtier.config import parse_size
from kvtier.errors import ConfigError
from kvtier.tiers.async_tier import check_seconds

__all__ = [
    "check_bool",
    "check_choice",
    "check_max_bytes",
    "check_seconds",
    "root_path",
    "segment_cap",
    "small_block_limit",
]

#: Default ``small_block_bytes``: blocks up to this size go to segments (docs/fs.md, "Small blocks").
SMALL_BLOCK_DEFAULT = 64 << 10
_SEG_MIN, _SEG_MAX = 1 << 20, 64 << 20
#: A segment holds at least this many records (so compaction always frees room).
SEG_MIN_RECORDS = 8


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


def check_max_bytes(max_bytes: int | None, root: str) -> None:
    """Refuse a ``max_bytes`` larger than the file system holding ``root`` (or its nearest
    existing ancestor)."""
    if max_bytes is None:
        return
    probe = root
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
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
