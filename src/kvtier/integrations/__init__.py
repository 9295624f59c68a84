"""Adapters between kvtier and inference engines.

Each integration lives in its own module and imports its engine lazily, so ``import kvtier`` (and
``import kvtier.integrations``) never needs torch, transformers or vLLM:

* :mod:`kvtier.integrations.transformers` (extra ``hf``): prefix reuse for Hugging Face causal LMs.
* :mod:`kvtier.integrations.vllm` (vLLM 0.33 installed): ``KvtierTier``, any kvtier tier as a vLLM
  secondary tier; :mod:`kvtier.config.vllm` (in the config package) reads vLLM's config and imports no vLLM.
* :mod:`kvtier.integrations.vllm_spec` (vLLM 0.33 installed): ``KvtierOffloadingSpec``, kvtier's whole
  engine as vLLM's scheduler-side offloading manager (``spec_name`` + ``spec_module_path``).
"""
