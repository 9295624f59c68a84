"""The ``mooncake`` tier: KV blocks in a Mooncake Store, shared with every instance (and engine) on it.

Mooncake Store (kvcache-ai/Mooncake) is the distributed KV-cache object store vLLM, SGLang HiCache and
LMCache support: a ``mooncake_master`` allocates, *segment holders* (``mooncake_client`` processes, or
engines that lend memory) keep the bytes, and clients move them with the transfer engine over TCP or
RDMA. Config (docs/mooncake.md has a copyable one)::

    {"type": "mooncake", "master_server_addr": "10.0.0.5:50051",
     "metadata_server": "http://10.0.0.5:8080/metadata", "local_hostname": "10.0.0.7"}

* **Data path.** The primary buffer and a small *header arena* (one row per primary slot) are
  registered with the store once (``register_buffer``). A stored object is one value: the
  :mod:`kvtier.codec` header, then the payload. A job of up to ``batch_blocks`` blocks is ONE
  batched call, not split over the workers (``spreads_jobs`` is off: the transfer engine spreads a
  call itself, and two concurrent half-size calls cost more than one; the workers serve concurrent
  jobs). Three ways to move the value, same bytes in the store (each reads the others'):

  - *in place* (rows with header room: the engine's ``primary_row_pad``, any block size): the
    object of slot ``s`` is ONE zero-copy piece, its header in the pad at the end of row
    ``s - 1`` (past that row's block pages, which nothing else reads or writes) running straight
    into the slot; a load is verified where it landed. Slot 0 (no row before it) goes through a
    one-row staging buffer. In-process A/B rounds through the engine (32 blocks) ran in-place
    stores at 1.15x / 1.16x and loads at 1.08x / 1.14x the staged ones at 256 KiB / 1 MiB;
  - *zero copy* (loads of blocks over ``staging_max_block``, default 512 KiB; stores of blocks
    over ``store_staging_max_block``, default 2 MiB): two pieces per object
    (``batch_put_from_multi_buffers`` / ``batch_get_into_multi_buffers``), the header from the
    slot's arena row and the payload straight from/into the primary slot;
  - *staged* (smaller blocks): one piece per object (``batch_put_from`` / ``batch_get_into``)
    through a registered per-worker staging buffer (``batch_blocks`` rows of 1 KiB + a block), one
    copy each way. Over TCP every piece is a transfer slice with a fixed cost, which at small
    blocks is about what a copy costs (measured here at 256 KiB, raw calls: a second piece runs
    at 0.7-0.85 of the one-piece throughput; through the tier, staged stores match zero-copy ones
    and staged loads are ~10 % faster). A load is verified in the staging row and copied into
    the slot only when it passed. Stores stage larger blocks too: in-process A/B rounds through
    the engine ran staged stores at 1.0-1.04x the zero-copy ones at 1 MiB and 1.16-1.28x at
    2 MiB, while staged loads ran at 0.86-0.9x at 1 MiB (the verify pass plus a copy cost more
    than the second piece there), hence two thresholds.

  Either way a load that comes back with a wrong length, another key's header or a bad checksum is
  a miss, counted in ``corrupt``, never served.
* **Keys** are ``<key_prefix>/<namespace>/<hex of the block key>``: the namespace (model, layout and
  the tenant's ``cache_salt``) keeps tenants apart on any master. ``tenant_id`` is also passed to the
  store; a master started with ``-enable_multi_tenants`` then isolates and meters tenants itself (a
  plain master ignores it, and the key prefix still separates them).
* **Return codes** (the store reports failures as codes, not exceptions) are sorted by
  :mod:`kvtier.tiers.mooncake.codes`: a missing key is a miss; "insufficient space" (or a tenant
  quota) drops the store, counts it in ``dropped_stores`` and pauses stores for ``full_backoff`` s; a
  failed transfer counts against the circuit breaker.
* **A dead holder** is found from job outcomes: the master keeps saying the key exists for
  ``client_ttl`` (~10 s), but every transfer to the holder fails, so after ``breaker_failures``
  failed operations the breaker opens and lookups answer MISS; the breaker's trial is a real write
  (:meth:`MooncakeTier._probe`), never ``health_check`` (which only asks the master). Transfers are
  bounded: unless already set, ``MC_TCP_PROGRESS_TIMEOUT_SEC`` and ``MC_TCP_STATUS_TIMEOUT_SEC`` are
  set to ``op_timeout`` (rounded up) before the client starts, so a stalled holder costs seconds,
  not the transport's default 30 s; ``MC_STORE_CLIENT_SETUP_RETRIES`` defaults to 1, so a master that
  is down costs one set-up attempt (~5 s, on a worker) per breaker trial, not ~90 s.
* **Replace semantics.** ``put`` keeps an existing value, so a value found corrupt is removed; when
  its lease still blocks the removal (``OBJECT_HAS_LEASE``), the next store of that key uses
  ``upsert`` instead.

One store client serves all of the tier's workers (its calls are thread-safe and setting one up
costs a segment and seconds to close), so the per-thread client of
:class:`~kvtier.tiers.remote.RemoteTier` is the same object on every thread and is closed only at
shutdown. Common options (threads, deadlines, breaker, back-pressure) are RemoteTier's.
"""

