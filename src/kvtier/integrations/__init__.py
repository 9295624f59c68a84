"""Adapters between kvtier and inference engines.

Each integration lives in its own module and imports its engine lazily, so ``import kvtier`` (and
``import kvtier.integrations``) never needs torch, transformers or vLLM:

* :mod:`kvtier.integrations.transformers` (extra ``hf``): prefix reuse for Hugging Face causal LMs.
* :mod:`kvtier.integrations.vllm` (vLLM 0.32 CPU build, 0.33, 0.34): ``KvtierTier``, any kvtier tier
  as a vLLM secondary tier; ``KvtierOffloadingSpec``, kvtier's whole engine as vLLM's scheduler-side
  offloading manager; the ``KvtierCPU*`` specs, KV offloading on vLLM's CPU backend.
  :mod:`kvtier.config.vllm` (in the config package) reads vLLM's config and imports no vLLM.
"""
