"""The ``p2p`` tier's options (:class:`P2POptions`): where the peers are, how they are trusted,
and this instance's own block server."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvtier.config import parse_size
from kvtier.errors import ConfigError
from kvtier.numbers import BYTES, Range, Ranges
from kvtier.tiers.p2p.client import parse_peer
from kvtier.tiers.p2p.service import SERVE_RANGES, check_serve_options
from kvtier.tiers.remote.options import RemoteOptions

__all__ = ["DEFAULT_PEER_NETWORKS", "P2POptions", "Network", "sim_pool"]

#: Where a directory entry may point by default: this machine only (like Redis's protected mode).
DEFAULT_PEER_NETWORKS = ("127.0.0.0/8", "::1/128")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, kw_only=True)
class P2POptions(RemoteOptions):
    """Options of :class:`~kvtier.tiers.p2p.P2PTier`, besides :class:`RemoteOptions`' (whose
    breaker and index defaults are re-tuned for peers that come and go).

    Attributes:
        peers: static ``"host:port"`` list of block servers.
        directory: ``redis://`` URL of the shared directory (optional when ``peers`` is set).
        secret_env / secret_file: where the shared secret is (one of them, or ``secret``, is
            required).
        secret: the secret itself; meant for ``KVTIER_SECONDARY_TIERS__<i>__SECRET_FILE``, which
            reads it from a file.
        layout: layout fingerprint every peer must present (default: none beyond the namespace).
        verify: check each block's checksum (default ``True``).
        peer_networks: networks (CIDR) a holder named by the directory must be in before this
            instance connects to it (default loopback only: ``127.0.0.0/8``, ``::1/128``); the
            static ``peers`` are always trusted. Anyone who can write the directory could
            otherwise steer every engine's connections to any host and port.
        tls_ca_file: CA file to verify peers' TLS certificates (enables TLS to peers; formerly
            ``tls_ca``).
        serve: options of this instance's own block server, started by the engine (``host``,
            ``port``, ``max_connections``, ``tls_cert``, ``tls_key``, ``directory_ttl``).
        sim_peers / sim_peer_bytes: simulation only (:meth:`P2PTier.simulation`); checked, else unused.
    """

    breaker_failures: int = 1
    breaker_reset: float = 2.0
    negative_ttl: float = 1.0
    peers: Sequence[str] = ()
    directory: str | None = None
    secret_env: str | None = None
    secret_file: str | None = None
    secret: str | None = field(default=None, repr=False)
    layout: str = ""
    verify: bool = True
    peer_networks: Sequence[str] | None = None
    tls_ca_file: str | None = None
    serve: Mapping[str, Any] | None = None
    sim_peers: int | None = None
    sim_peer_bytes: int | str | None = None

    ranges: ClassVar[Ranges] = {
        **RemoteOptions.ranges,
        "sim_peers": Range(0, 1 << 20, integer=True),
        "sim_peer_bytes": BYTES,
        "serve": SERVE_RANGES,
    }
    renamed: ClassVar[dict[str, str]] = {"tls_ca": "tls_ca_file"}

    def check(self) -> None:
        super().check()
        sim_pool(
            {"peers": self.peers, "sim_peers": self.sim_peers, "sim_peer_bytes": self.sim_peer_bytes}, ""
        )
        peers, serve = self.peers, self.serve
        if isinstance(peers, str) or not isinstance(peers, Sequence):
            raise ConfigError("peers", f'expected a list of "host:port", got {peers!r}')
        for p in peers:
            try:
                parse_peer(p)
            except ValueError as exc:
                raise ConfigError("peers", f"{exc} (expected host:port)") from None
        if not peers and not self.directory and serve is None:
            raise ConfigError("peers", "a p2p tier needs peers, a directory URL, or serve options")
        if serve is not None and not isinstance(serve, Mapping):
            raise ConfigError("serve", f"expected an object such as {{'port': 7800}}, got {serve!r}")
        if serve is not None:
            check_serve_options(serve)
        self.networks()

    def networks(self) -> list[Network]:
        """``peer_networks`` parsed; ``ConfigError`` naming the entry that is no CIDR network."""
        value = DEFAULT_PEER_NETWORKS if self.peer_networks is None else self.peer_networks
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ConfigError(
                "peer_networks", f'expected a list of networks such as ["127.0.0.0/8"], got {value!r}'
            )
        out = []
        for i, text in enumerate(value):
            try:
                out.append(ipaddress.ip_network(str(text), strict=False))
            except ValueError:
                raise ConfigError(
                    f"peer_networks[{i}]", f"expected a network such as 127.0.0.0/8, got {text!r}"
                ) from None
        return out


def sim_pool(options: Mapping[str, Any], key_path: str) -> tuple[int, int | None]:
    """(peer count, bytes of one peer's primary tier or ``None`` = this config's) of the simulation."""
    raw = options.get("sim_peers")
    if raw is None:
        peers = options.get("peers") or ()
        if not peers and options.get("directory"):
            raise ConfigError(
                sub_key(key_path, "sim_peers"),
                "a p2p tier with a directory and no static peers has no known fleet size; set "
                "sim_peers (the number of peer instances) to simulate it",
            )
        count = len(peers) if isinstance(peers, Sequence) and not isinstance(peers, str) else 0
    elif isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ConfigError(sub_key(key_path, "sim_peers"), f"expected a peer count >= 0, got {raw!r}")
    else:
        count = raw
    size = options.get("sim_peer_bytes")
    return count, None if size is None else parse_size(size, sub_key(key_path, "sim_peer_bytes"))


def sub_key(key_path: str, key: str) -> str:
    return f"{key_path}.{key}" if key_path else key
