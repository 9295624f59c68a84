"""Which addresses a kvtier server may bind without telling anyone: loopback only.

Every server kvtier runs (the Prometheus exporter of ``metrics_port`` / ``kvtier serve``, the p2p
block server) binds 127.0.0.1 by default. Binding anything else (``0.0.0.0``, ``""``, a LAN
address) exposes it to the network, which may be intended but must never be silent:
:func:`warn_if_exposed` logs one warning naming the server and the address.
"""

from __future__ import annotations

import ipaddress
import logging

__all__ = ["is_loopback", "warn_if_exposed"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def warn_if_exposed(log: logging.Logger, what: str, host: str, consequence: str) -> bool:
    """Log one warning when ``host`` is not loopback; returns whether it was."""
    if is_loopback(host):
        return False
    shown = host or "every interface"
    log.warning("kvtier: %s binds %s, not loopback: %s", what, shown, consequence)
    return True
