"""The public surface: sorted ``__all__``, every name resolves, ``import kvtier`` stays light."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

import kvtier


def test_all_is_sorted_and_unique() -> None:
    assert list(kvtier.__all__) == sorted(kvtier.__all__)
    assert len(set(kvtier.__all__)) == len(kvtier.__all__)


def test_every_public_name_resolves() -> None:
    engine_ready = importlib.util.find_spec("kvtier.engine") is not None
    for name in kvtier.__all__:
        if name in ("Engine", "RequestContext") and not engine_ready:
            continue
        assert getattr(kvtier, name) is not None, name
    assert kvtier.ConfigError is __import__("kvtier.errors", fromlist=["ConfigError"]).ConfigError
    assert kvtier.create_tier is __import__("kvtier.plugins", fromlist=["create_tier"]).create_tier


def test_engine_is_lazy() -> None:
    from kvtier.engine import Engine

    assert kvtier.Engine is Engine


def test_unknown_attribute() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = kvtier.Nope  # type: ignore[attr-defined]


def test_import_kvtier_is_light() -> None:
    code = (
        "import sys, kvtier; heavy = ('numpy', 'kvtier.engine', 'kvtier.plugins', 'rich', 'yaml', 'torch'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_version_matches_package_metadata() -> None:
    from importlib.metadata import version

    assert kvtier.__version__ == version("kvtier")
