"""Reading a small file kvtier was pointed at (a config, a secret, a model description) safely.

Any path a user or an environment variable names may be hostile or a mistake: a FIFO (opening it
blocks until a writer comes), ``/dev/zero`` (reading never ends), a directory, a 14 GB log. Every
such file is opened without blocking, checked with ``fstat`` on the open descriptor (no race with
a rename) to be a regular file of at most ``limit`` bytes, and read up to ``limit`` + 1 bytes (a
file that grew meanwhile is refused too). Errors are one-line :class:`ConfigError`\\ s naming the
setting and the path; the content never appears in them (it may be a secret).
"""

from __future__ import annotations

import os
import stat

from kvtier.errors import ConfigError

__all__ = ["MAX_CONFIG_FILE_BYTES", "MAX_SECRET_FILE_BYTES", "read_bounded", "regular_file"]

#: Largest config-like file kvtier reads (real ones are a few KiB).
MAX_CONFIG_FILE_BYTES = 4 << 20
#: Largest secret file (a password or a shared key).
MAX_SECRET_FILE_BYTES = 64 << 10


def regular_file(path: object, key: str, limit: int = MAX_CONFIG_FILE_BYTES, *, what: str = "file") -> str:
    """``path`` if it names a regular file of at most ``limit`` bytes, for a file another library
    opens itself (``ssl`` loading a certificate): a FIFO there would block it forever."""
    if not isinstance(path, str) or not path:
        raise ConfigError(key, f"expected the path of a {what}, got {path!r}")
    where = os.path.expanduser(path)
    try:
        st = os.stat(where)
    except OSError as exc:
        raise ConfigError(key, f"{where}: cannot read {what} ({exc.strerror or exc})") from None
    _check_stat(st, where, key, limit, what)
    return where


def _check_stat(st: os.stat_result, where: str, key: str, limit: int, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO or device)"
        raise ConfigError(key, f"{where}: cannot read {what}: it is {kind}; give a regular file")
    if st.st_size > limit:
        raise ConfigError(
            key, f"{where}: cannot read {what}: {st.st_size} bytes is larger than the {limit} allowed"
        )


def read_bounded(
    path: str | os.PathLike[str], key: str, limit: int = MAX_CONFIG_FILE_BYTES, *, what: str = "file"
) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes.

    Raises:
        ConfigError: naming ``key`` (the setting that named the file, may be ``""``) and the path:
            it cannot be opened, is not a regular file (a FIFO, a device, a directory), or is
            larger than ``limit``.
    """
    where = os.fspath(path)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(key, f"{where}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        _check_stat(os.fstat(fd), where, key, limit, what)
        os.set_blocking(fd, True)
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise ConfigError(key, f"{where}: cannot read {what}: it grew past the {limit} bytes allowed")
        return data
    except OSError as exc:
        raise ConfigError(key, f"{where}: cannot read {what} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
