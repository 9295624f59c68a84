"""The block format shared by persistent and remote tiers: a small verified header + the payload.

Layout (little-endian), ``header_len`` bytes of header then ``payload_len`` bytes of payload::

    offset size field
         0    4 magic          b"KVTB"
         4    1 version        FORMAT_VERSION (1)
         5    1 checksum algo  1 = xxh3-64
         6    2 key_len        bytes of the key that follows the fixed part
         8    4 header_len     fixed part + key + zero padding (a multiple of the writer's alignment)
        12    8 payload_len
        20    8 namespace_tag  xxh3-64 of the namespace string: blocks of another namespace are foreign
        28    8 checksum       xxh3-64 of the payload, seeded by a hash of (key, namespace_tag, payload_len)
        36    4 header_check   low 32 bits of xxh3-64 over bytes 0..36 and the key
        40    - key, then zero padding up to header_len

Why this shape:
    * the key and namespace live in the header, so a file renamed or copied to another key or
      namespace is *foreign* and never served, even if its own checksum is fine;
    * the payload checksum is seeded by the key, so swapping two payloads between headers fails too;
    * ``header_check`` is cheap and always verified, so even ``verify: never`` catches a damaged
      header (wrong length, wrong key); the payload checksum costs one xxh3 pass (~10+ GB/s);
    * ``header_len`` may be padded (the fs tier pads to 4096) so the payload starts on a page
      boundary and can be read/written with ``O_DIRECT`` straight into/out of a primary slot.

Every decode failure raises :class:`CorruptBlockError` with a short ``reason``; callers treat it as
a miss, count it, and drop the blob. Never serve a byte that did not verify.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import xxhash

from kvtier.errors import TierError

__all__ = [
    "CHECKSUM_XXH3_64",
    "FIXED_HEADER_SIZE",
    "FORMAT_VERSION",
    "HeaderMaker",
    "MAGIC",
    "MAX_KEY_LEN",
    "BlockHeader",
    "CorruptBlockError",
    "check_payload_digest",
    "decode",
    "encode",
    "encode_header",
    "header_size",
    "namespace_tag",
    "parse_header",
    "payload_checksum",
    "payload_seed_tail",
    "verify_payload",
]

MAGIC: Final = b"KVTB"
FORMAT_VERSION: Final = 1
CHECKSUM_XXH3_64: Final = 1
_FIXED = struct.Struct("<4sBBHIQQQ")
_CHECK = struct.Struct("<I")
FIXED_HEADER_SIZE: Final = _FIXED.size + _CHECK.size  # 40
MAX_KEY_LEN: Final = 0xFFFF


class CorruptBlockError(TierError):
    """A blob failed verification: wrong magic/version/key/namespace/length/checksum.

    ``reason`` is one short word for metrics and logs: ``"short"``, ``"magic"``, ``"version"``,
    ``"header"``, ``"key"``, ``"namespace"``, ``"length"`` or ``"checksum"``.
    """

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """Parsed header fields (already checked for magic, version and ``header_check``)."""

    key: bytes
    header_len: int
    payload_len: int
    namespace_tag: int
    checksum: int


def namespace_tag(namespace: str) -> int:
    """Stable 64-bit tag of a namespace string (stored in every header)."""
    return xxhash.xxh3_64_intdigest(namespace.encode("utf-8"))


def header_size(key_len: int, align: int = 1) -> int:
    """Bytes of header for a key of ``key_len`` bytes, rounded up to a multiple of ``align``."""
    if not 0 <= key_len <= MAX_KEY_LEN:
        raise ValueError(f"key length must be 0..{MAX_KEY_LEN} bytes, got {key_len}")
    if align < 1:
        raise ValueError(f"align must be >= 1, got {align}")
    raw = FIXED_HEADER_SIZE + key_len
    return -(-raw // align) * align


def _seed_tail(ns_tag: int, payload_len: int) -> bytes:
    """What follows the key in the bytes the payload checksum's seed is hashed from."""
    return ns_tag.to_bytes(8, "little") + payload_len.to_bytes(8, "little")


