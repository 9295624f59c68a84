"""kvtier: tiered, pluggable KV-cache offloading for LLM inference engines."""

from __future__ import annotations

__version__ = "0.1.0"
