"""The ``fs`` tier: KV blocks as checksummed files in a shared, bounded directory.

``kvtier.tiers.fs:FsTier`` is the entry-point target of the ``fs`` tier type. The package holds
one module per concept: :mod:`~kvtier.tiers.fs.tier` (the tier: options, lookups, wiring),
:mod:`~kvtier.tiers.fs.store_path` and :mod:`~kvtier.tiers.fs.load_path` (the two I/O paths),
:mod:`~kvtier.tiers.fs.index` (the in-memory index), :mod:`~kvtier.tiers.fs.scan` (keeping it equal
to the tree), :mod:`~kvtier.tiers.fs.accounting` (bytes shared across processes),
:mod:`~kvtier.tiers.fs.layout` (names, directories, the scan walk), :mod:`~kvtier.tiers.fs.io` (the
per-block syscalls), :mod:`~kvtier.tiers.fs.policy` (the eviction policy's size and builder), and
the small-block path: :mod:`~kvtier.tiers.fs.segments` (store, roll-over, compaction, sharing),
:mod:`~kvtier.tiers.fs.segment_load` (verified reads), :mod:`~kvtier.tiers.fs.segment_map` (where
each block is), :mod:`~kvtier.tiers.fs.segment_files` (the ``seg/`` directory, hostile-tree rules)
and :mod:`~kvtier.tiers.fs.segment_index` (on-disk names and index records).
"""

from kvtier.tiers.fs.tier import FsTier

# The public home of the class is this package (the ``fs`` tier's registry and entry-point target,
# ``kvtier.tiers.fs:FsTier``); reprs, pickles and ``kvtier plugins`` name it so.
FsTier.__module__ = __name__

__all__ = ["FsTier"]
