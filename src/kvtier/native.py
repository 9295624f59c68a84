"""Small C helpers shipped as source, compiled on first use, loaded with :mod:`ctypes`.

Contract: :func:`load_library` returns the loaded library for one ``.c`` file of the package, or
``None`` when it cannot be had here (no compiler, compilation fails, a platform without ``cc``, or
the helper switched off by its environment variable). Every caller keeps a pure-Python twin of the
same contract and uses it on ``None``, so ``pip install`` needs no compiler and no build step.

Why this shape:
    * a build-time extension would make a compiler mandatory at install; compiling lazily into a
      private cache keeps ``pip install -e .`` working everywhere and costs one ``cc`` run per
      source version per machine (the file name carries a hash of the source);
    * the cache directory (``$XDG_CACHE_HOME/kvtier`` or ``~/.cache/kvtier``) is created 0700 and
      only loaded from when it is ours and nobody else can write it: loading a library runs its
      code, so a directory another user can write into is refused (then the Python twin runs);
    * the library is written to a temporary name and renamed into place, so processes compiling
      at the same time each see a whole file or none;
    * :mod:`ctypes` releases the GIL for the length of every foreign call: the fs tier's batched
      reads depend on that (a Python thread that releases and retakes the GIL per system call
      waits behind the engine's busy loop each time).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

__all__ = ["cache_dir", "load_library"]

_loaded: dict[Path, ctypes.CDLL | None] = {}
_lock = threading.Lock()


def cache_dir() -> Path:
    """Where compiled helpers are kept: ``$XDG_CACHE_HOME/kvtier`` or ``~/.cache/kvtier``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvtier"


def _private(path: Path) -> bool:
    """Whether ``path`` is a directory owned by us that nobody else can write (safe to load from)."""
    try:
        st = path.stat()
    except OSError:
        return False
    return path.is_dir() and st.st_uid == os.getuid() and not (st.st_mode & 0o022)


def _compile(source: Path, out: Path) -> bool:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return False
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so")
    os.close(fd)
    try:
        subprocess.run(
            [cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(source)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.chmod(tmp, 0o600)
        os.replace(tmp, out)  # atomic: a concurrent process sees all or nothing
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return True


def load_library(source: Path, *, disable_env: str) -> ctypes.CDLL | None:
    """The compiled ``source`` (a ``.c`` file of this package), or ``None`` (see the module doc).

    ``disable_env``: an environment variable that, set to ``python``, switches the helper off
    (tests compare the two twins; users can rule the compiler out). The answer is cached per
    process; a failed build is not retried in the same process.
    """
    with _lock:
        if source in _loaded:
            return _loaded[source]
        lib = _build(source, disable_env)
        _loaded[source] = lib
        return lib


def _build(source: Path, disable_env: str) -> ctypes.CDLL | None:
    if os.environ.get(disable_env, "").lower() == "python" or sys.platform == "win32":
        return None
    try:
        src = source.read_bytes()
    except OSError:
        return None
    tag = hashlib.sha256(src + sys.platform.encode()).hexdigest()[:16]
    d = cache_dir()
    lib_path = d / f"{source.stem}-{tag}.so"
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(d):
            return None
        if not lib_path.exists() and not _compile(source, lib_path):
            return None
        return ctypes.CDLL(str(lib_path))
    except (OSError, subprocess.SubprocessError):
        return None