def _seed(key: bytes, ns_tag: int, payload_len: int) -> int:
    return xxhash.xxh3_64_intdigest(key + _seed_tail(ns_tag, payload_len))


def _pack(key: bytes, hlen: int, payload_len: int, ns_tag: int, checksum: int) -> bytes:
    """The fixed part, its check and the key (the unpadded header)."""
    fixed = _FIXED.pack(
        MAGIC, FORMAT_VERSION, CHECKSUM_XXH3_64, len(key), hlen, payload_len, ns_tag, checksum
    )
    return fixed + _CHECK.pack(xxhash.xxh3_64_intdigest(fixed + key) & 0xFFFFFFFF) + key


def payload_checksum(key: bytes, ns_tag: int, payload: bytes | memoryview | bytearray) -> int:
    """The checksum stored in the header for ``payload`` under ``key`` in namespace ``ns_tag``."""
    n = memoryview(payload).nbytes
    return xxhash.xxh3_64_intdigest(payload, seed=_seed(key, ns_tag, n))


def encode_header(key: bytes, payload_len: int, checksum: int, ns_tag: int, align: int = 1) -> bytes:
    """The header bytes (``header_size(len(key), align)`` long) for a payload already summed."""
    hlen = header_size(len(key), align)
    out = _pack(key, hlen, payload_len, ns_tag, checksum)
    return out + bytes(hlen - len(out))


class HeaderMaker:
    """Headers padded to a multiple of ``align`` for payloads of ``payload_len`` bytes in namespace
    ``ns_tag``: the per-block step of a tier's hot loop, the same bytes as :func:`encode_header` of
    :func:`payload_checksum` in a third of the calls (the seed's tail is computed once, the padding
    once per key length).

    ``maker(key, payload)`` returns the header of ``payload`` under ``key``; ``payload`` must be
    exactly ``payload_len`` bytes (a C-contiguous buffer; it is read once, never copied), and
    ``key`` at most :data:`MAX_KEY_LEN` bytes.
    """

    __slots__ = ("_pads", "_tail", "align", "ns_tag", "payload_len")

    def __init__(self, ns_tag: int, payload_len: int, align: int = 1) -> None:
        self.ns_tag = ns_tag
        self.payload_len = payload_len
        self.align = align
        self._tail = _seed_tail(ns_tag, payload_len)
        self._pads: dict[int, tuple[int, bytes]] = {}  # key length -> (header length, padding)

    def __call__(self, key: bytes, payload: bytes | memoryview | bytearray) -> bytes:
        seed = xxhash.xxh3_64_intdigest(key + self._tail)
        checksum = xxhash.xxh3_64_intdigest(payload, seed=seed)
        pad = self._pads.get(len(key))
        if pad is None:
            hlen = header_size(len(key), self.align)
            pad = self._pads[len(key)] = (hlen, bytes(hlen - FIXED_HEADER_SIZE - len(key)))
        return _pack(key, pad[0], self.payload_len, self.ns_tag, checksum) + pad[1]


def encode(key: bytes, payload: bytes | memoryview | bytearray, *, ns_tag: int, align: int = 1) -> bytes:
    """Header + payload as one ``bytes`` (remote tiers; the fs tier writes the two parts vectored)."""
    view = memoryview(payload).cast("B")
    head = encode_header(key, view.nbytes, payload_checksum(key, ns_tag, view), ns_tag, align)
    return head + view.tobytes()


