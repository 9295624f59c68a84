"""The remote-tier base's parts: the error maps cover every exception class each client library
defines, the circuit breaker's state machine, the existence index's policies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from needs import need_module

from kvtier.errors import TierError, TierUnavailableError
from kvtier.keys import BlockKey, LookupResult
from kvtier.tiers.remote.breaker import CircuitBreaker
from kvtier.tiers.remote.errors import ErrorMap, RemoteFullError, RemoteTimeoutError, exception_classes
from kvtier.tiers.remote.index import ExistenceIndex


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- error maps ---------------------------------------------------------------------------------------
def test_every_redis_py_exception_is_mapped() -> None:
    need_module("redis", "redis")
    import redis.exceptions

    from kvtier.tiers.redis import REDIS_ERRORS

    classes = exception_classes(redis.exceptions)
    assert len(classes) > 30  # the whole module, not a handful
    assert REDIS_ERRORS.unmapped(classes) == []


def test_redis_errors_map_to_the_right_kind() -> None:
    need_module("redis", "redis")
    import redis.exceptions as rx

    from kvtier.tiers.redis import REDIS_ERRORS

    assert type(REDIS_ERRORS.translate(rx.ConnectionError("refused"))) is TierUnavailableError
    assert isinstance(REDIS_ERRORS.translate(rx.TimeoutError("slow")), RemoteTimeoutError)
    oom = REDIS_ERRORS.translate(rx.OutOfMemoryError("OOM command not allowed"))
    assert isinstance(oom, RemoteFullError) and isinstance(oom.__cause__, rx.OutOfMemoryError)
    assert "redis: ConnectionError: refused" in str(REDIS_ERRORS.translate(rx.ConnectionError("refused")))


def test_every_botocore_exception_is_mapped() -> None:
    need_module("botocore", "s3")
    import botocore.exceptions

    from kvtier.tiers.obj import S3_ERRORS

    classes = exception_classes(botocore.exceptions)
    assert len(classes) > 50
    assert S3_ERRORS.unmapped(classes) == []


def test_unmapped_subclass_lands_on_its_parent_and_kvtier_errors_pass() -> None:
    class Base(Exception):
        pass

    class Child(Base):
        pass

    m = ErrorMap("x", [(Base, RemoteFullError)])
    assert isinstance(m.translate(Child("c")), RemoteFullError)
    assert m.unmapped([ValueError]) == [ValueError]
    err = TierError("mine")
    assert m.translate(err) is err
    assert isinstance(m.translate(ConnectionRefusedError()), TierUnavailableError)  # builtins


# -- breaker --------------------------------------------------------------------------------------------
def test_breaker_opens_after_threshold_and_half_opens_once() -> None:
    clock = Clock()
    br = CircuitBreaker(threshold=2, reset_after=1.0, clock=clock)
    br.failure()
    assert br.state == "closed" and br.allow()
    br.failure()
    assert br.state == "open" and not br.allow() and br.rejected == 1
    clock.now = 1.0
    assert br.due() and br.allow() and br.state == "half-open"
    assert not br.allow()  # only one trial
    br.failure()
    assert br.state == "open" and br.opens == 2
    clock.now = 2.0
    assert br.allow()
    br.success()
    assert br.state == "closed" and br.allow() and br.peek()


def test_a_lost_trial_is_retried_after_reset() -> None:
    clock = Clock()
    br = CircuitBreaker(threshold=1, reset_after=0.5, clock=clock)
    br.failure()
    clock.now = 0.5
    assert br.allow()
    clock.now = 0.9
    assert not br.allow()
    clock.now = 1.0
    assert br.allow()  # the first trial never reported


@given(st.lists(st.sampled_from(["ok", "fail", "allow", "tick"]), max_size=80))
def test_breaker_invariants(ops: list[str]) -> None:
    """Property: closed always allows; open before reset never does; in a row of ``threshold``
    failures from closed the breaker ends open."""
    clock = Clock()
    br = CircuitBreaker(threshold=3, reset_after=1.0, clock=clock)
    streak = 0
    for op in ops:
        if op == "ok":
            br.success()
            streak = 0
        elif op == "fail":
            br.failure()
            streak += 1
            if streak >= 3:
                assert br.state == "open"
        elif op == "tick":
            clock.now += 0.4
        else:
            state = br.state
            allowed = br.allow()
            if state == "closed":
                assert allowed


# -- index ------------------------------------------------------------------------------------------------
K = BlockKey(b"k")


@pytest.mark.parametrize(("policy", "cold", "warm"), [("check", "retry", "miss"), ("wait", "retry", "retry"),
                                                       ("miss", "miss", "miss")])  # fmt: skip
def test_unknown_key_policies(policy: str, cold: str, warm: str) -> None:
    idx = ExistenceIndex(negative_ttl=1.0, unknown=policy)
    assert idx.lookup(K, 0).value == cold
    idx.warm = True
    assert idx.lookup(BlockKey(b"other"), 0).value == warm
    assert idx.has_queue() == (policy != "miss")


def test_checked_missing_key_is_rechecked_after_negative_ttl() -> None:
    idx = ExistenceIndex(negative_ttl=1.0)
    idx.warm = True
    assert idx.lookup(K, 0) is LookupResult.MISS
    idx.resolve(idx.take_queue(10), [False], 0)
    assert idx.lookup(K, 0.5) is LookupResult.MISS and not idx.has_queue()
    assert idx.lookup(K, 1.5) is LookupResult.MISS and idx.has_queue()  # checked again
    idx.resolve(idx.take_queue(10), [True], 1.5)  # another instance wrote it meanwhile
    assert idx.lookup(K, 1.6) is LookupResult.HIT
    idx.forget(K, 2.0)  # the server evicted it
    assert idx.lookup(K, 2.1) is LookupResult.MISS


def test_index_is_bounded() -> None:
    idx = ExistenceIndex(capacity=3)
    for i in range(10):
        idx.add(BlockKey(bytes([i])))
    assert list(idx.known) == [BlockKey(bytes([i])) for i in (7, 8, 9)]


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "add_many", "forget"]), st.lists(st.integers(0, 12), max_size=6)),
        max_size=30,
    ),
    capacity=st.integers(1, 8),
)
def test_add_many_is_add_of_each_key(ops: list[tuple[str, list[int]]], capacity: int) -> None:
    one, many = ExistenceIndex(capacity=capacity), ExistenceIndex(capacity=capacity)
    for t, (op, ints) in enumerate(ops):
        keys = [BlockKey(bytes([i])) for i in ints]
        if op == "add_many":
            many.add_many(keys)
        for k in keys:
            if op == "forget":
                one.forget(k, t)
                many.forget(k, t)
            else:
                one.add(k)
                if op == "add":
                    many.add(k)
        assert list(one.known) == list(many.known)
        probe = [BlockKey(bytes([i])) for i in range(13)]
        assert [one.lookup(k, t) for k in probe] == [many.lookup(k, t) for k in probe]


def test_a_stale_listing_or_check_never_brings_back_a_dropped_key() -> None:
    """A listing that saw a key before a load dropped it as corrupt must not make it HIT again."""
    idx = ExistenceIndex(negative_ttl=1.0)
    idx.warm = True
    other = BlockKey(b"other")
    assert idx.lookup(K, 0) is LookupResult.MISS  # queued for a check
    queued = idx.take_queue(10)
    idx.add(K)
    idx.forget(K, 0.1)  # dropped as corrupt while the listing and the check ran
    assert idx.add_found([K, other], 0.2) == [other]
    idx.resolve(queued, [True], 0.3)
    assert idx.lookup(K, 0.4) is LookupResult.MISS and idx.lookup(other, 0.4) is LookupResult.HIT
    assert idx.add_found([K], 1.2) == [K]  # after negative_ttl a listing is believed again
    assert idx.lookup(K, 1.3) is LookupResult.HIT


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "forget", "found", "check"]), st.integers(0, 5), st.integers(0, 3)),
        max_size=40,
    )
)
def test_found_keys_never_override_a_fresh_miss(ops: list[tuple[str, int, int]]) -> None:
    """Against a model: a key is HIT iff this instance added it, or something found it while it was
    not known missing, and nothing forgot it since; forgotten keys stay MISS for negative_ttl."""
    ttl = 2.0
    idx = ExistenceIndex(negative_ttl=ttl)
    idx.warm = True
    known: set[int] = set()
    missing_until: dict[int, float] = {}
    now = 0.0
    for op, i, dt in ops:
        now += dt * 0.5
        key = BlockKey(bytes([i]))
        if op == "add":
            idx.add(key)
            known.add(i)
            missing_until.pop(i, None)
        elif op == "forget":
            idx.forget(key, now)
            known.discard(i)
            missing_until[i] = now + ttl
        elif op == "found":
            added = idx.add_found([key], now)
            fresh_miss = missing_until.get(i, -1.0) > now
            assert added == ([] if fresh_miss else [key])
            if not fresh_miss:
                known.add(i)
        else:
            idx.resolve([key], [True], now)
            if missing_until.get(i, -1.0) <= now:
                known.add(i)
        for j in range(6):
            probe = BlockKey(bytes([j]))
            if j in known:
                assert idx.lookup(probe, now) is LookupResult.HIT
            elif missing_until.get(j, -1.0) > now:
                assert idx.lookup(probe, now) is LookupResult.MISS
