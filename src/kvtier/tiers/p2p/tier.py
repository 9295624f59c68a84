"""The ``p2p`` tier: load blocks another instance holds in *its* primary tier, straight into ours.

Config (docs/p2p.md)::

    {"type": "p2p", "peers": ["127.0.0.1:7801"], "secret_env": "KVTIER_P2P_SECRET",
     "directory": "redis://127.0.0.1:6379/0", "serve": {"port": 7800}}

* **Where a key is.** A key's route is the peer that holds it (``""`` while unknown). An unknown key
  answers MISS while a batched check runs on a worker: the Redis ``directory`` (if set) names the
  holder, else every static peer is asked with one LOOKUP each. Known keys HIT from memory.
* **Loads** are one FETCH per (peer, chunk); the peer's bytes are received with ``recv_into``
  directly in the reserved primary slot and, with ``verify`` (default), checked against the peer's
  per-block xxh3 checksum (a mismatch is counted ``corrupt`` and never served).
* **Stores** move nothing: this instance's block server (``serve``) already serves its primary
  tier, so a store is reported as held.
* **Simulation** (``replay --simulate``): the peers' primary tiers as one pool, see
  :meth:`P2PTier.simulation`.
* **Faults.** Each peer is a route of :class:`~kvtier.tiers.remote.RemoteTier` with its own
  circuit breaker: a dead, stalled (deadline ``op_timeout`` + 1 s per 200 MB) or garbling peer fails
  only its keys, opens its breaker (``breaker_failures`` default 1) and is retried after
  ``breaker_reset`` s; its keys are forgotten, so they are looked up again (and found at a new
  address through the directory when the instance restarts).
"""

from __future__ import annotations

import ipaddress
import ssl
import threading
from typing import Any, ClassVar

from kvtier.errors import ConfigError, TierError, TierUnavailableError
from kvtier.files import regular_file
from kvtier.keys import BlockKey, LookupResult
from kvtier.tiers.async_tier import ChunkOutcome, JobState
from kvtier.tiers.base import SimulationProfile, SimulationRequest, TierContext, whole_job
from kvtier.tiers.p2p.client import PeerConnection, PeerRefusedError, parse_peer
from kvtier.tiers.p2p.directory import PeerDirectory
from kvtier.tiers.p2p.options import P2POptions, sim_pool, sub_key
from kvtier.tiers.p2p.protocol import ProtocolError, load_secret
from kvtier.tiers.remote.base import RemoteTier
from kvtier.tiers.remote.errors import ErrorMap, RemoteTimeoutError
from kvtier.tiers.remote.options import RemoteOptions

__all__ = ["P2P_ERRORS", "P2PTier"]

Item = tuple[BlockKey, int]

P2P_ERRORS = ErrorMap(
    "p2p",
    [
        (OSError, TierUnavailableError),  # refused, reset, TLS failure: the peer is down for us
        (TimeoutError, RemoteTimeoutError),
        (ProtocolError, TierUnavailableError),  # garbage: stop talking to it for a while
        (PeerRefusedError, TierUnavailableError),  # mismatch, wrong secret, busy
    ],
)
_MIN_RATE = 200e6  # bytes/s a peer must sustain before a fetch's deadline passes


