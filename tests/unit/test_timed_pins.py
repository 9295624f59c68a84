"""Pins with a deadline (``Engine.pin_for``, vLLM's ``kv_hints`` pin): properties and bad input.

The engine runs for real on metadata (``primary_backing: none``) with a virtual clock, so a TTL
passes without sleeping; the policies are the shipped ones. Hypothesis drives random interleavings
of stores, hits, pins and clock ticks and checks each step against a plain model of the pins.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import Engine
from kvtier.errors import ConfigError, MisuseError
from kvtier.integrations.vllm.hints import PIN_ACTION, PinHint, has_pin, pin_hint

SLOTS = 8
KEYS = [bytes([0x40 + i]) * 8 for i in range(24)]


def _engine(policy: str, share: float, clock: list[float]) -> Engine:
    cfg = {
        "cpu_bytes_to_use": SLOTS * 4096,
        "block_bytes": 4096,
        "primary_backing": "none",
        "eviction_policy": policy,
        "pin_share": share,
        "pin_max_ttl_s": 100.0,
    }
    return Engine(cfg, clock=lambda: clock[0])


_key_ids = st.lists(st.integers(0, len(KEYS) - 1), min_size=1, max_size=6)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("store"), _key_ids),
        st.tuples(st.just("hit"), _key_ids),
        st.tuples(st.just("pin"), _key_ids, st.floats(0.5, 100.0)),
        st.tuples(st.just("tick"), st.floats(0.0, 60.0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    policy=st.sampled_from(["prefix", "lru", "s3fifo", "arc", "sieve"]),
    share=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    ops=_ops,
)
def test_a_pinned_block_stays_until_its_deadline_and_pins_stay_within_their_share(
    policy: str, share: float, ops: list[tuple[Any, ...]]
) -> None:
    clock = [0.0]
    engine = _engine(policy, share, clock)
    limit = int(share * SLOTS)
    model: dict[bytes, float] = {}  # key -> deadline, as the engine must hold it
    pr = engine.primary
    for op in ops:
        now = clock[0]
        if op[0] == "tick":
            clock[0] += op[1]
            continue
        keys = [KEYS[i] for i in op[1]]
        if op[0] == "store":
            handle = engine.prepare_store(keys)
            engine.complete_store(handle)
            for key in [k for k, t in model.items() if t <= now]:
                del model[key]  # a store released every pin that had run out
        elif op[0] == "hit":
            engine.lookup(keys)
        else:
            held = engine.pin_for(keys, op[2])
            for key in [k for k, t in model.items() if t <= now]:
                del model[key]
            expect = 0
            for key in keys:
                if key in model:
                    model[key] = max(model[key], now + op[2])
                    expect += 1
                elif key in pr.index and len(model) < limit:
                    model[key] = now + op[2]
                    expect += 1
            assert held == expect
        # Every block whose pin has not run out is still resident and pinned.
        for key, until in model.items():
            assert until > now or op[0] == "hit"
            assert key in pr.index, f"{policy} evicted a block pinned until {until} at {now}"
            assert pr.pins[pr.index[key]] == 1
            assert engine.timed_pins.deadline(key) == until
        assert len(engine.timed_pins) == len(model) <= limit
        assert int(pr.pins_np.sum()) == len(model)  # nothing else pins between calls here
    engine.close()


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(["prefix", "lru", "s3fifo"]),
    ttl=st.floats(0.5, 50.0),
    extra=st.floats(0.001, 10.0),
)
def test_once_the_deadline_passes_the_policy_may_evict_the_block_again(
    policy: str, ttl: float, extra: float
) -> None:
    clock = [0.0]
    engine = _engine(policy, 0.5, clock)
    first = KEYS[:SLOTS]
    engine.complete_store(engine.prepare_store(first))
    assert engine.pin_for(first[:2], ttl) == 2
    clock[0] = ttl - min(extra, ttl / 2)  # still pinned: a store of a full cache gets the rest only
    assert len(engine.prepare_store(KEYS[SLOTS : 2 * SLOTS]).keys) == SLOTS - 2
    clock[0] = ttl + extra
    engine.reset()
    assert engine.stats()["primary"]["timed_pins"] == 0
    assert len(engine.primary.index) == SLOTS - 2  # the reserved (WRITING) slots, nothing pinned
    engine.close()


@pytest.mark.parametrize("ttl", [math.nan, math.inf, -math.inf, 0.0, -1.0, 100.5, True, "5", None])
def test_a_bad_ttl_is_a_one_line_error_naming_the_key(ttl: Any) -> None:
    engine = _engine("prefix", 0.5, [0.0])
    engine.complete_store(engine.prepare_store(KEYS[:2]))
    with pytest.raises(MisuseError) as err:
        engine.pin_for(KEYS[:2], ttl)
    text = str(err.value)
    assert text.startswith("ttl_s:") and "pin_max_ttl_s" in text and "\n" not in text
    assert engine.stats()["primary"]["timed_pins"] == 0
    engine.close()


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"pin_share": 1.5}, "pin_share"),
        ({"pin_share": -0.1}, "pin_share"),
        ({"pin_share": math.nan}, "pin_share"),
        ({"pin_share": "half"}, "pin_share"),
        ({"pin_max_ttl_s": 0}, "pin_max_ttl_s"),
        ({"pin_max_ttl_s": math.inf}, "pin_max_ttl_s"),
        ({"pin_max_ttl_s": 1e9}, "pin_max_ttl_s"),
    ],
)
def test_bad_pin_settings_are_refused_naming_the_key(raw: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        Engine({"primary_backing": "none", "cpu_bytes_to_use": "1MiB", "block_bytes": 4096, **raw})
    assert str(err.value).startswith(f"{key}:") and "\n" not in str(err.value)


# -- the kv_hints action parser ------------------------------------------------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_action = st.fixed_dictionaries(
    {
        "action_id": st.text(max_size=8),
        "action_type": st.sampled_from([PIN_ACTION, "kv.fetch", "kvtier.other"]),
        "action_version": st.sampled_from(["1.0", "2.0", "1"]),
        "payload": st.one_of(
            st.fixed_dictionaries({"ttl_s": st.one_of(st.floats(), st.integers(), st.text(max_size=4))}),
            st.dictionaries(st.text(max_size=6), _json, max_size=3),
            _json,
        ),
    }
)


@settings(max_examples=300, deadline=None)
@given(
    envelope=st.one_of(
        st.fixed_dictionaries({"protocol_version": st.just("0.1"), "actions": st.lists(_action, max_size=4)}),
        _json,
    )
)
def test_any_envelope_gives_a_valid_pin_nothing_or_a_one_line_error(envelope: Any) -> None:
    actions = envelope.get("actions") if isinstance(envelope, dict) else None
    listed = isinstance(actions, list) and any(
        isinstance(a, dict) and a.get("action_type") == PIN_ACTION for a in actions
    )
    assert has_pin(envelope) == listed  # what KvtierTier's notice keys on
    try:
        hint = pin_hint(envelope, 100.0)
    except ConfigError as exc:
        assert exc.key_path.startswith("kv_hints.actions") and "\n" not in str(exc)
        return
    if hint is None:
        actions = envelope.get("actions") if isinstance(envelope, dict) else None
        assert envelope is None or not any(
            isinstance(a, dict) and a.get("action_type") == PIN_ACTION for a in actions or []
        )
        return
    assert isinstance(hint, PinHint) and math.isfinite(hint.ttl_s) and 0 < hint.ttl_s <= 100.0
    first = next(a for a in envelope["actions"] if a["action_type"] == PIN_ACTION)
    assert hint.ttl_s == float(first["payload"]["ttl_s"])
    json.dumps(envelope["actions"][0])  # the parsed form is plain JSON: what a router sends


def test_the_first_pin_action_wins_and_other_components_actions_are_ignored() -> None:
    env = {
        "protocol_version": "0.1",
        "actions": [
            {"action_id": "f", "action_type": "kv.fetch", "action_version": "1.0", "payload": {"x": 1}},
            {"action_id": "a", "action_type": PIN_ACTION, "action_version": "1.0", "payload": {"ttl_s": 30}},
            {"action_id": "b", "action_type": PIN_ACTION, "action_version": "1.0", "payload": {"ttl_s": 90}},
        ],
    }
    assert pin_hint(env, 100.0) == PinHint(30.0, "a")
    assert pin_hint({"actions": env["actions"][:1]}, 100.0) is None
    assert pin_hint(None, 100.0) is None
