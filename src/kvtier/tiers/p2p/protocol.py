"""The p2p wire protocol: length-prefixed binary frames, the handshake and HMAC authentication.

Everything here is pure (bytes in, bytes out) except :func:`read_frame` / :func:`recv_exact_into`,
which read a socket with its timeout. ``docs/p2p.md`` is the prose description; this module is the
one definition of the numbers.

Frame (little-endian)::

    offset size field
         0    4 magic        b"KVP2"
         4    1 version      PROTOCOL_VERSION
         5    1 type         a FrameType
         6    2 flags        0 (reserved)
         8    4 request_id   echoed in the reply
        12    4 length       bytes of payload that follow (<= the receiver's limit)

A ``FETCH_REPLY`` frame is followed by the raw payload of every present block (``block_bytes``
each, in request order) *outside* the frame, so the client can ``recv_into`` the destination
primary slots directly; its frame payload is only the per-key table.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import socket
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from kvtier.errors import ConfigError, KvtierError
from kvtier.files import MAX_SECRET_FILE_BYTES, read_bounded

__all__ = [
    "HEADER",
    "MAX_CONTROL_BYTES",
    "MAX_KEYS",
    "PROTOCOL_VERSION",
    "Frame",
    "FrameType",
    "Hello",
    "ProtocolError",
    "auth_mac",
    "decode_error",
    "decode_fetch_reply",
    "decode_hello",
    "decode_keys",
    "encode_error",
    "encode_fetch_reply",
    "encode_frame",
    "encode_hello",
    "encode_keys",
    "load_secret",
    "read_frame",
    "recv_exact_into",
]

MAGIC = b"KVP2"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("<4sBBHII")
#: Largest payload of any frame (a lookup of MAX_KEYS keys of 255 bytes fits); block bytes travel
#: outside frames and are bounded by the handshake's ``block_bytes``.
MAX_CONTROL_BYTES = 1 << 20
#: Most keys in one LOOKUP or FETCH.
MAX_KEYS = 4096
MAX_KEY_BYTES = 255
NONCE_BYTES = 32
_U32 = struct.Struct("<I")
_ENTRY = struct.Struct("<BQ")  # present, checksum (0 when not asked for)
_HELLO = struct.Struct("<HQ32s")  # version, block_bytes, nonce


class FrameType(enum.IntEnum):
    HELLO = 1  # client -> server: version, block size, layout, namespace, client nonce
    CHALLENGE = 2  # server -> client: server nonce
    AUTH = 3  # client -> server: HMAC over both nonces and the hello
    WELCOME = 4  # server -> client: the server's HMAC (mutual authentication)
    LOOKUP = 5  # client -> server: keys; reply LOOKUP_REPLY: one byte per key (1 = held)
    LOOKUP_REPLY = 6
    FETCH = 7  # client -> server: keys (flags bit 0: send checksums); reply FETCH_REPLY + blocks
    FETCH_REPLY = 8
    ERROR = 9  # either way: code, message; the sender closes the connection after it


#: FETCH flag: the server sends an xxh3-64 checksum of each block (the client verifies it).
FLAG_CHECKSUM = 1


class ProtocolError(KvtierError):
    """The peer sent something this protocol does not allow (bad magic, size, type, field)."""


@dataclass(frozen=True, slots=True)
class Frame:
    type: int
    request_id: int
    payload: bytes
    flags: int = 0


@dataclass(frozen=True, slots=True)
class Hello:
    """What both sides must agree on before any block moves."""

    version: int
    block_bytes: int
    layout: str
    namespace: str
    nonce: bytes

    def mismatch(self, block_bytes: int, layout: str, namespace: str) -> str | None:
        """Why a server with these settings refuses this hello (``None``: it accepts)."""
        if self.version != PROTOCOL_VERSION:
            return f"protocol version {self.version}, server speaks {PROTOCOL_VERSION}"
        if self.block_bytes != block_bytes:
            return f"block_bytes {self.block_bytes}, server has {block_bytes}"
        if self.layout != layout:
            return f"layout fingerprint {self.layout!r}, server has {layout!r}"
        if self.namespace != namespace:
            return f"namespace {self.namespace!r}, server has {namespace!r}"
        return None


# -- frames ---------------------------------------------------------------------------------------
def encode_frame(ftype: int, request_id: int, payload: bytes = b"", flags: int = 0) -> bytes:
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, ftype, flags, request_id, len(payload)) + payload


def parse_header(head: bytes, limit: int = MAX_CONTROL_BYTES) -> tuple[int, int, int, int]:
    """``(type, flags, request_id, length)`` of a frame header; :class:`ProtocolError` if invalid."""
    magic, version, ftype, flags, rid, length = HEADER.unpack(head)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version}, expected {PROTOCOL_VERSION}")
    if ftype not in FrameType._value2member_map_:
        raise ProtocolError(f"unknown frame type {ftype}")
    if length > limit:
        raise ProtocolError(f"frame of {length} bytes exceeds the limit of {limit}")
    return ftype, flags, rid, length


def recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock`` (its timeout applies per read); ``ConnectionError`` on EOF."""
    got = 0
    n = view.nbytes
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection mid-frame")
        got += k


