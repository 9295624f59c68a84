"""Mooncake return codes sort into exactly one kind, and the error raised for a code is of the
kvtier class the remote base acts on (unavailable trips the breaker, full pauses stores)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import TierError, TierUnavailableError
from kvtier.tiers.mooncake import codes as mc
from kvtier.tiers.remote.errors import RemoteFullError, RemoteRejectedError

KINDS = {mc.MISSING, mc.EXISTS, mc.FULL, mc.UNAVAILABLE, mc.REJECTED}


def test_known_codes() -> None:
    assert mc.kind_of(-704) == mc.MISSING  # OBJECT_NOT_FOUND: a miss
    assert mc.kind_of(-705) == mc.EXISTS
    assert mc.kind_of(-200) == mc.FULL and mc.kind_of(-1700) == mc.FULL
    assert mc.kind_of(-800) == mc.UNAVAILABLE and mc.kind_of(-900) == mc.UNAVAILABLE
    assert mc.kind_of(-706) == mc.REJECTED  # a lease: the request only
    assert mc.name_of(-704) == "OBJECT_NOT_FOUND" and mc.name_of(-12345) == "code -12345"


@given(st.integers(min_value=-(2**31), max_value=-1))
def test_every_code_has_one_kind_and_a_matching_error(code: int) -> None:
    kind = mc.kind_of(code)
    assert kind in KINDS
    err = mc.code_error(code, "batch_put")
    assert isinstance(err, mc.MooncakeUnavailableError | mc.MooncakeFullError | mc.MooncakeRejectedError)
    assert isinstance(err, TierError) and err.code == code
    assert "batch_put" in str(err) and "\n" not in str(err)
    if kind in (mc.UNAVAILABLE, mc.MISSING):
        assert isinstance(err, TierUnavailableError)
    elif kind == mc.FULL:
        assert isinstance(err, RemoteFullError) and not isinstance(err, TierUnavailableError)
    else:
        assert isinstance(err, RemoteRejectedError)


def test_binding_exceptions_are_mapped() -> None:
    assert isinstance(mc.MOONCAKE_ERRORS.translate(RuntimeError("rpc")), TierUnavailableError)
    assert isinstance(mc.MOONCAKE_ERRORS.translate(TypeError("bad arg")), TierError)
