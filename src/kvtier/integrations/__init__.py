"""Adapters that plug kvtier into inference engines (vLLM: :mod:`kvtier.integrations.vllm`)."""
