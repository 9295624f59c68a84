"""The former home of ``KvtierOffloadingSpec`` (``spec_module_path: "kvtier.integrations.vllm_spec"``).

Kept so existing vLLM configs keep loading; new configs name ``kvtier.integrations.vllm``.
"""

from kvtier.integrations.vllm.spec import KvtierOffloadingManager, KvtierOffloadingSpec, engine_config

__all__ = ["KvtierOffloadingManager", "KvtierOffloadingSpec", "engine_config"]
