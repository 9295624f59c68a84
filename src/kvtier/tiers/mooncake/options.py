"""The ``mooncake`` tier's options (:class:`MooncakeOptions`): where the store is, what this
process lends it, and when blocks are staged rather than moved zero-copy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvtier.errors import ConfigError
from kvtier.numbers import MAX_BYTES, Range, Ranges
from kvtier.tiers.remote.options import RemoteOptions, check_choice, check_text

__all__ = ["STORE_STAGING_MAX", "MooncakeOptions"]

#: Default ``store_staging_max_block``: the largest block size staged stores were measured at.
STORE_STAGING_MAX = 2 << 20
_PROTOCOLS = ("tcp", "rdma")
#: Options in bytes: integers only (an integral float is not a size Mooncake's C++ client takes).
_SIZES = ("local_buffer_size", "global_segment_size", "replica_num", "staging_max_block")


@dataclass(frozen=True, kw_only=True)
class MooncakeOptions(RemoteOptions):
    """Options of :class:`~kvtier.tiers.mooncake.MooncakeTier`, besides :class:`RemoteOptions`'.

    Attributes:
        master_server_addr: ``host:port`` of ``mooncake_master``'s RPC service.
        metadata_server: the transfer engine's metadata service (the master's
            ``http://host:port/metadata`` when it runs ``-enable_http_metadata_server``, or an etcd URL).
        local_hostname: the address this process advertises to the store (this node's address on a
            real cluster; ``127.0.0.1`` for a single machine).
        protocol: ``"tcp"`` or ``"rdma"`` (passed through; RDMA needs the CUDA/RDMA wheel and devices).
        rdma_devices: RDMA device names for ``protocol: rdma`` (comma separated).
        local_buffer_size: bytes of the client's staging buffer (zero-copy transfers barely use it).
        global_segment_size: bytes this process lends to the store (0: a pure client; the data lives
            in the holders).
        replica_num: replicas per object.
        key_prefix: first part of every key (deployments sharing one store keep apart by it).
        tenant_id: the store's own tenant (see the tier's module doc).
        staging_max_block: blocks of at most this many bytes move as ONE piece per object through
            a registered per-worker staging buffer (one copy each way); larger ones zero-copy as
            two pieces (see the tier's module doc). 0: always zero-copy. Loads use it; stores too
            unless ``store_staging_max_block`` is given.
        store_staging_max_block: the same threshold for stores (default: 2 MiB, or 0 when
            ``staging_max_block`` is 0). Staging rows are allocated per worker on first use
            (``batch_blocks`` rows of 1 KiB + a block; untouched rows cost no memory).
    """

    threads: int = 2
    batch_blocks: int = 64
    op_timeout: float = 2.0
    master_server_addr: str | None = None
    metadata_server: str | None = None
    local_hostname: str = "127.0.0.1"
    protocol: str = "tcp"
    rdma_devices: str = ""
    local_buffer_size: int = 16 << 20
    global_segment_size: int = 0
    replica_num: int = 1
    key_prefix: str = "kvtier"
    tenant_id: str = "default"
    staging_max_block: int = 512 << 10
    store_staging_max_block: int | None = None

    ranges: ClassVar[Ranges] = {
        **RemoteOptions.ranges,
        "local_buffer_size": Range(1 << 20, MAX_BYTES, integer=True),
        "global_segment_size": Range(0, MAX_BYTES, integer=True),
        "replica_num": Range(1, 64, integer=True),
        "staging_max_block": Range(0, MAX_BYTES, integer=True),
        "store_staging_max_block": Range(0, MAX_BYTES, integer=True),
    }

    def check(self) -> None:
        super().check()
        check_text("master_server_addr", self.master_server_addr, "10.0.0.5:50051")
        check_text("metadata_server", self.metadata_server, "http://10.0.0.5:8080/metadata")
        check_text("local_hostname", self.local_hostname, "10.0.0.7")
        check_choice("protocol", self.protocol, _PROTOCOLS)
        if not isinstance(self.rdma_devices, str):
            raise ConfigError("rdma_devices", f"expected a string of device names, got {self.rdma_devices!r}")
        check_text("key_prefix", self.key_prefix, "kvtier")
        check_text("tenant_id", self.tenant_id, "default")
        for name in (*_SIZES, "store_staging_max_block"):
            value = getattr(self, name)
            if isinstance(value, float):
                raise ConfigError(name, f"expected an integer number of bytes, got {value!r}")

    @property
    def store_staging(self) -> int:
        """``store_staging_max_block`` with its default applied."""
        if self.store_staging_max_block is not None:
            return int(self.store_staging_max_block)
        return STORE_STAGING_MAX if self.staging_max_block else 0
