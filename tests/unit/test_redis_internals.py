"""The redis-py internals the redis tier reads (``Connection._sock``, ``Connection._parser.parse_error``)
are where kvtier.tiers.redis.wire expects them, in the release installed here, and the release is in the
range pyproject pins. A redis-py release that moves them fails here, not in a user's cache."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

redis = pytest.importorskip("redis")
from redis import connection as rc  # noqa: E402
from redis import exceptions as rx  # noqa: E402

from kvtier.tiers.redis.wire import REDIS_PY_RANGE, conn_error_parser, conn_socket  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def test_pyproject_pins_the_range_the_wire_module_names() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["redis"] == [f"redis{REDIS_PY_RANGE}"]


def test_installed_redis_py_is_in_the_pinned_range() -> None:
    lo, hi = re.fullmatch(r">=([\d.]+),<([\d.]+)", REDIS_PY_RANGE).groups()  # type: ignore[union-attr]
    assert _version(lo) <= _version(redis.__version__) < _version(hi), redis.__version__


@pytest.mark.parametrize("cls", [rc.Connection, rc.SSLConnection, rc.UnixDomainSocketConnection])
def test_connection_internals_are_where_the_tier_reads_them(cls: type) -> None:
    conn = cls()  # not connected: nothing is opened
    assert conn_socket(conn) is None
    err = conn_error_parser(conn)("ERR unknown command 'KVTIER'")
    assert isinstance(err, rx.ResponseError)
    assert "KVTIER" in str(err)
