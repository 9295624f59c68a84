"""Which form of the fs tier a set of options asks for: one root (``root_dir``) or striped over
several (``root_dirs``, or one root with a health option), and the options only the striped form
takes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtier.errors import ConfigError

__all__ = ["STRIPED_ONLY", "as_striped", "refuse_striped_options"]

#: Options of the striped (``root_dirs``) form only.
STRIPED_ONLY = ("io_timeout", "probe_interval", "fence_errors", "simulate_fenced")


def as_striped(options: Mapping[str, Any]) -> dict[str, Any] | None:
    """``options`` in the striped form, or ``None`` for a plain one-root tier: ``root_dirs``, or a
    ``root_dir`` with a health option (``io_timeout``, ...), which stripes over that one root so
    its jobs get deadlines and its disk fencing (misses while it fails) like several roots' do."""
    if options.get("root_dirs") is not None:
        return dict(options)
    if options.get("root_dir") is not None and any(options.get(k) is not None for k in STRIPED_ONLY):
        out = dict(options)
        out["root_dirs"] = [out.pop("root_dir")]
        return out
    return None


def refuse_striped_options(**given: object) -> None:
    """A ``root_dir`` tier refuses the options only ``root_dirs`` has (one-line ``ConfigError``)."""
    for key, value in given.items():
        if value is not None:
            raise ConfigError(
                key, "applies to a tier with root_dirs; for deadlines and health on one disk write "
                '"root_dirs": ["<your root_dir>"] instead of root_dir',
            )  # fmt: skip