from __future__ import annotations

import importlib.util
import math
import os
import threading
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from kvtier import codec
from kvtier.errors import ConfigError, MisuseError, TierError, TierUnavailableError
from kvtier.keys import BlockKey
from kvtier.tiers.async_tier import ChunkOutcome
from kvtier.tiers.base import TierContext
from kvtier.tiers.mooncake import codes as mc
from kvtier.tiers.mooncake.options import MooncakeOptions
from kvtier.tiers.remote.base import RemoteTier
from kvtier.tiers.remote.errors import ErrorMap, RemoteFullError
from kvtier.tiers.remote.options import RemoteOptions
from kvtier.transfer.workers import Priority

__all__ = ["HEADER_ROW", "MooncakeTier", "require_client"]

Item = tuple[BlockKey, int]
#: Bytes of one header-arena row: block keys up to ``HEADER_ROW - 40`` bytes fit.
HEADER_ROW = 1024
_PROBE_BYTES = 64
_DEADLINE_ENV = ("MC_TCP_PROGRESS_TIMEOUT_SEC", "MC_TCP_STATUS_TIMEOUT_SEC")


#: The options :meth:`MooncakeTier.config_info` shows, in this order.
_SHOWN = (
    "master_server_addr", "metadata_server", "protocol", "key_prefix", "tenant_id", "replica_num",
    "global_segment_size",
)  # fmt: skip


def require_client() -> None:
    """Refuse (``ConfigError`` on ``type``, naming the extra) when the Mooncake client is not
    installed: checked before anything is built, and by ``kvtier check``."""
    if importlib.util.find_spec("mooncake") is None:
        raise ConfigError(
            "type", "the mooncake tier needs the Mooncake client: pip install 'kvtier[mooncake]'"
        )


def mooncake_hint(message: str, env: Mapping[str, str]) -> str | None:
    """Mooncake answers INTERNAL_ERROR to every put when its transfer engine bound an address the
    holders cannot reach, which is what happens when ``MC_TCP_BIND_ADDRESS`` is unset."""
    if "INTERNAL_ERROR" in message and not env.get("MC_TCP_BIND_ADDRESS"):
        return (
            "set MC_TCP_BIND_ADDRESS to this node's address (127.0.0.1 on one machine) in every "
            "Mooncake process and this one (docs/mooncake.md)"
        )
    return None


