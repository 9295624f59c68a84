"""kvtier inside vLLM: one package, loaded by vLLM's own module-path plug-in slots.

* ``KvtierTier`` (:mod:`.tier`): any kvtier tier as a vLLM secondary tier, loaded by vLLM's
  ``SecondaryTierFactory`` from ``{"type": "KvtierTier", "module_path": "kvtier.integrations.vllm"}``.
* ``KvtierOffloadingSpec`` (:mod:`.spec`): kvtier's whole engine as vLLM's scheduler-side
  offloading manager (``spec_name`` + ``spec_module_path: "kvtier.integrations.vllm"``).
* ``KvtierCPUTieringSpec`` / ``KvtierCPUOffloadingSpec`` (:mod:`.cpu_spec`): the same two on vLLM's
  CPU backend, where vLLM refuses KV offloading: a worker that copies between vLLM's CPU KV cache and
  the offload region in host memory (:mod:`.cpu_worker`), reusing vLLM's transfer descriptors.
* :mod:`.compat`: the vLLM versions this package knows (0.32, 0.33, 0.34) and what differs.

Names resolve lazily (module ``__getattr__``), so vLLM's factory importing this package for
``KvtierTier`` does not import the spec modules, and ``import kvtier.integrations`` imports no vLLM.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "KvtierCPUOffloadingSpec",
    "KvtierCPUTieringSpec",
    "KvtierOffloadingManager",
    "KvtierOffloadingSpec",
    "KvtierTier",
    "METRIC_LABEL",
    "METRIC_PREFIX",
    "engine_config",
]

_WHERE = {
    "KvtierTier": ".tier",
    "METRIC_LABEL": ".tier",
    "METRIC_PREFIX": ".tier",
    "KvtierOffloadingSpec": ".spec",
    "KvtierOffloadingManager": ".spec",
    "engine_config": ".spec",
    "KvtierCPUTieringSpec": ".cpu_spec",
    "KvtierCPUOffloadingSpec": ".cpu_spec",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
