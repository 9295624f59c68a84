"""On-disk layout of the fs tier: names, shards, the per-namespace ``config.json``, the start-up scan.

::

    root_dir/<namespace>/config.json        layout record, checked on start
    root_dir/<namespace>/accounting.json    shared byte accounting (see accounting.py)
    root_dir/<namespace>/procs/<token>      liveness marker of each process (flocked while alive)
    root_dir/<namespace>/tmp/<h>/<token>.<n> temp files being written (h = n mod 16; see temps.py)
    root_dir/<namespace>/<a>/<b>/<name>     block files; a/b = top 8 bits of xxh3-64(key)

``<name>`` is the key in hex, or ``x`` + xxh3-128 hex of the key for keys longer than 100 bytes (the
real key is in the header). A new tree has 16 top directories of 16 leaves each (256 leaves, 272
directories): few enough to create them all in the background in a fraction of a second, so a young
tree's stores do not pay a ``mkdir`` each (creating a directory is an inode allocation, as costly
as creating the block file itself), and still small (10 million blocks: ~39,000 files per leaf, a
size every local file system indexes). A tree whose ``config.json`` records the earlier layout (256
top directories ``<aa>`` of 16 leaves: 4,352 directories) keeps it (:data:`SHARD_LAYOUTS`).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

import xxhash

from kvtier import codec
from kvtier.errors import ConfigError
from kvtier.tiers.fs.safe import FILE_FLAGS, SafeTree, open_dir

__all__ = ["SIM_KEY_BYTES", "Layout", "ScanShard", "ShardDirs", "block_file_size", "probe_direct_io"]

#: Key length assumed for a block file's header where no key is at hand (the simulation, the
#: striped tier's shares and probes): kvtier's 128-bit block hashes.
SIM_KEY_BYTES = 16

FORMAT_NAME = "kvtier-fs"
LAYOUT_VERSION = 1
HEADER_ALIGN = 4096
MAX_HEX_KEY = 100
_HEX = frozenset("0123456789abcdef")
_MID_NAMES = frozenset("0123456789abcdef")
#: Hex characters of the (top, leaf) shard directory names: new trees get the first; a tree whose
#: ``config.json`` records another of these keeps it (warm restart of older trees).
SHARD_LAYOUTS = ((1, 1), (2, 1))


def block_file_size(key_len: int, block_bytes: int) -> int:
    """Size of a complete block file: the 4 KiB-aligned codec header of the key, then the payload."""
    return codec.header_size(key_len, HEADER_ALIGN) + block_bytes


@dataclass(slots=True)
class ScanShard:
    """What the scan found under one top-level shard directory."""

    top: int
    entries: list[tuple[bytes, int, float]]  # (key, size, mtime)
    bad: list[tuple[str, str]]  # (path, reason): not a block file of this namespace


class Layout:
    """Paths and naming of one namespace directory."""

    def __init__(
        self,
        root_dir: str,
        namespace: str,
        block_bytes: int,
        shard_hex_chars: tuple[int, int] = SHARD_LAYOUTS[0],
    ) -> None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in namespace) or "default"
        if safe in (".", ".."):
            safe = "_" + safe
        self.root_dir = os.path.abspath(root_dir)
        self.namespace = namespace
        self.ns_dir = os.path.join(self.root_dir, safe)
        self.block_bytes = block_bytes
        self.ns_tag = codec.namespace_tag(namespace)
        self.config_path = os.path.join(self.ns_dir, "config.json")
        self._set_shards(shard_hex_chars)

    def _set_shards(self, hex_chars: tuple[int, int]) -> None:
        if hex_chars not in SHARD_LAYOUTS or hex_chars[1] != 1:
            raise ValueError(f"unknown shard layout {hex_chars!r}")
        #: Hex characters of a top-level shard directory's name (1, or 2 in older trees).
        self.top_chars = hex_chars[0]
        #: Top-level shard directories (16, or 256 in older trees), each of 16 leaves.
        self.top_count = 1 << (4 * self.top_chars)
        self._shift = 64 - 4 * (self.top_chars + 1)  # shard number = top << 4 | leaf
        self._top_shift = self._shift + 4

    # -- names ---------------------------------------------------------------------------------
    def shard_of(self, key: bytes) -> int:
        """Shard number ``top << 4 | leaf``: the top bits of xxh3-64(key) (8, or 12 in older
        trees); ``shard_of(key) >> 4`` is the top-level directory, the low 4 bits the leaf."""
        return xxhash.xxh3_64_intdigest(key) >> self._shift

    def top_of(self, key: bytes) -> int:
        """The top-level shard directory number of ``key`` (``shard_of(key) >> 4``)."""
        return xxhash.xxh3_64_intdigest(key) >> self._top_shift

    def top_dir(self, top: int) -> str:
        """Path of top-level shard directory number ``top``."""
        return f"{self.ns_dir}/{top:0{self.top_chars}x}"

    def name_of(self, key: bytes) -> str:
        if len(key) <= MAX_HEX_KEY:
            return key.hex()
        return "x" + xxhash.xxh3_128_hexdigest(key)

    def dir_of(self, key: bytes) -> str:
        s = self.shard_of(key)
        return f"{self.top_dir(s >> 4)}/{s & 0xF:x}"  # = os.path.join (ns_dir is absolute)

    def path_of(self, key: bytes) -> str:
        # Per-block hot path (stores, loads, evictions): one f-string instead of two os.path.join.
        s = xxhash.xxh3_64_intdigest(key) >> self._shift
        name = key.hex() if len(key) <= MAX_HEX_KEY else "x" + xxhash.xxh3_128_hexdigest(key)
        return f"{self.ns_dir}/{s >> 4:0{self.top_chars}x}/{s & 0xF:x}/{name}"

    def is_block_path(self, path: str) -> bool:
        """Whether ``path`` has the exact shape of a block path of this namespace
        (``<ns_dir>/<top hex>/<1 hex>/<name>``); a string check, nothing is resolved."""
        prefix = self.ns_dir + "/"
        if not path.startswith(prefix):
            return False
        parts = path[len(prefix) :].split("/")
        if len(parts) != 3:
            return False
        top, mid, name = parts
        if len(top) != self.top_chars or not _is_hex(top) or len(mid) != 1 or not _is_hex(mid):
            return False
        if name.startswith("x"):
            return len(name) == 33 and _is_hex(name[1:])
        return 0 < len(name) <= 2 * MAX_HEX_KEY and len(name) % 2 == 0 and _is_hex(name)

    def file_size(self, key_len: int) -> int:
        """Size of a complete block file for a key of ``key_len`` bytes."""
        return block_file_size(key_len, self.block_bytes)

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
            "shard_hex_chars": [self.top_chars, 1],
        }

    def ensure(self, key_path: str) -> None:
        """Create the namespace directory and its ``config.json``, or check the existing one.

        Raises :class:`ConfigError` (one line naming the file and the fix) on a mismatch.
        """
        try:
            _makedirs_private(self.ns_dir)
        except OSError as exc:
            raise ConfigError(
                key_path, f"cannot create {self.ns_dir} ({exc.strerror}); choose a writable root_dir"
            ) from exc
        # A tree without its record but with top-level shards of the older layout (the file was
        # deleted by hand) keeps that layout: its blocks stay found and accounted.
        if not os.path.exists(self.config_path) and self._has_legacy_tops():
            self._set_shards(SHARD_LAYOUTS[1])
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
        recorded = have.get("shard_hex_chars")
        if isinstance(recorded, list) and tuple(recorded) in SHARD_LAYOUTS:
            self._set_shards((int(recorded[0]), int(recorded[1])))  # the tree's layout, old or new
            want = self.expected_config()
        for field, value in want.items():
            if have.get(field) != value:
                raise ConfigError(
                    key_path,
                    f"{self.config_path} records {field}={have.get(field)!r} but this tier uses "
                    f"{value!r}; use another root_dir or delete {self.ns_dir} to start over",
                )

    def _has_legacy_tops(self) -> bool:
        """Whether the namespace directory holds a top-level shard of the older layout (two hex
        characters, a directory)."""
        with contextlib.suppress(OSError), os.scandir(self.ns_dir) as it:
            return any(len(e.name) == 2 and _is_hex(e.name) and e.is_dir(follow_symlinks=False) for e in it)
        return False

    def precreate_worthwhile(self, present_tops: set[int]) -> bool:
        """Whether a background pre-creation of every shard directory is worth starting: always in
        the 272-directory layout (an existing directory costs one failed mkdir); in the older
        4,352-directory layout only while a top-level shard is missing (its leaves appear on demand:
        creating all of them would share the disk with the first stores for seconds)."""
        return self.top_count <= 16 or len(present_tops) < self.top_count

    def present_tops(self) -> set[int]:
        """Top-level shard numbers that exist as directories."""
        tops: set[int] = set()
        with contextlib.suppress(OSError), os.scandir(self.ns_dir) as it:
            for e in it:
                if len(e.name) == self.top_chars and _is_hex(e.name) and e.is_dir(follow_symlinks=False):
                    tops.add(int(e.name, 16))
        return tops

    # -- scan ----------------------------------------------------------------------------------
    def scan(self, owners: frozenset[int] | None = None) -> Iterator[ScanShard]:
        """Walk the tree one top-level shard at a time (``os.scandir``; one ``stat`` per file).

        Files that cannot be blocks of this namespace (bad name, wrong shard, wrong size, not a
        regular file, not of an owner in ``owners`` when given; directories are opened with
        ``O_NOFOLLOW``) are reported in ``bad``; long-key (``x...``) names have their header read.
        This loop is the warm-restart hot path (>= 50,000 files/s): locals only, no per-file objects
        beyond one tuple.
        """
        sizes: dict[int, int] = {}
        for top in range(self.top_count):
            top_dir = self.top_dir(top)
            shard = ScanShard(top, [], [])
            try:
                # O_NOFOLLOW: a top-level shard replaced by a link is never walked.
                top_fd = open_dir(top_dir)
            except FileNotFoundError:
                yield shard
                continue
            except OSError:
                shard.bad.append((top_dir, "stray"))
                yield shard
                continue
            try:
                mids = list(os.scandir(top_fd))
            finally:
                os.close(top_fd)
            for mid in mids:
                if mid.name not in _MID_NAMES or not mid.is_dir(follow_symlinks=False):
                    shard.bad.append((mid.path, "stray"))
                    continue
                want = (top << 4) | int(mid.name, 16)
                self._scan_mid(f"{top_dir}/{mid.name}", want, owners, sizes, shard)
            yield shard

    def _scan_mid(
        self, mid_path: str, want: int, owners: frozenset[int] | None, sizes: dict[int, int], shard: ScanShard
    ) -> None:
        """Add the files of one second-level shard directory (shard number ``want``) to ``shard``.

        ``sizes`` caches the file size per key length across calls. The per-file loop of :meth:`scan`.
        """
        shard_of, name_of, fromhex = self.shard_of, self.name_of, bytes.fromhex
        entries, bad = shard.entries, shard.bad
        try:
            mid_fd = open_dir(mid_path)
        except OSError:
            return
        try:
            it = os.scandir(mid_fd)
        except OSError:
            os.close(mid_fd)
            return
        with it, contextlib.closing(_Fd(mid_fd)):
            for e in it:
                name = e.name
                e_path = f"{mid_path}/{name}"
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # evicted while we looked
                if not stat.S_ISREG(st.st_mode) or (owners is not None and st.st_uid not in owners):
                    bad.append((e_path, "stray"))
                    continue
                key: bytes | None
                if name[0] == "x":
                    key = self._read_long_key(e_path)
                else:
                    try:
                        key = fromhex(name)
                    except ValueError:
                        key = None
                if key is None or shard_of(key) != want or name_of(key) != name:
                    bad.append((e_path, "foreign"))
                    continue
                klen = len(key)
                size = sizes.get(klen)
                if size is None:
                    size = sizes[klen] = self.file_size(klen)
                if st.st_size != size:
                    bad.append((e_path, "truncated" if st.st_size < size else "length"))
                    continue
                entries.append((key, st.st_size, st.st_mtime))

    def _read_long_key(self, path: str) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY | FILE_FLAGS)  # no link, no FIFO wait
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return None
                head = os.pread(fd, HEADER_ALIGN, 0)
            finally:
                os.close(fd)
            return codec.parse_header(head, ns_tag=self.ns_tag, payload_len=self.block_bytes).key
        except (OSError, codec.CorruptBlockError):
            return None


class _Fd:
    """A descriptor closed by :func:`contextlib.closing`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)


