"""A running block service: the :class:`BlockServer` plus, with a directory, its publisher.

Started in-process by an engine whose config has a ``p2p`` tier with ``serve`` options
(:func:`start_for_engine`), or by ``kvtier serve --p2p-port``; both go through :func:`start`.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from kvtier.errors import ConfigError
from kvtier.files import regular_file
from kvtier.numbers import CONNECTIONS, SECONDS, check_numbers
from kvtier.tiers.p2p.directory import DirectoryPublisher, PeerDirectory
from kvtier.tiers.p2p.server import BlockServer

__all__ = ["SERVE_RANGES", "BlockService", "check_serve_options", "start", "start_for_engine"]

_SERVE_KEYS = (
    "host",
    "port",
    "max_connections",
    "max_pending",
    "idle_timeout",
    "io_timeout",
    "tls_cert",
    "tls_key",
    "directory_ttl",
)

#: The numeric ``serve`` options and their ranges (:mod:`kvtier.numbers`).
SERVE_RANGES = {
    "max_connections": CONNECTIONS,
    "max_pending": CONNECTIONS,
    "idle_timeout": SECONDS,
    "io_timeout": SECONDS,
    "directory_ttl": SECONDS,
}


class BlockService:
    """A block server and its directory publisher; :meth:`close` stops both."""

    def __init__(self, server: BlockServer, publisher: DirectoryPublisher | None) -> None:
        self.server = server
        self.publisher = publisher

    @property
    def address(self) -> str:
        return self.server.address

    def close(self) -> None:
        self.server.close()
        if self.publisher is not None:
            self.publisher.close()


def check_serve_options(options: Mapping[str, Any]) -> None:
    """:class:`ConfigError` naming the first unknown or ill-typed ``serve`` key."""
    unknown = sorted(set(options) - set(_SERVE_KEYS))
    if unknown:
        raise ConfigError(f"serve.{unknown[0]}", f"unknown key; valid keys are: {', '.join(_SERVE_KEYS)}")
    port = options.get("port", 0)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError("serve.port", f"expected a port in 0..65535 (0 = any free port), got {port!r}")
    check_numbers(options, SERVE_RANGES, "serve")


def start(
    engine: Any, *, secret: bytes, options: Mapping[str, Any], layout: str = "", directory: str | None = None
) -> BlockService:
    """Serve ``engine``'s primary tier with ``options`` (the ``serve`` keys; see docs/p2p.md)."""
    check_serve_options(options)
    ctx = None
    if options.get("tls_cert"):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        cert = regular_file(options["tls_cert"], "serve.tls_cert", what="PEM file")
        key = options.get("tls_key")
        key = None if key is None else regular_file(key, "serve.tls_key", what="PEM file")
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("serve.tls_cert", f"cannot load the certificate/key: {exc}") from None
    server = BlockServer(
        engine,
        secret=secret,
        host=str(options.get("host", "127.0.0.1")),
        port=int(options.get("port", 0)),
        layout=layout,
        ssl_context=ctx,
        max_connections=int(options.get("max_connections", 64)),
        max_pending=int(options.get("max_pending", 16)),
        idle_timeout=float(options.get("idle_timeout", 60.0)),
        io_timeout=float(options.get("io_timeout", 5.0)),
    )
    publisher = None
    if directory:
        ttl = float(options.get("directory_ttl", 30.0))
        publisher = DirectoryPublisher(PeerDirectory(directory, engine.namespace, ttl=ttl), server.address)
        engine.subscribe(publisher.on_event)
    return BlockService(server, publisher)


def start_for_engine(engine: Any) -> BlockService | None:
    """Start the block service the first ``p2p`` tier with ``serve`` options asks for (else ``None``).

    A p2p tier is recognised by its ``serve`` attribute (the tier imports this module, so this
    module does not import the tier).
    """
    for tier in engine.tiers:
        if getattr(tier, "p2p_serves", False) and tier.serve is not None:
            service = start(
                engine,
                secret=tier.secret,
                options=tier.serve,
                layout=tier.layout,
                directory=tier.directory_url,
            )
            tier.self_address = service.address
            return service
    return None