class MooncakeTier(RemoteTier):
    """KV blocks in a Mooncake Store (see the module doc); its options are
    :class:`~kvtier.tiers.mooncake.options.MooncakeOptions`."""

    error_map: ClassVar[ErrorMap] = mc.MOONCAKE_ERRORS
    options_class: ClassVar[type[RemoteOptions]] = MooncakeOptions
    options: MooncakeOptions
    spreads_jobs: ClassVar[bool] = False

    def __init__(self, *, primary_kv_view: memoryview, context: TierContext, **config: Any) -> None:
        require_client()
        super().__init__(primary_kv_view=primary_kv_view, context=context, **config)
        o = self.options
        if not self.rows.flags.c_contiguous:
            raise MisuseError(f"tier {self.name!r}: the primary buffer must be C-contiguous to register it")
        self.key_prefix = o.key_prefix
        self._prefix = f"{o.key_prefix}/{context.namespace}/"
        self._row_stride = int(self.rows.strides[0])
        # One header row per primary slot (a slot is in at most one job of this tier at a time, so
        # its row is never shared between jobs), plus one row for the breaker's probe.
        self._arena = np.zeros((self.rows.shape[0] + 1, HEADER_ROW), dtype=np.uint8)
        self._probe_name = f"{self._prefix}probe/{uuid.uuid4().hex}"
        self._store: Any = None
        self._setup_lock = threading.Lock()
        self._config: Any = None
        self._rewrite: set[BlockKey] = set()  # keys whose bad value a lease kept: next store upserts
        # Room for a header at the end of every row (``primary_row_pad``): the object of slot s is
        # then [end of row s-1 | slot s], one zero-copy piece; only slot 0 is staged.
        self._in_place = self._row_stride - -(-self.block_bytes // 4096) * 4096 >= HEADER_ROW
        # One piece per object (in place or staged) rather than two (header row + slot).
        self._one_piece_get = self._in_place or self.block_bytes <= o.staging_max_block
        self._one_piece_put = self._in_place or self.block_bytes <= o.store_staging
        self._stages: list[np.ndarray] = []  # per-worker staging rows, registered with the store
        self._stage_local = threading.local()
        # Base addresses, read once (``ndarray.ctypes`` costs microseconds per access).
        self._rows_ptr = int(self.rows.ctypes.data)
        self._flat = self.rows.reshape(-1)
        self._mv = self._flat.data  # slicing a memoryview costs a fraction of an ndarray's
        self._arena_ptr = int(self._arena.ctypes.data)

    @classmethod
    def check_options(cls, context: TierContext, options: Mapping[str, Any]) -> None:
        """The constructor's checks, building nothing: the client is installed, then the options."""
        require_client()
        super().check_options(context, options)

    def failure_hint(self, err: TierError) -> str | None:
        return mooncake_hint(str(err), os.environ) or super().failure_hint(err)

    # -- naming and buffers ----------------------------------------------------------------------------
    def _name(self, key: BlockKey) -> str:
        return self._prefix + bytes(key).hex()

    def _slot_ptr(self, slot: int) -> int:
        return self._rows_ptr + slot * self._row_stride

    def _head_ptr(self, slot: int) -> int:
        return self._arena_ptr + slot * HEADER_ROW

    # -- RemoteTier hooks --------------------------------------------------------------------------------
    def _connect(self) -> Any:
        with self._setup_lock:
            if self._store is None:
                self._store = self._open()
            return self._store

    def _close_client(self, client: Any) -> None:
        """The store client is shared by every worker and survives a holder's death: kept until
        shutdown (it reconnects to a returning holder on its own)."""

    def _close_resources(self) -> None:
        super()._close_resources()
        store, self._store = self._store, None
        if store is not None:
            for arr in (self.rows, self._arena, *self._stages):
                store.unregister_buffer(int(arr.ctypes.data))
            store.close()

    def _put(self, client: Any, route: str, items: list[Item]) -> ChunkOutcome:
        stage = self._stage(client) if self._one_piece_put else None
        names: list[str] = []
        ptrs: list[Any] = []
        sizes: list[Any] = []
        keys: list[BlockKey] = []
        done: list[BlockKey] = []
        error: str | None = None
        # Locals: this loop runs once per block, where attribute lookups add up.
        bb, mv, make, name_of, rewrite = self.block_bytes, self._mv, self.headers, self._name, self._rewrite
        in_place, stride = self._in_place, self._row_stride
        for i, (key, slot) in enumerate(items):
            hlen = codec.FIXED_HEADER_SIZE + len(key)
            if hlen > HEADER_ROW:
                error = error or f"block key of {len(key)} bytes is too long (at most {HEADER_ROW - 40})"
                continue
            if in_place and slot:  # the object: the pad that ends at this row, then the slot
                at = slot * stride
                head, payload = mv[at - hlen : at], mv[at : at + bb]
            else:
                head_arr, payload_arr = self._pieces(stage, i, slot, hlen)
                if stage is not None:
                    np.copyto(payload_arr, self.slot_array(slot))
                head, payload = head_arr.data, payload_arr.data
            head[:] = make(key, payload)
            if rewrite and key in rewrite:
                if self._upsert(client, key, head, payload):
                    done.append(key)
                continue
            names.append(name_of(key))
            keys.append(key)
            self._place(stage is not None, i, slot, hlen, ptrs, sizes)
        put = client.batch_put_from_multi_buffers if stage is None else client.batch_put_from
        codes: list[int] = put(names, ptrs, sizes, self._config) if names else []
        answer_error = self._fold_put_codes(route, keys, codes, done)  # always: it counts and may raise
        error = error or answer_error
        return ChunkOutcome(done=done, nbytes=len(done) * bb, error=error)

    def _fold_put_codes(
        self, route: str, keys: list[BlockKey], codes: list[int], done: list[BlockKey]
    ) -> str | None:
        """Sort the store's answers to one batched put: stored (or already there) keys join ``done``;
        a full store counts dropped stores and reports to the breaker; an unavailable store raises
        (the whole route is down). Returns the first other error, for the chunk's outcome."""
        error: str | None = None
        full = 0
        unavailable: int | None = None
        for key, code in zip(keys, codes, strict=True):
            kind = mc.EXISTS if code == 0 else mc.kind_of(code)
            if kind == mc.EXISTS:
                done.append(key)
            elif kind == mc.FULL:
                full += 1
                error = error or f"mooncake: {mc.name_of(code)}: store dropped"
            elif kind == mc.UNAVAILABLE:
                unavailable = code
            else:
                error = error or f"mooncake: put answered {mc.name_of(code)}"
        if unavailable is not None:
            raise mc.code_error(unavailable, "batched put")
        if full:
            with self._lock:
                self.stats.dropped_stores += full
            self._on_error(route, RemoteFullError(f"mooncake: no space for {full} block(s)"))
        return error

    def _place(self, one: bool, i: int, slot: int, hlen: int, ptrs: list[Any], sizes: list[Any]) -> None:
        """Append the transfer addresses of object ``i`` (for slot ``slot``, a header of ``hlen``
        bytes): in place, one piece (the pad that ends at the slot's row, then the slot); else with
        ``one``, one piece (its staging row); else two pieces (the header arena row, then the slot
        itself, zero-copy)."""
        if self._in_place and slot:
            ptrs.append(self._rows_ptr + slot * self._row_stride - hlen)
            sizes.append(hlen + self.block_bytes)
        elif one:
            ptrs.append(self._stage_ptr(self._row_of(i), hlen))
            sizes.append(hlen + self.block_bytes)
        else:
            ptrs.append([self._head_ptr(slot), self._slot_ptr(slot)])
            sizes.append([hlen, self.block_bytes])

    def _get(self, client: Any, route: str, items: list[Item]) -> ChunkOutcome:
        stage = self._stage(client) if self._one_piece_get else None
        names: list[str] = []
        ptrs: list[Any] = []
        sizes: list[Any] = []
        want: list[tuple[BlockKey, int, int, int]] = []
        bb, mv, name_of = self.block_bytes, self._mv, self._name
        in_place, stride = self._in_place, self._row_stride
        for i, (key, slot) in enumerate(items):
            hlen = codec.FIXED_HEADER_SIZE + len(key)
            if hlen > HEADER_ROW:
                continue  # never stored (too long): a miss
            names.append(name_of(key))
            want.append((key, slot, hlen, i))
            self._place(stage is not None, i, slot, hlen, ptrs, sizes)
        get = client.batch_get_into_multi_buffers if stage is None else client.batch_get_into
        codes: list[int] = get(names, ptrs, sizes) if names else []
        done: list[BlockKey] = []
        failed: list[tuple[BlockKey, int, str, int]] = []
        for (key, slot, hlen, i), name, code in zip(want, names, codes, strict=True):
            if code == hlen + bb:
                if in_place and slot:
                    at = slot * stride
                    if self._verify(key, slot, mv[at - hlen : at], mv[at : at + bb]):
                        done.append(key)
                    continue
                head_arr, payload_arr = self._pieces(stage, i, slot, hlen)
                if self._verify(key, slot, head_arr.data, payload_arr.data):
                    if stage is not None:
                        np.copyto(self.slot_array(slot), payload_arr)  # verified before it is served
                    done.append(key)
            elif code >= 0 or code == mc.INVALID_PARAMS:
                self._reject(key, slot, "length", f"object of {code} bytes, expected {hlen + bb}")
            elif mc.kind_of(code) == mc.MISSING:
                self._vanished(key)
            else:
                failed.append((key, slot, name, code))
        if failed:
            self._triage(client, failed, hlen_of={k: h for k, _, h, _ in want})
        return ChunkOutcome(done=done, nbytes=len(done) * bb)

    def _exists(self, client: Any, route: str, keys: list[BlockKey]) -> list[bool]:
        answers = client.batch_is_exist([self._name(k) for k in keys])
        for code in answers:
            if code < 0:
                raise mc.code_error(int(code), "batch_is_exist")
        return [code == 1 for code in answers]

    def _probe(self, client: Any, route: str) -> None:
        """A real write to a holder (``upsert`` of a tiny object): the master alone answering is not
        enough, since it keeps a dead holder's objects listed for ``client_ttl``."""
        row = self.rows.shape[0]
        codes = client.batch_upsert_from([self._probe_name], [self._head_ptr(row)], [_PROBE_BYTES])
        if codes[0] != 0:
            raise mc.MooncakeUnavailableError(f"mooncake: probe write answered {mc.name_of(codes[0])}")

    def _drop_corrupt(self, key: BlockKey) -> None:
        def drop() -> None:
            result = self._call("", lambda c: c.remove(self._name(key)))
            if result == mc.OBJECT_HAS_LEASE:
                with self._lock:
                    self._rewrite.add(key)  # a put would keep the bad value: upsert next time

        self.run_on_worker(Priority.MAINTENANCE, drop)

    def config_info(self) -> dict[str, Any]:
        info = super().config_info()
        info.update({name: getattr(self.options, name) for name in _SHOWN})
        info["key_prefix"] = self._prefix  # as every object name starts (the namespace included)
        info["data_path"] = {
            "store": self._path_name(self._one_piece_put),
            "load": self._path_name(self._one_piece_get),
        }
        return info

    # -- internals ------------------------------------------------------------------------------------------
    def _open(self) -> Any:
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig  # type: ignore[import-untyped]

        # Bound a stalled holder's transfers by op_timeout (the transport's default is 30 s);
        # read when the client starts, so set before setup. An operator's own setting wins.
        for var in _DEADLINE_ENV:
            os.environ.setdefault(var, str(max(1, math.ceil(self.op_timeout))))
        # A master that is down costs one attempt (~5 s on a worker) instead of the client's ~90 s
        # of retries; the breaker's trial retries the set-up later.
        os.environ.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", "1")
        store, o = MooncakeDistributedStore(), self.options
        code = store.setup(
            o.local_hostname,
            o.metadata_server,
            o.global_segment_size,
            o.local_buffer_size,
            o.protocol,
            o.rdma_devices,
            o.master_server_addr,
            None,
            False,
            "",
            o.tenant_id,
        )
        if code != 0:
            raise TierUnavailableError(
                f"mooncake: setup with master {o.master_server_addr} answered {mc.name_of(code)}"
            )
        for what, arr in (("primary buffer", self.rows), ("header arena", self._arena)):
            code = store.register_buffer(int(arr.ctypes.data), int(arr.nbytes))
            if code != 0:
                store.close()
                raise TierUnavailableError(f"mooncake: register_buffer({what}) answered {mc.name_of(code)}")
        config = ReplicateConfig()
        config.replica_num = o.replica_num
        self._config = config
        return store

    def _stage(self, client: Any) -> np.ndarray:
        """This worker's staging rows (``batch_blocks`` of ``HEADER_ROW + block_bytes``), made and
        registered with the store on first use: row ``i`` holds item ``i`` of a chunk, its header
        ending where the payload starts (at ``HEADER_ROW``), so the object is one contiguous piece.
        A worker runs one chunk at a time, so its rows are never shared."""
        stage: np.ndarray | None = getattr(self._stage_local, "rows", None)
        if stage is None:
            rows = 1 if self._in_place else self.batch_blocks  # in place, only slot 0 is staged
            stage = np.zeros((rows, HEADER_ROW + self.block_bytes), dtype=np.uint8)
            code = client.register_buffer(int(stage.ctypes.data), int(stage.nbytes))
            if code != 0:
                raise mc.MooncakeUnavailableError(f"mooncake: register_buffer(staging) answered {code}")
            with self._lock:
                self._stages.append(stage)
            self._stage_local.rows = stage
            self._stage_local.ptr = int(stage.ctypes.data)
        return stage

    def _stage_ptr(self, row: int, hlen: int) -> int:
        """Address of the object (its header) in staging row ``row`` of this worker."""
        return int(self._stage_local.ptr) + row * (HEADER_ROW + self.block_bytes) + HEADER_ROW - hlen

    def _row_of(self, i: int) -> int:
        """The staging row of item ``i`` when its object is staged (in place only slot 0 is, in
        the one row there is)."""
        return 0 if self._in_place else i

    def _path_name(self, one_piece: bool) -> str:
        if not one_piece:
            return "zero-copy"
        return "in place" if self._in_place else "staged"

    def _pieces(
        self, stage: np.ndarray | None, i: int, slot: int, hlen: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Where item ``i``'s header and payload are (or land) when it does not move in place: a
        staging row, or the slot's header-arena row and the slot itself."""
        if stage is None:
            return self._arena[slot, :hlen], self.slot_array(slot)
        row = self._row_of(i)
        return stage[row, HEADER_ROW - hlen : HEADER_ROW], stage[row, HEADER_ROW:]

    def _upsert(self, client: Any, key: BlockKey, head: memoryview, payload: memoryview) -> bool:
        """Replace a value a lease kept in place (rare: copies through the client's buffer)."""
        code = client.upsert_parts(self._name(key), head.tobytes(), payload, config=self._config)
        if code == 0:
            with self._lock:
                self._rewrite.discard(key)
            return True
        return False

    def _verify(self, key: BlockKey, slot: int, head: memoryview, payload: memoryview) -> bool:
        """Whether the value arrived intact. The header is fully determined by the key, the
        namespace, the length and the payload's checksum, so a value is good exactly when its
        header equals the one this payload would get (one comparison); parsing is only for the
        reason a bad one is rejected."""
        if head.tobytes() == self.headers(key, payload):  # bytes compare faster than a memoryview
            return True
        try:
            parsed = codec.parse_header(
                head, expected_key=bytes(key), ns_tag=self.ns_tag, payload_len=self.block_bytes
            )
            codec.verify_payload(parsed, payload)
            reason, why = "header", "header fields differ from the ones this payload gets"
        except codec.CorruptBlockError as exc:
            reason, why = exc.reason, str(exc)
        self._reject(key, slot, reason, why)
        return False

    def _reject(self, key: BlockKey, slot: int, reason: str, why: str) -> None:
        """A value that failed verification: counted, forgotten, dropped, and the slot zeroed (the
        transfer may have written part of it: never leave another key's bytes behind)."""
        self.slot_array(slot)[:] = 0
        self._corrupt(key, codec.CorruptBlockError(reason, why))

    def _triage(
        self, client: Any, failed: list[tuple[BlockKey, int, str, int]], hlen_of: dict[BlockKey, int]
    ) -> None:
        """Failed reads: an object of the wrong size also fails its transfer, so ask the master for
        the size first. Wrong size: corrupt (a miss). Right size: the holder is unreachable (raise,
        so the breaker counts it)."""
        code = failed[0][3]
        unreachable = False
        for key, slot, name, _ in failed:
            size = int(client.get_size(name))
            if size < 0 and mc.kind_of(size) == mc.MISSING:
                self._vanished(key)
            elif size >= 0 and size != hlen_of[key] + self.block_bytes:
                expected = hlen_of[key] + self.block_bytes
                self._reject(key, slot, "length", f"object of {size} bytes, expected {expected}")
            else:
                unreachable = True
        if unreachable:
            raise mc.code_error(code, "batched get")
