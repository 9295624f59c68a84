"""The Mooncake Store of :mod:`mooncake_procs` for tests: a missing install skips the test locally
and fails it under ``CI=true`` (:mod:`needs`). The session's shared store is the ``mooncake_store``
fixture of conftest.py; a test that damages a store starts its own :class:`MooncakeStore`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mooncake_procs import LOOPBACK_ENV, free_port, loopback_env, missing
from mooncake_procs import MooncakeStore as _Processes
from needs import need

__all__ = ["LOOPBACK_ENV", "MooncakeStore", "free_port", "loopback_env", "raw_client"]


class MooncakeStore(_Processes):
    """:class:`mooncake_procs.MooncakeStore` that skips (locally) or fails (CI) when Mooncake is missing."""

    def __init__(self, workdir: Path, *, segment: str = "256MB", master_args: tuple[str, ...] = ()) -> None:
        reason = missing()
        need(reason is None, reason or "")
        super().__init__(workdir, segment=segment, master_args=master_args)


def raw_client(store: MooncakeStore) -> Any:
    """A plain ``MooncakeDistributedStore`` on ``store`` (a pure client), to inspect or damage values."""
    from mooncake.store import MooncakeDistributedStore

    client = MooncakeDistributedStore()
    code = client.setup("127.0.0.1", store.metadata_server, 0, 16 << 20, "tcp", "", store.master_addr)
    assert code == 0, f"mooncake setup answered {code}"
    return client
