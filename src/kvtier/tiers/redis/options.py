"""The ``redis`` tier's options (:class:`RedisOptions`) and what is derived from them: the URL the
client connects to, the one shown (no password), the password and the CA file."""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field
from typing import ClassVar

from kvtier.errors import ConfigError
from kvtier.numbers import TTL_SECONDS, Ranges
from kvtier.tiers.remote.options import RemoteOptions, check_flag, check_text

__all__ = ["SCHEMES", "RedisOptions", "redact"]

SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


@dataclass(frozen=True, kw_only=True)
class RedisOptions(RemoteOptions):
    """Options of :class:`~kvtier.tiers.redis.RedisTier`, besides :class:`RemoteOptions`'.

    Attributes:
        url: server URL (see the tier's module doc).
        cluster: ``True`` for a Redis Cluster (also implied by a ``+cluster`` URL).
        key_prefix: first part of every key (several deployments can share a server).
        ttl: seconds until a written block expires (``None``: never; the server's eviction decides).
        password_env: name of an environment variable holding the password (overrides the URL's).
        password: the password itself; meant for ``KVTIER_SECONDARY_TIERS__<i>__PASSWORD_FILE``,
            which reads it from a file (overrides the URL's; not with ``password_env``).
        tls_ca_file: PEM file of the certificate authorities a ``rediss://`` server's certificate
            is checked against (default: the system's); the certificate must name the host.
    """

    url: str = "redis://127.0.0.1:6379/0"
    cluster: bool = False
    key_prefix: str = "kvtier"
    ttl: float | None = None
    password_env: str | None = None
    password: str | None = field(default=None, repr=False)
    tls_ca_file: str | None = None

    ranges: ClassVar[Ranges] = {**RemoteOptions.ranges, "ttl": TTL_SECONDS}

    def check(self) -> None:
        super().check()
        if not isinstance(self.url, str) or not self.url:
            raise ConfigError("url", f'expected a URL such as "redis://host:6379/0", got {self.url!r}')
        if self.scheme not in SCHEMES:
            raise ConfigError("url", f"scheme {self.scheme!r} is not one of {', '.join(SCHEMES)}")
        check_flag("cluster", self.cluster)
        if self.is_cluster and self.scheme == "unix":
            raise ConfigError("cluster", "a Redis Cluster is reached over TCP: use a redis:// URL")
        check_text("key_prefix", self.key_prefix, "kvtier")
        if self.password is not None and self.password_env is not None:
            raise ConfigError("password", "set password (or PASSWORD_FILE) or password_env, not both")
        if self.password is not None and (not isinstance(self.password, str) or not self.password):
            raise ConfigError("password", "expected a non-empty string (the value is never shown)")
        env = self.password_env
        if env is not None and (not isinstance(env, str) or env not in os.environ):
            raise ConfigError("password_env", f"environment variable {env!r} is not set")
        self.ca_file()

    @property
    def scheme(self) -> str:
        return urllib.parse.urlsplit(self.url).scheme

    @property
    def is_cluster(self) -> bool:
        return self.cluster or self.scheme.endswith("+cluster")

    @property
    def tls(self) -> bool:
        return self.scheme.startswith("rediss")

    def secret(self) -> str | None:
        """The password from ``password`` or ``password_env`` (``None``: the URL's, if any)."""
        if self.password_env is not None:
            return os.environ[self.password_env]
        return self.password

    def client_url(self) -> str:
        """The URL redis-py connects to: no ``+cluster``, no password when one is set apart."""
        # Drop "+cluster" from the scheme only (urlunsplit would turn "unix:///p" into "unix:/p").
        url = self.url.replace("+cluster://", "://", 1)
        # The URL's own password would win over the one set apart.
        return url if self.secret() is None else _without_password(url)

    def ca_file(self) -> str | None:
        """``tls_ca_file`` checked: a readable file, and only with a ``rediss://`` URL."""
        value = self.tls_ca_file
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigError("tls_ca_file", f"expected the path of a PEM file, got {value!r}")
        if not self.tls:
            raise ConfigError("tls_ca_file", "is used by TLS only: write the url as rediss://host:port")
        path = os.path.abspath(os.path.expanduser(value))
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise ConfigError("tls_ca_file", f"{path} is not a readable file; give the CA's PEM file")
        return path


def _without_password(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}@" if parts.username else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=user + host))


def redact(url: str) -> str:
    """``url`` without its password (never logged or shown)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urllib.parse.urlunsplit(parts._replace(netloc=user + host))
