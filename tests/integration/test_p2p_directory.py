"""The Redis directory against a real redis-server: publish on store, TTLs, removal on eviction.

An Engine whose p2p tier serves and names the directory publishes its primary tier's keys; the
test reads the directory with :class:`PeerDirectory` (what readers use) and with raw redis-py.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import redis
from polling import wait_for
from remote_servers import redis_server

from kvtier.engine import Engine
from kvtier.keys import BlockKey
from kvtier.tiers.p2p.directory import PeerDirectory

BB = 4096


def test_store_publishes_eviction_removes_and_entries_expire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVTIER_P2P_SECRET", "dir-secret")
    keys = [BlockKey(b"dir-key-%02d" % i) for i in range(4)]
    with redis_server(tmp_path / "redis") as server:
        tier = {"type": "p2p", "secret_env": "KVTIER_P2P_SECRET", "directory": server.url,
                "serve": {"port": 0, "directory_ttl": 3}}  # fmt: skip
        with Engine({"block_bytes": BB, "cpu_bytes_to_use": BB * 4, "secondary_tiers": [tier]}) as engine:
            me = engine.serving.block_service.address
            reader = PeerDirectory(server.url, engine.namespace)
            other_ns = PeerDirectory(server.url, "another-namespace")
            try:
                engine.store_blocks(keys[:2], np.zeros((2, BB), dtype=np.uint8))
                assert wait_for(lambda: reader.holders(keys[:2]) == [me, me])
                assert other_ns.holders(keys[:2]) == [None, None]  # namespaces never mix
                r = redis.Redis.from_url(server.url)
                names = r.keys(b"kvtier:p2p:*")
                assert len(names) == 2 and all(0 < r.pttl(n) <= 3000 for n in names)
                engine.store_blocks(keys[2:], np.zeros((2, BB), dtype=np.uint8))  # 4 slots: all fit
                assert wait_for(lambda: reader.holders(keys) == [me] * 4)
                engine.drain()
                engine.poll()  # the p2p tier's store jobs end: the blocks are unpinned
                engine.reset()  # drops every block: the directory forgets them
                assert wait_for(lambda: reader.holders(keys) == [None] * 4)
                reader.publish("127.0.0.1:1", [keys[3]])
                reader.remove(me, [keys[3]])  # compare-and-delete: not ours, kept
                assert reader.holders([keys[3]]) == ["127.0.0.1:1"]
                # A held key stays published past its TTL (refreshed every ttl/3).
                engine.store_blocks(keys[:1], np.zeros((1, BB), dtype=np.uint8))
                assert wait_for(lambda: reader.holders(keys[:1]) == [me])
                time.sleep(3.5)
                assert reader.holders(keys[:1]) == [me]
                r.close()
            finally:
                reader.close()
                other_ns.close()
