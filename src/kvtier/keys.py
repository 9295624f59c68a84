"""Block keys and lookup outcomes.

A :data:`BlockKey` names one KV block *and its whole prefix*: ``key_i = H(key_{i-1}, tokens_i, extra)``
seeded by a namespace (model/layout fingerprint + tenant salt). Keys are plain ``bytes`` so engines that
already hash their blocks (vLLM's offload keys are bytes) can pass theirs through unchanged.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NewType

import numpy as np
import xxhash

__all__ = [
    "KEY_BYTES",
    "MAX_KEY_BYTES",
    "BlockInfo",
    "BlockKey",
    "KeyNamespace",
    "LookupCode",
    "LookupResult",
    "chain_key",
    "check_keys",
    "make_namespace",
]

BlockKey = NewType("BlockKey", bytes)
"""Opaque identifier of one KV block and its prefix. Compared and hashed as bytes."""


class LookupResult(enum.Enum):
    """Outcome of asking a tier (or the engine) whether a key is available."""

    MISS = "miss"
    """Not held; the engine must recompute the block."""
    HIT = "hit"
    """Held and readable now."""
    HIT_PENDING = "hit_pending"
    """Held in a slower tier; a promotion into the primary tier is in flight. Ask again later."""
    RETRY = "retry"
    """Unknown yet (index still warming, backend slow to answer); ask again next step."""


class LookupCode(enum.IntEnum):
    """A :class:`LookupResult` as one small integer: the byte values of ``LookupReport.codes``.

    The one definition of these numbers. Hot loops compare plain ``int`` constants derived from it
    once per module (``_HIT = int(LookupCode.HIT)``), because CPython specialises comparisons of
    exact ints only. Member names match :class:`LookupResult`'s.
    """

    MISS = 0
    HIT = 1
    HIT_PENDING = 2
    RETRY = 3

    @property
    def result(self) -> LookupResult:
        """The :class:`LookupResult` this code stands for."""
        return LookupResult[self.name]

    @classmethod
    def of(cls, result: LookupResult) -> LookupCode:
        """The code of ``result``."""
        return cls[result.name]


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """What a KV cache knows about a block that a generic cache does not.

    Passed to :meth:`kvtier.policies.base.CachePolicy.insert` so prefix-aware policies can weigh a
    block by its place in its prefix chain. Every field is optional knowledge: policies must work
    when the engine passes ``None`` instead of a ``BlockInfo``.

    Attributes:
        parent: key of the previous block in the same prefix chain (``None`` for the first block).
        depth: 0-based position of the block in its chain.
        tenant: tenant identifier (used for per-tenant quotas), ``None`` when single-tenant.
    """

    parent: BlockKey | None = None
    depth: int = 0
    tenant: str | None = None


# --------------------------------------------------------------------------------------------------
# Hashing: namespaces and chained block keys.
#
# Everything below is a pure function of its bytes: no Python ``hash()``, no ``id()``, no dict
# ordering, so keys agree across processes, machines and ``PYTHONHASHSEED`` values. The hash is
# xxh3-128 (fast, 16-byte digests; collisions among 2**40 blocks have probability ~2**-49).
#
# Layout of one hashed message (all integers little-endian, so the result is endian-independent):
#     parent key (16 bytes) | domain tag (1 byte) | n_tokens (u32) | tokens (u32 each) | extra
# The fixed-size parent and the token count make the encoding unambiguous (no two different
# (parent, tokens, extra) triples produce the same message), so a collision needs a real xxh3 one.
# --------------------------------------------------------------------------------------------------

KEY_BYTES = 16
#: Longest key the engine accepts (a persistent tier's header, key and MAC fit in one 4 KiB page).
MAX_KEY_BYTES = 2048


def check_keys(where: str, keys: Sequence[object]) -> None:
    """Raise :class:`~kvtier.errors.MisuseError` unless every key is non-empty ``bytes`` of at
    most :data:`MAX_KEY_BYTES` (checked at the API call, so a bad key never reaches a tier's
    worker thread). Two C-level passes for the usual all-good case."""
    if not keys:
        return
    if set(map(type, keys)) == {bytes}:
        lens = list(map(len, keys))  # type: ignore[arg-type]  # all bytes: checked just above
        if min(lens) > 0 and max(lens) <= MAX_KEY_BYTES:
            return
    from kvtier.errors import MisuseError

    for i, k in enumerate(keys):
        if type(k) is not bytes:
            raise MisuseError(f"{where}: key #{i} is {type(k).__name__}, expected bytes (a BlockKey)")
        if not 0 < len(k) <= MAX_KEY_BYTES:
            raise MisuseError(f"{where}: key #{i} is {len(k)} bytes, expected 1..{MAX_KEY_BYTES}")


"""Length of every key this module produces (xxh3-128 digest)."""

_KEY_VERSION = b"kvtier-key-v1"
_TAG_TOKENS = b"T"
_TAG_ENGINE = b"E"
_TAG_TRACE = b"I"
_U32 = struct.Struct("<I")
_TRACE_ID = struct.Struct("<q")
_TOKEN_DTYPE = np.dtype("<u4")


def _field(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return _U32.pack(len(raw)) + raw


@dataclass(frozen=True, slots=True)
class KeyNamespace:
    """The seed of every key chain: a model/layout fingerprint mixed with a tenant salt.

    Build one with :func:`make_namespace` (or :meth:`from_config`). ``fingerprint`` identifies what
    the KV bytes *mean* (model, layout, block size, dtype): blocks of different models never share
    keys. ``root`` additionally mixes in the tenant salt; every key of every chain descends from
    ``root``, so two tenants with different salts get disjoint key spaces (the first hashed message
    already differs, and chains never reconverge short of an xxh3-128 collision).

    Attributes:
        fingerprint: 16-byte digest of (model, layout, block_size, dtype).
        root: 16-byte digest of (fingerprint, cache_salt): the parent of every chain's first block.
        block_size: tokens per block, used by :meth:`key_tokens`.
    """

    fingerprint: bytes
    root: bytes
    block_size: int

    @classmethod
    def from_config(
        cls, config: object, *, block_size: int, dtype: str = "", layout: str = ""
    ) -> KeyNamespace:
        """Namespace from a :class:`kvtier.config.KvtierConfig`-like object.

        Uses its ``model``, ``block_bytes`` (folded into the layout: blocks of different byte size
        never share keys) and ``cache_salt``; the engine supplies ``block_size`` (tokens per block)
        and, when it knows them, ``dtype`` and ``layout``.
        """
        model = str(getattr(config, "model", "default"))
        block_bytes = int(getattr(config, "block_bytes", 0))
        salt = str(getattr(config, "cache_salt", ""))
        return make_namespace(
            model,
            block_size=block_size,
            dtype=dtype,
            layout=f"{layout}|block_bytes={block_bytes}",
            cache_salt=salt,
        )

    def key_block(
        self, parent: bytes | None, tokens: Sequence[int] | np.ndarray, extra: bytes = b""
    ) -> BlockKey:
        """Key of one block: ``H(parent or root, tokens, extra)`` (see :func:`chain_key`)."""
        return chain_key(self.root if parent is None else parent, tokens, extra)

    def key_tokens(
        self,
        tokens: Sequence[int] | np.ndarray,
        *,
        extra: bytes = b"",
        parent: bytes | None = None,
        partial: bool = False,
    ) -> list[BlockKey]:
        """Keys of every block of a token sequence, in one call (>= 1 M tokens/s).

        Blocks are ``block_size`` tokens; a trailing partial block is keyed only when ``partial`` is
        true (engines cache full blocks only). ``extra`` (e.g. LoRA id, multimodal hashes) is mixed
        into every block. ``parent`` continues an existing chain instead of starting at ``root``.
        Raises ``ValueError`` for negative or > 2**32-1 token ids.
        """
        arr = _as_tokens(tokens)
        bs = self.block_size
        n_full = len(arr) // bs
        stop = len(arr) if partial else n_full * bs
        raw = arr[:stop].tobytes()
        step = bs * _TOKEN_DTYPE.itemsize
        header_full = _TAG_TOKENS + _U32.pack(bs)
        digest = xxhash.xxh3_128_digest
        prev = self.root if parent is None else bytes(parent)
        keys: list[BlockKey] = []
        append = keys.append
        for off in range(0, n_full * step, step):
            prev = digest(prev + header_full + raw[off : off + step] + extra)
            append(BlockKey(prev))
        if stop > n_full * bs:
            tail = raw[n_full * step :]
            prev = digest(prev + _TAG_TOKENS + _U32.pack(stop - n_full * bs) + tail + extra)
            append(BlockKey(prev))
        return keys

    def wrap_engine_hash(self, engine_hash: bytes) -> BlockKey:
        """Carry an engine's own block hash (e.g. vLLM's offload key bytes) as a namespaced key.

        The engine's hashes already chain prefixes; this only scopes them to the namespace so two
        tenants (or models) that happen to compute equal engine hashes never share a block.
        """
        return BlockKey(xxhash.xxh3_128_digest(self.root + _TAG_ENGINE + _field(engine_hash)))

    def wrap_engine_hashes(self, engine_hashes: Iterable[bytes]) -> list[BlockKey]:
        """:meth:`wrap_engine_hash` for each hash, in order (the same bytes hashed, with the
        per-call lookups hoisted: an engine adapter wraps every block of every transfer)."""
        digest, base, pack = xxhash.xxh3_128_digest, self.root + _TAG_ENGINE, _U32.pack
        out: list[BlockKey] = []
        append = out.append
        for h in engine_hashes:
            raw = bytes(h)
            append(BlockKey(digest(base + pack(len(raw)) + raw)))
        return out

    def trace_key(self, hash_id: int) -> BlockKey:
        """Key for a trace's integer block id (Mooncake ``hash_ids`` are already chained prefix ids)."""
        return BlockKey(xxhash.xxh3_128_digest(self.root + _TAG_TRACE + _TRACE_ID.pack(int(hash_id))))

    def trace_keys(self, hash_ids: Iterable[int]) -> list[BlockKey]:
        """:meth:`trace_key` for each id, in order."""
        digest = xxhash.xxh3_128_digest
        base = self.root + _TAG_TRACE
        pack = _TRACE_ID.pack
        return [BlockKey(digest(base + pack(int(h)))) for h in hash_ids]


