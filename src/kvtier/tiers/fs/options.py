"""Checks of the fs tier's scalar options, where they are read: one-line ``ConfigError`` naming the key.

Booleans must be booleans (``"yes"``, ``1`` are refused: a typo must not pass as true), durations
finite and positive, ``root_dir`` a non-empty path with ``~`` expanded, and ``max_bytes`` no larger
than the file system that holds the root (the message shows both sizes).
"""

from __future__ import annotations

import os

from kvtier.errors import ConfigError
from kvtier.tiers.async_tier import check_seconds

__all__ = ["check_bool", "check_choice", "check_max_bytes", "check_seconds", "root_path"]


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
