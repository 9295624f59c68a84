"""The conformance suite is honest: it fails tiers that break the contract (run in a real pytest)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

BROKEN = '''
from pathlib import Path

from kvtier.testing import PrimaryBuffer, TierContractTests
from kvtier.tiers.async_tier import ChunkOutcome
from kvtier.tiers.example import ExampleTier


class KeysOnlyTier(ExampleTier):
    """Like vLLM's example tier: remembers keys, copies no bytes."""

    def _load_chunk(self, state, items):
        held = [k for k, _ in items if k in self._blocks]
        return ChunkOutcome(done=held, nbytes=len(held) * self.block_bytes)


class ReportsTwiceTier(ExampleTier):
    def get_finished_jobs(self):
        done = super().get_finished_jobs()
        if done and getattr(self, "_again", None) is None:
            self._again = done  # report the first batch a second time on the next call
            return done
        again, self._again = (getattr(self, "_again", None) or []), []
        return done + again


class ScribblesPastBlockTier(ExampleTier):
    """Loads right, then writes one byte just past the block: padding no tier may touch, even one
    allowed the row pad (``writes_row_pad``)."""

    def _load_chunk(self, state, items):
        outcome = super()._load_chunk(state, items)
        for _, slot in items:
            self.rows[slot, self.block_bytes] = 0
        return outcome


class TestKeysOnly(TierContractTests):
    def make_tier(self, primary: PrimaryBuffer, workdir: Path):
        return KeysOnlyTier(primary_kv_view=primary.view, context=primary.context())


class TestScribblesPastBlock(TierContractTests):
    row_stride = 8192 + 4096
    writes_row_pad = True

    def make_tier(self, primary: PrimaryBuffer, workdir: Path):
        return ScribblesPastBlockTier(primary_kv_view=primary.view, context=primary.context())


class TestReportsTwice(TierContractTests):
    def make_tier(self, primary: PrimaryBuffer, workdir: Path):
        return ReportsTwiceTier(primary_kv_view=primary.view, context=primary.context())
'''


def test_suite_fails_broken_tiers(tmp_path: Path) -> None:
    test_file = tmp_path / "test_broken_tiers.py"
    test_file.write_text(textwrap.dedent(BROKEN))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
         "-o", "addopts=", str(test_file)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 1, out
    # The byte round trips catch the tier that copies nothing ...
    assert "FAILED test_broken_tiers.py::TestKeysOnly::test_store_then_load_round_trips_bytes" in out
    assert "FAILED test_broken_tiers.py::TestKeysOnly::test_drain_waits_for_buffer_io" in out
    # ... the padding check catches a write past the block, even where the row pad may be written ...
    scribble = "TestScribblesPastBlock::test_store_then_load_round_trips_bytes"
    assert f"FAILED test_broken_tiers.py::{scribble}" in out
    # ... and the exactly-once check catches duplicate reports.
    assert "FAILED test_broken_tiers.py::TestReportsTwice::test_every_job_is_reported_exactly_once" in out
    # Tests a broken tier does not violate still pass: the suite is specific, not all-or-nothing.
    assert "TestKeysOnly::test_lookup_of_unknown_key_is_miss" not in out
