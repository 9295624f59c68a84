"""Optional dependencies and services in tests: skip locally with the reason, fail in CI.

``.ci/run`` installs every extra and starts every service, so under ``CI=true`` a missing one is a
broken CI set-up, never a reason to skip: :func:`need_module` and :func:`need` then fail the test.
On a developer's machine without the extra they skip, naming what to install.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

__all__ = ["IN_CI", "need", "need_module"]

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def need(condition: bool, reason: str) -> None:
    """Skip (locally) or fail (``CI=true``) the calling test unless ``condition`` holds."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI=true but {reason}: .ci/run must provide it", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def need_module(name: str, extra: str | None = None) -> ModuleType:
    """Import ``name``; when it is missing skip locally (``pip install 'kvtier[extra]'``) or fail in CI."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        hint = f" (pip install 'kvtier[{extra}]')" if extra else ""
        need(False, f"{name} is not installed{hint}: {exc}")
        raise  # unreachable: need() skipped or failed
