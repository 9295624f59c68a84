"""Rendezvous placement of the striped fs tier (property tests): deterministic, consistent when a
root is added or removed (only that root's keys move), and fair to the roots' weights."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.tiers.fs.placement import Placement

_ids = st.lists(st.text(min_size=1, max_size=12), min_size=2, max_size=8, unique=True)
_keys = st.lists(st.binary(min_size=1, max_size=32), min_size=1, max_size=200, unique=True)


@settings(max_examples=60, deadline=None)
@given(ids=_ids, keys=_keys, data=st.data())
def test_removing_a_root_moves_only_its_keys(ids: list[str], keys: list[bytes], data: st.DataObject) -> None:
    weights = data.draw(st.lists(st.floats(0.1, 10.0), min_size=len(ids), max_size=len(ids)))
    gone = data.draw(st.integers(0, len(ids) - 1))
    before = Placement(ids, weights)
    kept = [i for i in range(len(ids)) if i != gone]
    after = Placement([ids[i] for i in kept], [weights[i] for i in kept])
    everyone = list(range(len(ids)))
    for k in keys:
        was = before.choose(k, everyone)
        now = kept[after.choose(k, list(range(len(kept))))]  # type: ignore[index]
        if was != gone:
            assert now == was  # a block of a root that stays never moves
        # The same answer as fencing the root in place (the live tier's view of a failed disk).
        assert before.choose(k, kept) == now


@settings(max_examples=60, deadline=None)
@given(ids=_ids, keys=_keys, data=st.data())
def test_adding_a_root_moves_keys_only_to_it(ids: list[str], keys: list[bytes], data: st.DataObject) -> None:
    new = data.draw(st.text(min_size=1, max_size=12).filter(lambda s: s not in ids))
    weights = [1.0] * len(ids)
    before, after = Placement(ids, weights), Placement([*ids, new], [*weights, 1.0])
    n = len(ids)
    for k in keys:
        now = after.choose(k, list(range(n + 1)))
        assert now in (before.choose(k, list(range(n))), n)


@settings(max_examples=60, deadline=None)
@given(ids=_ids, keys=_keys, data=st.data())
def test_choose_two_is_the_best_and_the_runner_up(
    ids: list[str], keys: list[bytes], data: st.DataObject
) -> None:
    p = Placement(ids, [1.0] * len(ids))
    admitted = sorted(data.draw(st.sets(st.integers(0, len(ids) - 1), max_size=len(ids))))
    for k in keys:
        best, second = p.choose_two(k, admitted)
        assert best == p.choose(k, admitted)
        if len(admitted) < 2:
            assert second is None and (best is None) == (not admitted)
            continue
        assert best is not None and second is not None and second != best
        # The runner-up is where the key would go were its best root fenced.
        assert second == p.choose(k, [r for r in admitted if r != best])


def test_placement_follows_the_weights() -> None:
    p = Placement(["a", "b", "c"], [1.0, 2.0, 1.0])
    counts = [0, 0, 0]
    for i in range(20_000):
        counts[p.choose(i.to_bytes(8, "little"), [0, 1, 2]) or 0] += 1
    # Expected 5,000 / 10,000 / 5,000; binomial sd ~70-80.
    assert abs(counts[0] - 5000) < 400 and abs(counts[1] - 10000) < 400 and abs(counts[2] - 5000) < 400
    assert p.choose(b"k", []) is None


@pytest.mark.parametrize("weights", [[1.0], [0.0, 1.0], [float("nan"), 1.0], [float("inf"), 1.0]])
def test_bad_weights_are_refused(weights: list[float]) -> None:
    ids = [str(i) for i in range(len(weights))]
    if len(weights) == 1:
        ids = ["a", "b"]  # one weight for two roots
    with pytest.raises(ValueError):
        Placement(ids, weights)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("EIO: Input/output error", "eio"),
        ("read error: Input/output error", "eio"),
        ("EROFS: Read-only file system", "readonly"),
        ("OSError: [Errno 30] Read-only file system: '/x'", "readonly"),
        ("ENOSPC: No space left on device", "full"),
        ("disk full: store dropped (back-pressure)", "full"),
        ("EACCES: Permission denied", "error"),
        ("missing", None),
        ("2 of 4 key(s) not transferred", None),
        ("corrupt: checksum", None),
        ("abandoned: past the deadline", None),
        ("store dropped: tier too slow (throttled)", None),
        (None, None),
    ],
)
def test_job_errors_are_classified_as_disk_failures_or_not(error: str | None, kind: str | None) -> None:
    from kvtier.tiers.fs.health import disk_failure

    assert disk_failure(error) == kind
