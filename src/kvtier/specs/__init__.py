"""Offloading specs: how a whole tier stack is assembled from config."""

from kvtier.specs.base import OffloadingSpec

__all__ = ["OffloadingSpec"]