def read_frame(sock: socket.socket, limit: int = MAX_CONTROL_BYTES) -> Frame:
    """One whole frame from ``sock``; :class:`ProtocolError` for a malformed one."""
    head = bytearray(HEADER.size)
    recv_exact_into(sock, memoryview(head))
    ftype, flags, rid, length = parse_header(bytes(head), limit)
    payload = bytearray(length)
    if length:
        recv_exact_into(sock, memoryview(payload))
    return Frame(ftype, rid, bytes(payload), flags)


# -- payloads -------------------------------------------------------------------------------------
def _text(value: str, what: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 255:
        raise ProtocolError(f"{what} longer than 255 bytes")
    return bytes([len(raw)]) + raw


def _read_text(buf: bytes, pos: int, what: str) -> tuple[str, int]:
    if pos >= len(buf):
        raise ProtocolError(f"hello truncated before {what}")
    n = buf[pos]
    end = pos + 1 + n
    if end > len(buf):
        raise ProtocolError(f"hello truncated in {what}")
    try:
        return buf[pos + 1 : end].decode("utf-8"), end
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not UTF-8") from None


def encode_hello(hello: Hello) -> bytes:
    return (
        _HELLO.pack(hello.version, hello.block_bytes, hello.nonce)
        + _text(hello.layout, "layout")
        + _text(hello.namespace, "namespace")
    )


def decode_hello(buf: bytes) -> Hello:
    if len(buf) < _HELLO.size:
        raise ProtocolError("hello too short")
    version, block_bytes, nonce = _HELLO.unpack_from(buf)
    layout, pos = _read_text(buf, _HELLO.size, "layout")
    namespace, pos = _read_text(buf, pos, "namespace")
    if pos != len(buf):
        raise ProtocolError("trailing bytes after hello")
    return Hello(version, block_bytes, layout, namespace, nonce)


def encode_keys(keys: Sequence[bytes]) -> bytes:
    if len(keys) > MAX_KEYS:
        raise ProtocolError(f"{len(keys)} keys in one request; the limit is {MAX_KEYS}")
    parts = [_U32.pack(len(keys))]
    for k in keys:
        if not 0 < len(k) <= MAX_KEY_BYTES:
            raise ProtocolError(f"key of {len(k)} bytes; keys are 1..{MAX_KEY_BYTES} bytes")
        parts.append(bytes([len(k)]))
        parts.append(bytes(k))
    return b"".join(parts)


def decode_keys(buf: bytes) -> list[bytes]:
    if len(buf) < 4:
        raise ProtocolError("key list too short")
    (n,) = _U32.unpack_from(buf)
    if n > MAX_KEYS:
        raise ProtocolError(f"{n} keys in one request; the limit is {MAX_KEYS}")
    keys: list[bytes] = []
    pos = 4
    for _ in range(n):
        if pos >= len(buf):
            raise ProtocolError("key list truncated")
        k = buf[pos]
        if k == 0 or pos + 1 + k > len(buf):
            raise ProtocolError("bad key length in key list")
        keys.append(buf[pos + 1 : pos + 1 + k])
        pos += 1 + k
    if pos != len(buf):
        raise ProtocolError("trailing bytes after key list")
    return keys


def encode_fetch_reply(entries: Sequence[tuple[bool, int]]) -> bytes:
    return _U32.pack(len(entries)) + b"".join(_ENTRY.pack(int(p), c) for p, c in entries)


def decode_fetch_reply(buf: bytes, expect: int) -> list[tuple[bool, int]]:
    if len(buf) != 4 + expect * _ENTRY.size or _U32.unpack_from(buf)[0] != expect:
        raise ProtocolError(f"fetch reply does not describe the {expect} key(s) asked for")
    out = []
    for i in range(expect):
        present, checksum = _ENTRY.unpack_from(buf, 4 + i * _ENTRY.size)
        if present > 1:
            raise ProtocolError("bad presence byte in fetch reply")
        out.append((bool(present), checksum))
    return out


def encode_error(code: int, message: str) -> bytes:
    return struct.pack("<H", code) + message.encode("utf-8")[:1000]


def decode_error(buf: bytes) -> tuple[int, str]:
    if len(buf) < 2:
        return 0, "malformed error frame"
    return struct.unpack_from("<H", buf)[0], buf[2:].decode("utf-8", "replace")


# -- authentication ---------------------------------------------------------------------------------
def auth_mac(secret: bytes, role: bytes, hello: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """HMAC-SHA256 proving knowledge of ``secret`` for this handshake (``role``: b"client"/b"server").

    Both nonces and the whole hello are covered, so a MAC cannot be replayed on another connection
    or attached to different handshake parameters; the roles differ so a reflected MAC fails.
    """
    msg = b"kvtier-p2p-v1\0" + role + b"\0" + client_nonce + server_nonce + hello
    return hmac.new(secret, msg, hashlib.sha256).digest()


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def load_secret(
    *,
    secret_env: str | None = None,
    secret_file: str | None = None,
    what: str = "p2p",
    secret: str | None = None,
) -> bytes:
    """The shared secret from the environment variable ``secret_env`` or the file ``secret_file``.

    The file must be a regular file readable by its owner only (mode 0600 or stricter), like an ssh
    key. A :class:`ConfigError` names the setting and the fix; the secret itself is never in a message.
    """
    if sum(bool(x) for x in (secret_env, secret_file, secret)) > 1:
        raise ConfigError(
            f"{what}.secret_env", "set one of secret_env, secret_file or secret, not both or all"
        )
    if secret is not None:
        if not isinstance(secret, str) or not secret.strip():
            raise ConfigError(f"{what}.secret", "expected a non-empty string (the value is never shown)")
        return secret.strip().encode("utf-8")
    if secret_env:
        value = os.environ.get(secret_env)
        if not value:
            raise ConfigError(f"{what}.secret_env", f"environment variable {secret_env} is not set or empty")
        return value.encode("utf-8")
    if secret_file:
        try:
            st = os.stat(secret_file)
        except OSError as exc:
            raise ConfigError(f"{what}.secret_file", f"cannot read {secret_file}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise ConfigError(
                f"{what}.secret_file",
                f"{secret_file} must be a regular file with mode 0600 (run: chmod 600 {secret_file})",
            )
        value_b = read_bounded(
            secret_file, f"{what}.secret_file", MAX_SECRET_FILE_BYTES, what="secret file"
        ).strip()
        if not value_b:
            raise ConfigError(f"{what}.secret_file", f"{secret_file} is empty")
        return value_b
    raise ConfigError(
        f"{what}.secret_env", "peers authenticate with a shared secret: set secret_env or secret_file"
    )


def block_checksum(key: bytes, payload: Any) -> int:
    """xxh3-64 of a block's payload seeded by its key (so a block sent for another key fails)."""
    return xxhash.xxh3_64_intdigest(payload, seed=xxhash.xxh3_64_intdigest(key))
