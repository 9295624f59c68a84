"""The fs tier's C entry points: compiled and resolved once per process, with xxh3's address.

The batched reader and writer (:mod:`.batchread`, :mod:`.batchwrite`) each call one C function that
hashes payloads through ``XXH3_64bits_withSeed`` of the already loaded ``xxhash`` extension (so the
digest is the one the Python path computes, by construction). Both resolve the same way: build or
load the library through :func:`kvtier.native.load_library` on first use, look up the symbol, set its
ctypes signature; ``None`` where any step fails, and then the tier keeps its Python path.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvtier.native import load_library

__all__ = ["CCall", "xxh3_address"]


def xxh3_address() -> int | None:
    """Address of ``XXH3_64bits_withSeed`` in the loaded ``xxhash`` extension, or ``None``."""
    try:
        import xxhash._xxhash as ext

        fn = ctypes.CDLL(ext.__file__).XXH3_64bits_withSeed
    except (ImportError, OSError, AttributeError):
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value


class CCall:
    """One C function of a source file beside this module, resolved on the first :meth:`get`.

    ``disable_env`` set to ``python`` keeps the Python path (see :func:`kvtier.native.load_library`).
    Resolution runs once per process under a lock; a failure is remembered (no rebuild per call).
    """

    def __init__(self, source: Path, symbol: str, argtypes: Sequence[Any], *, disable_env: str) -> None:
        self._source, self._symbol, self._argtypes = source, symbol, list(argtypes)
        self._disable_env = disable_env
        self._lock = threading.Lock()
        self._done = False
        self._value: tuple[Callable[..., int], int] | None = None

    def get(self) -> tuple[Callable[..., int], int] | None:
        """``(function, xxh3 address)``, or ``None`` when there is no compiler, library or xxh3."""
        with self._lock:
            if not self._done:
                self._done = True
                self._value = self._resolve()
        return self._value

    def _resolve(self) -> tuple[Callable[..., int], int] | None:
        lib = load_library(self._source, disable_env=self._disable_env)
        xxh3 = xxh3_address()
        if lib is None or xxh3 is None:
            return None
        fn = getattr(lib, self._symbol)
        fn.argtypes = self._argtypes
        fn.restype = ctypes.c_int64
        return fn, xxh3
