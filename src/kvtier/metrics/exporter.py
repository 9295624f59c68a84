"""An HTTP ``/metrics`` endpoint for one engine (its own registry and thread), 127.0.0.1 by default."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvtier.errors import KvtierError
from kvtier.metrics.collector import EngineCollector, StatsFn, StatsSource, require_prometheus
from kvtier.netaddr import warn_if_exposed

if TYPE_CHECKING:
    from kvtier.config import KvtierConfig

__all__ = ["MetricsExporter", "exporter_from_config", "start_exporter"]

log = logging.getLogger("kvtier.metrics")


class MetricsExporter:
    """An HTTP ``/metrics`` endpoint for one engine, on its own registry and thread.

    Use :func:`start_exporter`. ``port`` is the bound port (useful when started with port 0).
    ``close()`` stops the server; idempotent; also a context manager.
    """

    def __init__(self, source: StatsSource | StatsFn, port: int = 0, addr: str = "127.0.0.1",
                 const_labels: Mapping[str, str] | None = None) -> None:  # fmt: skip
        pc = require_prometheus()
        warn_if_exposed(
            log, "the metrics exporter", addr,
            "anyone on the network can read this engine's /metrics (use 127.0.0.1 unless intended)",
        )  # fmt: skip
        self.registry = pc.CollectorRegistry(auto_describe=False)
        self.collector = EngineCollector(source, const_labels)
        self.registry.register(self.collector)
        try:
            self._server, self._thread = pc.start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise KvtierError(
                f"metrics_port: cannot listen on {addr}:{port} ({exc.strerror or exc}); pick a free port or 0"
            ) from exc
        self.addr = addr
        self.port: int = int(self._server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def close(self) -> None:
        # Idempotent as it stands (no flag needed): once the serving loop has ended, socketserver's
        # shutdown() returns at once, and closing a closed socket does nothing.
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_exporter(
    source: StatsSource | StatsFn,
    port: int = 0,
    addr: str = "127.0.0.1",
    const_labels: Mapping[str, str] | None = None,
) -> MetricsExporter:
    """Serve ``source``'s metrics on ``http://addr:port/metrics`` (port 0 picks a free port)."""
    return MetricsExporter(source, port, addr, const_labels)


def exporter_from_config(source: StatsSource | StatsFn, config: KvtierConfig) -> MetricsExporter | None:
    """Start an exporter on ``config.metrics_port`` (127.0.0.1) if it is set, else return ``None``.

    The engine (or any owner of one) calls this after construction and closes the result with it.
    """
    if config.metrics_port is None:
        return None
    return start_exporter(source, config.metrics_port)
