"""The ``obj`` tier's options (:class:`ObjOptions`): the bucket, where it is, credentials, and how
objects are written and read."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

from kvtier.config import parse_size
from kvtier.errors import ConfigError
from kvtier.numbers import BYTES, Range, Ranges
from kvtier.tiers.remote.options import RemoteOptions, check_choice, check_flag

__all__ = ["MAX_RETRIES", "MIN_PART", "ObjOptions"]

#: Most retries per request (the ``retries`` option).
MAX_RETRIES = 3
#: S3's smallest multipart part.
MIN_PART = 5 << 20
_DATA_PATHS = ("direct", "boto3")
_ADDRESSING = ("auto", "path", "virtual")


@dataclass(frozen=True, kw_only=True)
class ObjOptions(RemoteOptions):
    """Options of :class:`~kvtier.tiers.obj.ObjTier`, besides :class:`RemoteOptions`'.

    Attributes:
        bucket: bucket name (required; created when ``create_bucket``).
        key_prefix: first part of every object name (formerly ``prefix``).
        endpoint_url: S3-compatible endpoint (Ceph RGW, MinIO); ``None`` = AWS.
        region: AWS region (``None``: the standard chain's).
        addressing_style: ``auto``, ``path`` (Ceph, MinIO) or ``virtual``.
        access_key_id / secret_access_key / session_token: explicit credentials (prefer the env
            variables named by ``access_key_env`` / ``secret_key_env``, or the standard chain).
        threads: worker threads, each with its own client and connection (formerly ``io_threads``).
        max_bytes: kvtier-enforced capacity (``None``: unbounded; see the tier's module doc).
        multipart_threshold / multipart_chunk: sizes (``"64MiB"``) for multipart uploads.
        retries: botocore retries per request (standard mode, exponential backoff).
        sign_payload: SigV4-sign each body (SHA-256 on both ends; off: kvtier's checksum covers
            the bytes, TLS the transport). On: every request goes through boto3.
        data_path: ``direct`` (object ``GET``/``PUT`` on kvtier's own connection per worker,
            :mod:`kvtier.tiers.obj.s3_wire`) or ``boto3`` (every request through boto3).
        warm_listing: most objects listed at start to warm the index (0: no listing).
        create_bucket: create the bucket if it does not exist (tests, single-tenant set-ups).
    """

    threads: int = 8
    batch_blocks: int = 4
    bucket: str | None = None
    key_prefix: str = "kvtier"
    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: str = "auto"
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    access_key_env: str | None = None
    secret_key_env: str | None = None
    max_bytes: int | str | None = None
    multipart_threshold: int | str = "64MiB"
    multipart_chunk: int | str = "16MiB"
    retries: int = 1
    sign_payload: bool = False
    data_path: str = "direct"
    warm_listing: int = 100_000
    create_bucket: bool = False

    ranges: ClassVar[Ranges] = {
        **RemoteOptions.ranges,
        # botocore has no total deadline: few retries keep a request within a few op_timeouts
        # plus seconds of backoff; the direct path also stops at s3_wire.RETRY_WINDOW.
        "retries": Range(0, MAX_RETRIES, integer=True),
        "warm_listing": Range(0, 1 << 32, integer=True),
        "max_bytes": BYTES,
        "multipart_threshold": BYTES,
        "multipart_chunk": BYTES,
    }
    renamed: ClassVar[dict[str, str]] = {"io_threads": "threads", "prefix": "key_prefix"}

    def check(self) -> None:
        super().check()
        if not isinstance(self.bucket, str) or not self.bucket:
            raise ConfigError("bucket", 'missing; give the bucket name, e.g. "kv-cache"')
        if not isinstance(self.key_prefix, str) or not self.key_prefix.strip("/"):
            raise ConfigError("key_prefix", f"expected a non-empty string, got {self.key_prefix!r}")
        check_choice("addressing_style", self.addressing_style, _ADDRESSING)
        url = self.endpoint_url
        if url is not None and not (isinstance(url, str) and "://" in url):
            raise ConfigError("endpoint_url", f'expected a URL such as "http://127.0.0.1:7480", got {url!r}')
        check_flag("sign_payload", self.sign_payload)
        check_choice("data_path", self.data_path, _DATA_PATHS)
        if self.part_bytes < MIN_PART:
            raise ConfigError("multipart_chunk", f"S3 parts are at least 5MiB, got {self.part_bytes} bytes")
        self.credentials()

    @property
    def part_bytes(self) -> int:
        """``multipart_chunk`` in bytes."""
        return parse_size(self.multipart_chunk, "multipart_chunk")

    @property
    def capacity(self) -> int | None:
        """``max_bytes`` in bytes (``None``: unbounded)."""
        return None if self.max_bytes is None else parse_size(self.max_bytes, "max_bytes")

    def credentials(self) -> dict[str, str | None]:
        """boto3 session keywords of the explicit credentials (``None``: the standard chain's)."""
        return {
            "aws_access_key_id": _secret(self.access_key_id, self.access_key_env, "access_key_env"),
            "aws_secret_access_key": _secret(self.secret_access_key, self.secret_key_env, "secret_key_env"),
            "aws_session_token": self.session_token,
        }


def _secret(value: str | None, env: str | None, env_key: str) -> str | None:
    if env is None:
        return value
    if not isinstance(env, str) or env not in os.environ:
        raise ConfigError(env_key, f"environment variable {env!r} is not set")
    return os.environ[env]
