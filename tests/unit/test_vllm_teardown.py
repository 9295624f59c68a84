"""collect_cycles frees frozen reference cycles that keep a mapping exported (vLLM freezes its heap).

Imports no vLLM: the helper is plain ``gc``; the end-to-end check is
tests/integration/test_vllm_cpu_docs.py (a SIGINT'ed multi-process vLLM server logs no
``Failed to close mmap_obj``).
"""

from __future__ import annotations

import gc
import mmap

import numpy as np
import pytest

from kvtier.integrations.vllm.teardown import collect_cycles


class _Holder:
    def __init__(self, view: memoryview) -> None:
        self.rows = np.asarray(view)
        self.me = self  # a cycle: only the collector frees it


def test_a_frozen_cycle_holding_a_view_is_collected_and_the_heap_refrozen() -> None:
    region = mmap.mmap(-1, 4096)
    holder = _Holder(memoryview(region))
    del holder
    gc.freeze()  # what vLLM's EngineCore does once started
    try:
        gc.collect()
        with pytest.raises(BufferError):
            region.close()  # the plain collect skipped the frozen cycle
        collect_cycles()
        region.close()  # no export left
        assert gc.get_freeze_count() > 0  # frozen again, as the engine had it
    finally:
        gc.unfreeze()


def test_without_a_frozen_heap_it_is_a_plain_collect() -> None:
    region = mmap.mmap(-1, 4096)
    holder = _Holder(memoryview(region))
    del holder
    assert gc.get_freeze_count() == 0
    collect_cycles()
    region.close()
    assert gc.get_freeze_count() == 0
