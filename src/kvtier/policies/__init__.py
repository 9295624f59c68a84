"""Eviction policies: :class:`CachePolicy` and the built-ins (lru, arc, s3fifo, sieve, prefix)."""

from kvtier.policies.base import CachePolicy

__all__ = ["CachePolicy"]
