"""The policy conformance suite: a correct policy passes it, broken ones fail the right tests."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Collection, Iterator
from pathlib import Path

from kvtier.keys import BlockInfo, BlockKey
from kvtier.policies.base import CachePolicy
from kvtier.testing import PolicyContractTests


class FifoPolicy(CachePolicy):
    """Reference FIFO used only here (kvtier's own policies are tested by their own suites)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: dict[BlockKey, None] = {}

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def __iter__(self) -> Iterator[BlockKey]:
        return iter(list(self._order))

    def insert(self, key: BlockKey, info: BlockInfo | None = None) -> None:
        self._order[key] = None

    def touch(self, key: BlockKey) -> None:
        pass

    def remove(self, key: BlockKey) -> None:
        self._order.pop(key, None)

    def evict(
        self, n: int = 1, protected: Collection[BlockKey] = (), incoming: BlockKey | None = None
    ) -> list[BlockKey]:
        victims = [k for k in self._order if k not in protected][:n]
        if len(victims) < n:
            return []
        for k in victims:
            del self._order[k]
        return victims


class TestFifoPolicyContract(PolicyContractTests):
    def make_policy(self, capacity: int) -> CachePolicy:
        return FifoPolicy(capacity)


BROKEN = '''
from hypothesis import Phase, settings

from kvtier.testing import PolicyContractTests
from test_policy_suite import FifoPolicy


class GreedyPolicy(FifoPolicy):
    """Evicts what it can even when it cannot evict n: not atomic."""

    def evict(self, n=1, protected=(), incoming=None):
        victims = [k for k in self._order if k not in protected][:n]
        for k in victims:
            del self._order[k]
        return victims


class IgnoresProtectedPolicy(FifoPolicy):
    def evict(self, n=1, protected=(), incoming=None):
        return super().evict(n, (), incoming)


# Finding the bug is the point here, not shrinking it to a minimal example.
FAST = settings(max_examples=100, deadline=None, phases=[Phase.generate], database=None)


class TestGreedy(PolicyContractTests):
    hypothesis_settings = FAST

    def make_policy(self, capacity):
        return GreedyPolicy(capacity)


class TestIgnoresProtected(PolicyContractTests):
    hypothesis_settings = FAST

    def make_policy(self, capacity):
        return IgnoresProtectedPolicy(capacity)
'''


def test_suite_fails_broken_policies(tmp_path: Path) -> None:
    (tmp_path / "test_broken_policies.py").write_text(textwrap.dedent(BROKEN))
    here = Path(__file__).parent
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
         "-o", "addopts=", str(tmp_path / "test_broken_policies.py")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"PYTHONPATH": str(here), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 1, out
    assert "FAILED test_broken_policies.py::TestGreedy::test_evict_is_atomic_when_impossible" in out
    assert "FAILED test_broken_policies.py::TestGreedy::test_random_operations_keep_the_contract" in out
    assert (
        "FAILED test_broken_policies.py::TestIgnoresProtected::test_evict_returns_exactly_n_unprotected"
        in out
    )
    assert "TestGreedy::test_residency_bookkeeping" not in out