def parse_header(
    buf: bytes | memoryview | bytearray,
    *,
    expected_key: bytes | None = None,
    ns_tag: int | None = None,
    payload_len: int | None = None,
    header_check: int | None = None,
) -> BlockHeader:
    """Parse and check a header at the start of ``buf``.

    Checks magic, version, algorithm, ``header_check``, and, when given, the key, namespace tag and
    payload length. Raises :class:`CorruptBlockError` on any mismatch. ``header_check``: the check
    value already computed over this header's first 36 bytes and ``expected_key`` (a batched
    reader computes it where the GIL is not held); used only when the header's key is
    ``expected_key``, else the check is computed here as always.
    """
    view = memoryview(buf).cast("B")
    if view.nbytes < FIXED_HEADER_SIZE:
        raise CorruptBlockError("short", f"blob of {view.nbytes} bytes is shorter than a header")
    magic, version, algo, key_len, hlen, plen, tag, checksum = _FIXED.unpack_from(view, 0)
    if magic != MAGIC:
        raise CorruptBlockError("magic", f"bad magic {bytes(magic)!r} (not a kvtier block)")
    if version != FORMAT_VERSION or algo != CHECKSUM_XXH3_64:
        raise CorruptBlockError(
            "version", f"unsupported format version {version} / checksum algorithm {algo}"
        )
    key_end = FIXED_HEADER_SIZE + key_len
    if hlen < key_end or view.nbytes < key_end:
        raise CorruptBlockError("header", f"header length {hlen} cannot hold a {key_len}-byte key")
    key = view[FIXED_HEADER_SIZE:key_end].tobytes()
    (check,) = _CHECK.unpack_from(view, _FIXED.size)
    if header_check is not None and key == expected_key:
        expect = header_check
    else:
        expect = xxhash.xxh3_64_intdigest(view[: _FIXED.size].tobytes() + key) & 0xFFFFFFFF
    if check != expect:
        raise CorruptBlockError("header", "header checksum mismatch")
    if expected_key is not None and key != expected_key:
        raise CorruptBlockError("key", "block belongs to another key")
    if ns_tag is not None and tag != ns_tag:
        raise CorruptBlockError("namespace", "block belongs to another namespace")
    if payload_len is not None and plen != payload_len:
        raise CorruptBlockError("length", f"payload length {plen}, expected {payload_len}")
    return BlockHeader(key=key, header_len=hlen, payload_len=plen, namespace_tag=tag, checksum=checksum)


def verify_payload(header: BlockHeader, payload: bytes | memoryview | bytearray) -> None:
    """Raise :class:`CorruptBlockError` unless ``payload`` matches ``header`` (length and checksum)."""
    view = memoryview(payload).cast("B")
    if view.nbytes != header.payload_len:
        raise CorruptBlockError("length", f"payload is {view.nbytes} bytes, header says {header.payload_len}")
    check_payload_digest(header, payload_checksum(header.key, header.namespace_tag, view))


def check_payload_digest(header: BlockHeader, digest: int) -> None:
    """Raise :class:`CorruptBlockError` unless ``digest`` (the payload's xxh3-64 under this header's
    seed, computed by the caller) is the header's checksum: :func:`verify_payload` for a caller that
    already hashed the payload it just read."""
    if digest != header.checksum:
        raise CorruptBlockError("checksum", "payload checksum mismatch")


def payload_seed_tail(ns_tag: int, payload_len: int) -> bytes:
    """The bytes appended to a key before hashing it into the payload checksum's seed."""
    return _seed_tail(ns_tag, payload_len)


def decode(
    blob: bytes | memoryview | bytearray,
    *,
    key: bytes,
    ns_tag: int,
    verify: bool = True,
) -> memoryview:
    """Check a whole blob written by :func:`encode` for ``key`` and return its payload (zero-copy).

    The blob must be exactly header + payload: a truncated or extended blob is corrupt. With
    ``verify=False`` the header (magic, key, namespace, lengths) is still checked, only the payload
    checksum pass is skipped.
    """
    view = memoryview(blob).cast("B")
    head = parse_header(view, expected_key=key, ns_tag=ns_tag)
    if view.nbytes != head.header_len + head.payload_len:
        raise CorruptBlockError(
            "length",
            f"blob is {view.nbytes} bytes, header says {head.header_len} + {head.payload_len}",
        )
    payload = view[head.header_len :]
    if verify:
        verify_payload(head, payload)
    return payload
