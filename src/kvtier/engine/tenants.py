"""Tenant scoping: the engine-internal keys of a request that names a ``tenant``.

A tenant's keys carry a 9-byte prefix (``0x01`` + an 8-byte tag) derived from the tenant's name,
so tenant B never hits tenant A's blocks in any tier. The tags are keyed by the deployment's
``model`` + ``cache_salt``: engines of one deployment agree on them (shared tiers still share a
tenant's blocks), while a caller that omits the tenant cannot forge another tenant's internal keys
unless it knows ``cache_salt``. Tags are computed once per tenant name and cached.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from kvtier.engine.types import RequestContext
from kvtier.keys import BlockKey

__all__ = ["TenantScope"]


class TenantScope:
    """Maps a request's keys to the engine-internal keys (tenant-prefixed when it has a tenant)."""

    __slots__ = ("_key", "_prefix")

    def __init__(self, model: str, cache_salt: str) -> None:
        self._key = hashlib.blake2b(f"{model}\0{cache_salt}".encode(), digest_size=32).digest()
        self._prefix: dict[str, bytes] = {}

    def scope(self, keys: Sequence[BlockKey], request: RequestContext | None) -> list[BlockKey]:
        """Engine-internal keys for ``keys`` (a list, the same one when there is no tenant)."""
        if request is None or request.tenant is None:
            return keys if isinstance(keys, list) else list(keys)
        prefix = self._prefix.get(request.tenant)
        if prefix is None:
            digest = hashlib.blake2b(
                request.tenant.encode(), digest_size=8, key=self._key, person=b"kvtier-tenant"
            ).digest()
            prefix = self._prefix.setdefault(request.tenant, b"\x01" + digest)
        return [BlockKey(prefix + k) for k in keys]