def make_namespace(
    model: str,
    *,
    block_size: int,
    dtype: str = "",
    layout: str = "",
    cache_salt: str | bytes = "",
) -> KeyNamespace:
    """Build the namespace for one (model, KV layout, block size, dtype) and tenant salt.

    Args:
        model: model identity (name and revision); any string.
        block_size: tokens per block (>= 1).
        dtype: KV dtype name, e.g. ``"float16"``.
        layout: free-form KV layout description (layers, heads, head dim, TP rank...).
        cache_salt: tenant salt (config ``cache_salt``); different salts never share keys.
    """
    if int(block_size) < 1:
        raise ValueError(f"block_size must be >= 1 token, got {block_size}")
    fingerprint = xxhash.xxh3_128_digest(
        _field(_KEY_VERSION) + _field(model) + _field(layout) + _U32.pack(int(block_size)) + _field(dtype)
    )
    root = xxhash.xxh3_128_digest(fingerprint + _field(cache_salt))
    return KeyNamespace(fingerprint=fingerprint, root=root, block_size=int(block_size))


def chain_key(parent: bytes, tokens: Sequence[int] | np.ndarray, extra: bytes = b"") -> BlockKey:
    """``key_i = xxh3_128(key_{i-1} | tag | n_tokens | tokens as <u4 | extra)``.

    ``parent`` is the previous key, or the namespace ``root`` for a chain's first block.
    """
    arr = _as_tokens(tokens)
    return BlockKey(
        xxhash.xxh3_128_digest(bytes(parent) + _TAG_TOKENS + _U32.pack(len(arr)) + arr.tobytes() + extra)
    )


def _as_tokens(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as a little-endian uint32 array (a stable byte encoding on every platform)."""
    if isinstance(tokens, np.ndarray) and tokens.dtype == _TOKEN_DTYPE:
        return tokens.reshape(-1)
    arr = np.asarray(tokens)
    if arr.size == 0:
        return np.zeros(0, dtype=_TOKEN_DTYPE)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"token ids must be integers, got dtype {arr.dtype}")
    if (arr.dtype.kind == "i" and int(arr.min()) < 0) or int(arr.max()) > 0xFFFFFFFF:
        raise ValueError("token ids must be in [0, 2**32 - 1]")
    return arr.reshape(-1).astype(_TOKEN_DTYPE, copy=False)
