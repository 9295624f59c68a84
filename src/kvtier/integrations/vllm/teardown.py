"""Letting go of vLLM's offload region at shutdown: collect kvtier's reference cycles, frozen or not.

kvtier's tiers and engine hold numpy views of vLLM's shared offload region, some of them in
reference cycles (components that call back into their tier). vLLM's engine core calls
``gc.freeze()`` once it has started (``EngineCore.__init__``, to shorten collections) and
``gc.unfreeze()`` only after the scheduler's shutdown, which is where the region is unmapped: a
plain ``gc.collect()`` there skips every frozen object, the cycles survive, their views keep the
mapping exported and vLLM logs ``Failed to close mmap_obj ... BufferError`` at every shutdown
(with the fs tier, always under the multi-process server). :func:`collect_cycles` collects the
frozen objects too, then freezes the heap again if it was frozen, so the engine's own setting is
unchanged for whatever runs after.
"""

from __future__ import annotations

import gc

__all__ = ["collect_cycles"]


def collect_cycles() -> None:
    """``gc.collect()`` including objects ``gc.freeze()`` moved out of the collector's reach."""
    frozen = gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()
    try:
        gc.collect()
    finally:
        if frozen:
            gc.freeze()
