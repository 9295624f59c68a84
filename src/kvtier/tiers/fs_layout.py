"""On-disk layout of the fs tier: names, shards, the per-namespace ``config.json``, the start-up scan.

::

    root_dir/<namespace>/config.json        layout record, checked on start
    root_dir/<namespace>/accounting.json    shared byte accounting (see fs_accounting)
    root_dir/<namespace>/procs/<token>      liveness marker of each process (flocked while alive)
    root_dir/<namespace>/tmp/<token>.<n>    temp files being written (renamed into the tree)
    root_dir/<namespace>/<aa>/<bb>/<name>   block files; aa/bb = top 16 bits of xxh3-64(key)

``<name>`` is the key in hex, or ``x`` + xxh3-128 hex of the key for keys longer than 100 bytes (the
real key is in the header). Two levels of 256 directories keep every directory small: 10 million
blocks give ~150 files per leaf.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass

import xxhash

from kvtier import codec
from kvtier.errors import ConfigError

__all__ = ["Layout", "ScanEntry", "ScanShard", "probe_direct_io"]

FORMAT_NAME = "kvtier-fs"
LAYOUT_VERSION = 1
HEADER_ALIGN = 4096
MAX_HEX_KEY = 100
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class ScanEntry:
    key: bytes
    path: str
    size: int
    mtime: float


@dataclass(slots=True)
class ScanShard:
    """What the scan found under one top-level shard directory."""

    top: int
    entries: list[ScanEntry]
    bad: list[tuple[str, str]]  # (path, reason): not a block file of this namespace


class Layout:
    """Paths and naming of one namespace directory."""

    def __init__(self, root_dir: str, namespace: str, block_bytes: int) -> None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in namespace) or "default"
        if safe in (".", ".."):
            safe = "_" + safe
        self.root_dir = os.path.abspath(root_dir)
        self.namespace = namespace
        self.ns_dir = os.path.join(self.root_dir, safe)
        self.block_bytes = block_bytes
        self.ns_tag = codec.namespace_tag(namespace)
        self.config_path = os.path.join(self.ns_dir, "config.json")

    # -- names ---------------------------------------------------------------------------------
    @staticmethod
    def shard_of(key: bytes) -> int:
        """16-bit shard number: top byte = first-level directory, next byte = second level."""
        return xxhash.xxh3_64_intdigest(key) >> 48

    def name_of(self, key: bytes) -> str:
        if len(key) <= MAX_HEX_KEY:
            return key.hex()
        return "x" + xxhash.xxh3_128_hexdigest(key)

    def dir_of(self, key: bytes) -> str:
        s = self.shard_of(key)
        return os.path.join(self.ns_dir, f"{s >> 8:02x}", f"{s & 0xFF:02x}")

    def path_of(self, key: bytes) -> str:
        return os.path.join(self.dir_of(key), self.name_of(key))

    def file_size(self, key_len: int) -> int:
        """Size of a complete block file for a key of ``key_len`` bytes."""
        return codec.header_size(key_len, HEADER_ALIGN) + self.block_bytes

    # -- config.json ---------------------------------------------------------------------------
    def expected_config(self) -> dict[str, object]:
        return {
            "format": FORMAT_NAME,
            "layout_version": LAYOUT_VERSION,
            "codec_version": codec.FORMAT_VERSION,
            "checksum": "xxh3-64",
            "namespace": self.namespace,
            "block_bytes": self.block_bytes,
            "header_align": HEADER_ALIGN,
            "shard_levels": 2,
            "shard_hex_chars": 2,
        }

    def ensure(self, key_path: str) -> None:
        """Create the namespace directory and its ``config.json``, or check the existing one.

        Raises :class:`ConfigError` (one line naming the file and the fix) on a mismatch.
        """
        try:
            os.makedirs(self.ns_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                key_path, f"cannot create {self.ns_dir} ({exc.strerror}); choose a writable root_dir"
            ) from exc
        want = self.expected_config()
        if not os.path.exists(self.config_path):
            tmp = f"{self.config_path}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(want, f, indent=2, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, self.config_path)  # fails if another process created it first
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        try:
            with open(self.config_path, encoding="utf-8") as f:
                have = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                key_path,
                f"{self.config_path} is unreadable ({exc}); delete it (the tier rewrites it) or use "
                "another root_dir",
            ) from exc
        if not isinstance(have, dict):
            have = {}
        for field, value in want.items():
            if have.get(field) != value:
                raise ConfigError(
                    key_path,
                    f"{self.config_path} records {field}={have.get(field)!r} but this tier uses "
                    f"{value!r}; use another root_dir or delete {self.ns_dir} to start over",
                )

    def present_tops(self) -> set[int]:
        """Top-level shard numbers that exist as directories."""
        tops: set[int] = set()
        with contextlib.suppress(OSError), os.scandir(self.ns_dir) as it:
            for e in it:
                if len(e.name) == 2 and _is_hex(e.name) and e.is_dir(follow_symlinks=False):
                    tops.add(int(e.name, 16))
        return tops

    # -- scan ----------------------------------------------------------------------------------
    def scan(self) -> Iterator[ScanShard]:
        """Walk the tree one top-level shard at a time (``os.scandir``; one ``stat`` per file).

        Files that cannot be blocks of this namespace (bad name, wrong shard, wrong size, not a
        regular file) are reported in ``bad``; long-key (``x...``) names have their header read.
        """
        for top in range(256):
            top_dir = os.path.join(self.ns_dir, f"{top:02x}")
            shard = ScanShard(top, [], [])
            try:
                mids = list(os.scandir(top_dir))
            except (FileNotFoundError, NotADirectoryError):
                yield shard
                continue
            for mid in mids:
                if not mid.is_dir(follow_symlinks=False) or len(mid.name) != 2 or not _is_hex(mid.name):
                    shard.bad.append((mid.path, "stray"))
                    continue
                want_shard = (top << 8) | int(mid.name, 16)
                with contextlib.suppress(OSError), os.scandir(mid.path) as it:
                    for e in it:
                        self._scan_one(e, want_shard, shard)
            yield shard

    def _scan_one(self, e: os.DirEntry[str], want_shard: int, shard: ScanShard) -> None:
        try:
            st = e.stat(follow_symlinks=False)
        except FileNotFoundError:
            return  # evicted while we looked
        if not e.is_file(follow_symlinks=False):
            shard.bad.append((e.path, "stray"))
            return
        name = e.name
        key: bytes | None = None
        if name.startswith("x") and len(name) == 33:
            key = self._read_long_key(e.path)
        elif len(name) % 2 == 0 and len(name) <= 2 * MAX_HEX_KEY and _is_hex(name):
            key = bytes.fromhex(name)
        if key is None or self.shard_of(key) != want_shard or self.name_of(key) != name:
            shard.bad.append((e.path, "foreign"))
            return
        if st.st_size != self.file_size(len(key)):
            shard.bad.append((e.path, "truncated" if st.st_size < self.file_size(len(key)) else "length"))
            return
        shard.entries.append(ScanEntry(key, e.path, st.st_size, st.st_mtime))

    def _read_long_key(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER_ALIGN)
            return codec.parse_header(head, ns_tag=self.ns_tag, payload_len=self.block_bytes).key
        except (OSError, codec.CorruptBlockError):
            return None


def _is_hex(s: str) -> bool:
    return bool(s) and all(c in _HEX for c in s)


def probe_direct_io(directory: str) -> bool:
    """Whether ``O_DIRECT`` writes and reads work in ``directory`` (tmpfs and some FUSE refuse)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    path = os.path.join(directory, f".odirect-probe.{os.getpid()}.{id(directory)}")
    buf = mmap.mmap(-1, HEADER_ALIGN)  # page-aligned, as O_DIRECT requires
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | flag, 0o600)
        try:
            ok = os.pwrite(fd, buf, 0) == HEADER_ALIGN and os.preadv(fd, [buf], 0) == HEADER_ALIGN
        finally:
            os.close(fd)
        return ok
    except OSError:
        return False
    finally:
        buf.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