class _Peers:
    """One worker's connections, by peer address (opened on first use)."""

    def __init__(self, tier: P2PTier, namespace: str | None = None) -> None:
        self.tier = tier
        self.namespace = namespace or tier.context.namespace
        self.conns: dict[str, PeerConnection] = {}

    def get(self, addr: str) -> PeerConnection:
        conn = self.conns.get(addr)
        if conn is not None and not conn.reusable():
            # The peer closed it while this worker did not need it (its idle timeout, a restart):
            # a new connection now, not a failed job and a breaker strike.
            self.drop(addr)
            conn = None
        if conn is None:
            host, port = parse_peer(addr)
            t = self.tier
            conn = PeerConnection(
                host, port, block_bytes=t.block_bytes, layout=t.layout, namespace=self.namespace,
                secret=t.secret, timeout=t.op_timeout, ssl_context=t.ssl_context,
            )  # fmt: skip
            self.conns[addr] = conn
        return conn

    def drop(self, addr: str) -> None:
        conn = self.conns.pop(addr, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for addr in list(self.conns):
            self.drop(addr)


class P2PTier(RemoteTier):
    """Blocks held by peer instances' primary tiers (see the module doc); its options are
    :class:`~kvtier.tiers.p2p.options.P2POptions`."""

    #: Marks a tier whose ``serve`` options start this engine's block server (kvtier.tiers.p2p.service).
    p2p_serves: ClassVar[bool] = True

    persistent: ClassVar[bool] = False
    #: Stores move nothing (``kvtier check`` probes the peers instead of a round trip).
    stores_nothing: ClassVar[bool] = True
    error_map: ClassVar[ErrorMap] = P2P_ERRORS
    options_class: ClassVar[type[RemoteOptions]] = P2POptions
    options: P2POptions
    simulation_uses_primary: ClassVar[bool] = True

    def __init__(self, *, primary_kv_view: memoryview, context: TierContext, **config: Any) -> None:
        super().__init__(primary_kv_view=primary_kv_view, context=context, **config)
        o = self.options
        self.peers = [str(p) for p in o.peers]
        self.peer_networks = o.networks()
        #: Directory entries refused: outside ``peer_networks`` or not an IP ``host:port``.
        self.untrusted_entries = 0
        self.secret = load_secret(secret_env=o.secret_env, secret_file=o.secret_file, secret=o.secret)
        self.layout = str(o.layout)
        self.verify = bool(o.verify)
        self.serve = dict(o.serve) if o.serve is not None else None
        self.directory_url = o.directory
        #: Our own block server's address (set by the engine that starts it): never a route.
        self.self_address: str | None = None
        self.ssl_context = None if o.tls_ca_file is None else _client_tls(o.tls_ca_file)
        self._directory = (
            PeerDirectory(o.directory, context.namespace, timeout=self.op_timeout) if o.directory else None
        )
        self._where: dict[BlockKey, str] = {}
        self._where_lock = threading.Lock()
        # No listing to wait for (as the obj tier without one): an unknown key is a MISS at once,
        # checked with the peers in the background.
        self.index.warm = True

    # -- simulation (kvtier replay --simulate) -----------------------------------------------------
    @classmethod
    def simulate(cls, request: SimulationRequest) -> SimulationProfile:
        """The peers' primary tiers, pooled: a p2p hit exists only while a peer still holds the
        block in *its* primary tier, and this tier stores nothing of its own.

        Capacity: ``sim_peers`` (default: the number of static ``peers``; required with a
        directory alone) x the slots of one peer's primary tier (``sim_peer_bytes`` divided by the
        row stride; default: this config's ``cpu_bytes_to_use``, since peers run the same config).
        Victims are picked by the primary tier's policy (``lru`` without ``primary``). The pool is
        fed by this trace's blocks, as if the peers served traffic like this instance's and never
        held a block twice: an upper bound for such a fleet (docs/p2p.md, Simulation).
        """
        primary, key_path, block_bytes = request.primary, request.key_path, request.block_bytes
        peers, peer_bytes = sim_pool(request.options, key_path)
        row_stride = primary.row_stride if primary else -(-max(block_bytes, 1) // 4096) * 4096
        if peer_bytes is not None:
            per_peer = peer_bytes // row_stride
        elif primary is not None:
            per_peer = primary.slots
        else:
            raise ConfigError(
                sub_key(key_path, "sim_peer_bytes"),
                'the peers\' primary-tier size is unknown here; set sim_peer_bytes (e.g. "8GiB")',
            )
        capacity = peers * per_peer
        room = max(capacity, 1)  # a policy holds at least one block; capacity 0 still stores none
        if primary is not None:
            policy = primary.new_policy(room)
        else:
            policy = request.policy_factory("lru", room, key_path=key_path)
        return SimulationProfile(capacity, policy, whole_job, cls.medium)

    # -- RemoteTier backend ----------------------------------------------------------------------
    def _connect(self) -> Any:
        return _Peers(self)

    def _close_client(self, client: Any) -> None:
        client.close()

    def _route(self, key: BlockKey) -> str:
        return self._where.get(key, "")

    def _put(self, client: Any, route: str, items: list[Item]) -> ChunkOutcome:
        raise TierError("a p2p tier stores nothing")  # never reached: _before_store holds all

    def _load_chunk(self, state: JobState, items: list[Item]) -> ChunkOutcome:
        unplaced = [k for k, _ in items if k not in self._where]
        if unplaced:
            # Keys held without a known peer (this instance's own stores, which its own server
            # served while they were resident): ask the directory and the peers where they are now.
            self._call("", lambda client: self._exists(client, "", unplaced))
        return super()._load_chunk(state, items)

    def _get(self, client: Any, route: str, items: list[Item]) -> ChunkOutcome:
        if not route:
            return ChunkOutcome(error="no peer known for these keys")
        keys = [bytes(k) for k, _ in items]
        dests = [self.slot_array(s).data for _, s in items]
        timeout = self.op_timeout + len(items) * self.block_bytes / _MIN_RATE
        try:
            ok = client.get(route).fetch(keys, dests, timeout, self.verify)
        except BaseException:
            client.drop(route)  # the stream position is unknown now
            raise
        done = [k for (k, _), good in zip(items, ok, strict=True) if good]
        for (key, _), good in zip(items, ok, strict=True):
            if not good:
                self._vanished(key)
                with self._where_lock:
                    self._where.pop(key, None)
        corrupt = sum(good is False for good in ok)
        if corrupt:
            # A peer that sends wrong bytes is not trusted for this chunk: raising marks it down.
            with self._lock:
                self.stats.corrupt += corrupt
            client.drop(route)
            raise ProtocolError(f"{corrupt} block(s) from peer {route} failed their checksum")
        return ChunkOutcome(done=done, nbytes=len(done) * self.block_bytes)

    def _exists(self, client: Any, route: str, keys: list[BlockKey]) -> list[bool]:
        if route:
            return self._ask(client, route, keys)
        found = dict.fromkeys(keys, False)
        todo = list(keys)
        if self._directory is not None:
            holders = self._directory.holders([bytes(k) for k in keys])
            todo = []
            for key, holder in zip(keys, holders, strict=True):
                if holder and not self._trusted(holder):
                    self._distrust(holder)
                    todo.append(key)
                elif holder and holder != self.self_address and self.breaker(holder).allow():
                    self._place(key, holder)
                    found[key] = True
                else:
                    todo.append(key)
        for peer in self.peers:
            if not todo or peer == self.self_address or not self.breaker(peer).allow():
                continue
            try:
                answers = self._ask(client, peer, todo)
            except Exception as exc:  # one bad peer must not fail the others' keys
                self._on_error(peer, self.error_map.translate(exc))
                continue
            self.breaker(peer).success()
            for key, yes in zip(todo, answers, strict=True):
                found[key] = found[key] or yes
            todo = [k for k in todo if not found[k]]
        return [found[k] for k in keys]

    def _trusted(self, holder: str) -> bool:
        """Whether a directory entry names a peer this instance may connect to: a static peer,
        or an IP address inside ``peer_networks`` (host names are never resolved for it)."""
        if holder in self.peers:
            return True
        try:
            host, _ = parse_peer(holder)
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in net for net in self.peer_networks)

    def _distrust(self, holder: str) -> None:
        with self._lock:
            self.untrusted_entries += 1
        shown = holder if len(holder) <= 64 else f"{holder[:64]}... ({len(holder)} chars)"
        self.rlog.warning(
            "untrusted",
            f"kvtier {self.name}: ignored a directory entry outside peer_networks: {shown!r} "
            "(add the fleet's network to peer_networks if it is yours)",
        )

    def get_stats(self) -> dict[str, int]:
        out = super().get_stats()
        out["untrusted_entries"] = self.untrusted_entries
        return out

    def _ask(self, client: Any, peer: str, keys: list[BlockKey]) -> list[bool]:
        try:
            answers: list[bool] = client.get(peer).lookup([bytes(k) for k in keys], self.op_timeout)
        except BaseException:
            client.drop(peer)
            raise
        for key, yes in zip(keys, answers, strict=True):
            if yes:
                self._place(key, peer)
        return answers

    def _place(self, key: BlockKey, peer: str) -> None:
        with self._where_lock:
            self._where[key] = peer

    def _probe(self, client: Any, route: str) -> None:
        if route:
            self._ask(client, route, [BlockKey(b"kvtier-probe")])

    # -- the contract ------------------------------------------------------------------------------
    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        route = self._where.get(key)
        if route is not None and not self.breaker(route).peek():
            # Its peer is down: forget where the key was, so it is looked up afresh (another peer,
            # or the same instance restarted at a new address) once negative_ttl has passed.
            with self._where_lock:
                self._where.pop(key, None)
            with self._lock:
                self.index.forget(key, self.context.clock())
        return super().lookup(key, req_context)

    def _before_store(self, state: JobState) -> None:
        state.ok.update(k for k, _ in state.items)  # our block server serves these already
        state.items = []

    def check_peers(self, namespace: str | None = None) -> list[str]:
        """Handshake with every static peer and query the directory (blocking; for ``kvtier check``,
        which builds tiers under a probe namespace and passes the config's real one here).

        Returns one line per peer/directory that answered; raises ``RuntimeError`` naming the first
        that did not (a refused handshake says why: block size, layout, namespace, secret).
        """
        lines = []
        for peer in self.peers:
            conns = _Peers(self, namespace)
            try:
                conns.get(peer).lookup([b"kvtier-check"], self.op_timeout)
            except Exception as exc:
                raise RuntimeError(f"peer {peer}: {type(exc).__name__}: {exc}") from None
            finally:
                conns.close()
            lines.append(f"peer {peer}: handshake ok")
        if self._directory is not None:
            try:
                self._directory.holders([b"kvtier-check"])
            except Exception as exc:
                raise RuntimeError(f"directory: {type(exc).__name__}: {exc}") from None
            lines.append("directory: reachable")
        return lines

    def config_info(self) -> dict[str, Any]:
        info = super().config_info()
        info.update(peers=self.peers, directory=bool(self.directory_url), verify=self.verify,
                    tls=self.ssl_context is not None, serve=self.serve)  # fmt: skip
        return info

    def _close_resources(self) -> None:
        super()._close_resources()
        if self._directory is not None:
            self._directory.close()


def _client_tls(ca_file: str) -> ssl.SSLContext:
    """The TLS context of connections to peers, verified against ``tls_ca_file``."""
    cafile = regular_file(ca_file, "tls_ca_file", what="PEM file")
    try:
        context = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("tls_ca_file", f"{cafile}: not a CA certificate file ({exc})") from None
    context.check_hostname = False  # peers are addressed by IP; the CA vouches
    return context