class ShardDirs:
    """The shard directories this process knows exist; each level is created 0700 on first need.

    Shared by the store path (a block's directories, made by the worker that wrote the block) and
    the background pre-creation; a set add is atomic, and a lost race is one harmless failed mkdir.
    """

    def __init__(self, tree: SafeTree) -> None:
        self.tree = tree
        self.ns_dir = tree.ns_dir
        #: Leaf directories known to exist.
        self.made: set[str] = set()
        #: Top-level shard directories known to exist (a new leaf under one skips its mkdir).
        self.tops: set[str] = set()

    def ensure_for(self, path: str) -> None:
        """Create the two shard levels above block file ``path`` (``os.makedirs`` would set the mode
        of the leaf only)."""
        d = path.rpartition("/")[0]  # os.path.dirname, minus its per-call overhead
        if d not in self.made:
            top = d.rpartition("/")[0]
            # Never through a shard directory replaced by a link (make_dirs opens each level
            # with O_NOFOLLOW, known or not).
            try:
                self.tree.make_dirs(path, top_exists=top in self.tops)
            except FileNotFoundError:
                if top not in self.tops:
                    raise
                self.tops.discard(top)  # removed behind our back: make it again
                self.tree.make_dirs(path)
            self.tops.add(top)
            self.made.add(d)

    def precreate_top(self, top_dir: str) -> None:
        """Create top-level shard directory ``top_dir`` and its 16 leaves (existing ones cost one
        failed mkdir), and open them into the tree's descriptor cache."""
        for mid in "0123456789abcdef":
            leaf = os.path.join(top_dir, mid)
            if leaf not in self.made:
                self.tree.make_dirs(f"{leaf}/_")
                self.made.add(leaf)
            self.tree.warm(f"{leaf}/_")  # a young tree's first store there then skips the walk


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


def _makedirs_private(path: str) -> None:
    """``os.makedirs`` with mode 0700 on *every* level it creates (``os.makedirs`` applies ``mode`` to
    the leaf only, leaving missing parents world-readable)."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            if not os.path.isdir(d):
                raise
