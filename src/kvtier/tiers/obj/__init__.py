"""The ``obj`` tier, S3-compatible object stores (docs/remote.md): :mod:`~kvtier.tiers.obj.tier`
(:class:`ObjTier`), :mod:`~kvtier.tiers.obj.options` (:class:`ObjOptions`, its config keys),
:mod:`~kvtier.tiers.obj.clients` (a worker's boto3 and direct clients) and
:mod:`~kvtier.tiers.obj.s3_wire` (the direct GET/PUT path: SigV4, one ``sendmsg``, body into the slot)."""

from kvtier.tiers.obj.options import ObjOptions
from kvtier.tiers.obj.tier import MAX_RETRIES, S3_ERRORS, ObjTier

# The public home of the class is this package (the built-in name's and entry point's target,
# ``kvtier.tiers.obj:ObjTier``); reprs, pickles and ``kvtier plugins`` name it so.
ObjTier.__module__ = __name__

__all__ = ["MAX_RETRIES", "S3_ERRORS", "ObjOptions", "ObjTier"]
