"""Whom the fs tier trusts: a private root by default, a shared root only with a keyed MAC.

* **Private root** (the default): the root and namespace directories must be owned by this user and
  writable by nobody else, so nobody else can put anything into the tree. A directory that is
  group/world-writable or owned by another user is a one-line :class:`ConfigError` naming it and
  the fix (``chmod 700``, or ``shared_root: true``).
* **Shared root** (``shared_root: true``): anyone with write access may plant files, so every block
  carries a keyed MAC (BLAKE3 in keyed mode, 128-bit tag, keyed with a secret from an environment
  variable or a 0600 file) over its header fields, key and payload; a block whose MAC does not
  verify is a miss. A writer without the secret cannot produce a block that is served. The secret
  is never logged or shown. Why BLAKE3: measured side by side on 1 MiB blocks it runs ~10x faster
  than keyed BLAKE2b (~2.7 GB/s against ~0.25 GB/s on one loaded core here), which is what made a
  shared root cost half its throughput. BLAKE3 comes with ``pip install 'kvtier[shared]'``; without
  it blocks are tagged with keyed BLAKE2b-128 (what earlier versions wrote, logged once). Either
  tag verifies on any host: a tag that is not the BLAKE3 one is checked as BLAKE2b before the block
  is refused (a host without BLAKE3 cannot check BLAKE3 tags: those blocks are misses there).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat

try:  # the fast MAC (the ``shared`` extra); keyed BLAKE2b otherwise
    import blake3
except ImportError:  # pragma: no cover - installed with the shared extra (and in CI)
    blake3 = None  # type: ignore[assignment]

from kvtier.errors import ConfigError

__all__ = ["MAC_LEN", "BlockMac", "check_private_dir", "load_secret"]

_log = logging.getLogger("kvtier.tiers.fs")
MAC_LEN = 16
DEFAULT_SECRET_ENV = "KVTIER_FS_SECRET"
_PERSON = b"kvtier-fs-mac-v1"


class BlockMac:
    """Computes and checks a block's MAC (the secret stays inside; ``repr`` never shows it)."""

    __slots__ = ("_key3", "_secret")

    def __init__(self, secret: bytes) -> None:
        self._secret = secret  # the BLAKE2b key (blocks of earlier versions)
        # BLAKE3's keyed mode takes exactly 32 bytes: derived from the secret, never the same key
        # for two algorithms.
        self._key3 = hashlib.blake2b(secret, digest_size=32, person=b"kvtier-fs-mac3").digest()

    def __repr__(self) -> str:
        return "BlockMac(<secret hidden>)"

    def tag(self, header: bytes | bytearray | memoryview, payload: bytes | bytearray | memoryview) -> bytes:
        """The MAC of a block: keyed BLAKE3 of ``header`` (fixed fields + key) then ``payload``
        (keyed BLAKE2b-128 where BLAKE3 is not installed)."""
        if blake3 is None:
            return self.legacy_tag(header, payload)
        h = blake3.blake3(header, key=self._key3)
        h.update(payload)
        return h.digest(MAC_LEN)

    def legacy_tag(
        self, header: bytes | bytearray | memoryview, payload: bytes | bytearray | memoryview
    ) -> bytes:
        """The MAC earlier versions wrote: keyed BLAKE2b-128 (checked, never written)."""
        h = hashlib.blake2b(key=self._secret, digest_size=MAC_LEN, person=_PERSON)
        h.update(header)
        h.update(payload)
        return h.digest()

    def check(
        self, header: bytes | bytearray | memoryview, payload: bytes | bytearray | memoryview, tag: bytes
    ) -> bool:
        if blake3 is not None and hmac.compare_digest(self.tag(header, payload), tag):
            return True
        return hmac.compare_digest(self.legacy_tag(header, payload), tag)


def load_secret(key_path: str, env: str, file: str | None) -> BlockMac:
    """The MAC secret from ``file`` (must be a regular 0600 file of ours) or env var ``env``.

    Raises a one-line :class:`ConfigError` that names where it looked, never the secret.
    """
    if file is not None:
        path = os.path.expanduser(file)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise ConfigError(f"{key_path}.secret_file", f"cannot open {path} ({exc.strerror})") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077 or st.st_uid != os.geteuid():
                raise ConfigError(
                    f"{key_path}.secret_file",
                    f"{path} must be a regular file of yours with mode 0600; chmod 600 {path}",
                )
            secret = os.read(fd, 4096).strip()
        finally:
            os.close(fd)
    else:
        secret = os.environ.get(env, "").encode()
    if len(secret) < 16:
        raise ConfigError(
            f"{key_path}.shared_root",
            f"a shared root needs a MAC secret of >= 16 bytes in ${env} or in secret_file (0600)",
        )
    if blake3 is None:
        _log.warning(
            "kvtier fs: shared_root MACs use keyed BLAKE2b (slow): pip install 'kvtier[shared]' for BLAKE3"
        )
    return BlockMac(hashlib.blake2b(secret, digest_size=32, person=b"kvtier-fs-key").digest())


def check_private_dir(key_path: str, path: str) -> None:
    """Refuse ``path`` unless it is a directory (not a link) owned by us and writable by nobody
    else; a missing ``path`` passes (the tier creates it 0700)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        st = os.stat(path)  # a root given as a link is the user's choice; its target is checked
    uid = os.geteuid()
    if st.st_uid != uid:
        raise ConfigError(
            key_path,
            f"{path} is owned by uid {st.st_uid}, not {uid}; use a directory of yours or set "
            "shared_root: true (blocks are then MAC-authenticated)",
        )
    if st.st_mode & 0o022:
        raise ConfigError(
            key_path,
            f"{path} is group/world-writable (mode {stat.S_IMODE(st.st_mode):o}); chmod 700 {path} "
            "or set shared_root: true (blocks are then MAC-authenticated)",
        )
