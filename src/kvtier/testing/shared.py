"""``SharedStoreTests``: a network tier as a store shared by engines, as a pytest mixin.

The scenarios every shared tier (Redis, S3, Mooncake, yours) must pass, written once, against a
real server: two engine processes hitting each other's blocks while another tenant (``cache_salt``)
never does; a byte-exact round trip through the engine; values damaged on the server (truncated,
flipped, another key's, empty, extended) never served and counted; a value the server lost (evicted,
deleted) a miss, not an error. Subclass and implement the hooks::

    class TestMyStoreShared(SharedStoreTests):
        @pytest.fixture(autouse=True)
        def _server(self, my_server):
            self.url = my_server.url

        def tier_config(self, prefix, **options):
            return {"type": "mine", "url": self.url, "key_prefix": prefix, **options}

        def make_tier(self, primary, prefix, **options):
            return MyTier(primary_kv_view=primary.view, context=primary.context("mine"),
                          url=self.url, key_prefix=prefix, **options)

        def raw_get(self, tier, key): ...          # the stored value, read past the tier
        def raw_put(self, tier, key, value): ...   # overwrite it
        def raw_delete(self, tier, key): ...       # remove it

Values are the :mod:`kvtier.codec` blob (header, then payload); a backend that stores them in
another shape overrides :meth:`SharedStoreTests.damage` and sets ``damages``. The engine processes
run :mod:`kvtier.testing.engine_proc` with this interpreter (``engine_env`` adds variables).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, ClassVar

import numpy as np
import pytest

from kvtier.engine import Engine
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing.primary import PrimaryBuffer, run_job
from kvtier.tiers.remote.base import RemoteTier

__all__ = ["DAMAGES", "SharedStoreTests", "damaged"]

#: The ways :func:`damaged` spoils a stored value.
DAMAGES = ("truncate", "flip_payload", "flip_header", "other_key", "empty", "extend")


def damaged(value: bytes, how: str, other: bytes) -> bytes:
    """``value`` spoiled ``how`` (one of :data:`DAMAGES`; ``other`` is another key's value)."""
    if how == "truncate":
        return value[:-100]
    if how == "flip_payload":
        return value[:-1] + bytes([value[-1] ^ 1])
    if how == "flip_header":
        return value[:10] + bytes([value[10] ^ 0xFF]) + value[11:]
    if how == "other_key":
        return other
    if how == "empty":
        return b""
    if how == "extend":
        return value + b"\0"
    raise ValueError(f"unknown damage {how!r}")


class SharedStoreTests:
    """Subclass as ``TestXxx`` and implement the hooks; pytest then runs every scenario."""

    #: Block size of the engine scenarios (the direct-tier ones use 5000-byte blocks).
    engine_block: ClassVar[int] = 256 * 1024
    #: Extra keys of the engine config (``primary_row_pad``).
    engine_top: ClassVar[dict[str, Any]] = {}
    #: Tier options every scenario adds (a data path, a staging threshold).
    options: ClassVar[dict[str, Any]] = {}
    #: Damage kinds :meth:`damage` understands.
    damages: ClassVar[tuple[str, ...]] = DAMAGES
    #: Row stride of the direct-tier scenarios' primary buffer.
    row_stride: ClassVar[int] = 8192
    #: What a slot holds before a load of a damaged value (the tier must leave it zeroed).
    poison: ClassVar[int] = 0
    #: Seconds to wait for jobs, promotions and engine processes.
    patience: ClassVar[float] = 10.0

    # -- to implement ------------------------------------------------------------------------
    def tier_config(self, prefix: str, **options: Any) -> dict[str, Any]:
        """A ``secondary_tiers`` entry (``type`` included) keeping its keys under ``prefix``."""
        raise NotImplementedError("subclasses of SharedStoreTests implement tier_config()")

    def make_tier(self, primary: PrimaryBuffer, prefix: str, **options: Any) -> RemoteTier:
        """The tier over ``primary``, its keys under ``prefix`` (default: from :meth:`tier_config`)."""
        raise NotImplementedError("subclasses of SharedStoreTests implement make_tier()")

    def raw_get(self, tier: RemoteTier, key: BlockKey) -> bytes:
        """The value the server holds for ``key``, read without the tier."""
        raise NotImplementedError

    def raw_put(self, tier: RemoteTier, key: BlockKey, value: bytes) -> None:
        """Replace the value the server holds for ``key``."""
        raise NotImplementedError

    def raw_delete(self, tier: RemoteTier, key: BlockKey) -> None:
        """Remove ``key``'s value from the server (an eviction the tier did not see)."""
        raise NotImplementedError

    def damage(self, tier: RemoteTier, victim: BlockKey, donor: BlockKey, how: str, payload: bytes) -> None:
        """Spoil ``victim``'s value ``how`` (``donor`` holds another valid value; ``payload`` is the
        victim's block)."""
        value = self.raw_get(tier, victim)
        assert value.endswith(payload), "the stored value ends with the block's bytes"
        self.raw_put(tier, victim, damaged(value, how, self.raw_get(tier, donor)))

    def after_damage(self, tier: RemoteTier, victim: BlockKey, primary: PrimaryBuffer, block: bytes) -> None:
        """Backend checks after a damaged value was refused (default: none)."""

    def engine_env(self) -> dict[str, str]:
        """Variables the engine processes need besides this process's environment."""
        return {}

    # -- helpers -------------------------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "damage_kind" in metafunc.fixturenames:
            metafunc.parametrize("damage_kind", self.damages)

    def engine_config(self, prefix: str, **top: Any) -> dict[str, Any]:
        return {
            "block_bytes": self.engine_block,
            "cpu_bytes_to_use": 16 * self.engine_block,
            "model": f"{type(self).__name__}-shared",
            "secondary_tiers": [self.tier_config(prefix, **self.options)],
            **self.engine_top,
            **top,
        }

    def engine_proc(
        self, cfg: dict[str, Any], mode: str, n: int, seed: int, timeout: float | None = None
    ) -> dict[str, Any]:
        """Run one engine process (:mod:`kvtier.testing.engine_proc`); its JSON answer."""
        argv = [json.dumps(cfg), mode, str(n), str(seed), str(timeout or self.patience)]
        out = subprocess.run(
            [sys.executable, "-m", "kvtier.testing.engine_proc", *argv],
            capture_output=True, text=True, timeout=120, check=True, env={**os.environ, **self.engine_env()},
        )  # fmt: skip
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result

    def tier_on(self, primary: PrimaryBuffer, prefix: str) -> RemoteTier:
        return self.make_tier(primary, prefix, **self.options)

    def store(self, tier: RemoteTier, keys: list[BlockKey], slots: list[int], jid: int) -> bool:
        return run_job(tier, jid, keys, slots, load=False, timeout=self.patience).success

    def load(self, tier: RemoteTier, keys: list[BlockKey], slots: list[int], jid: int) -> set[BlockKey]:
        return set(run_job(tier, jid, keys, slots, load=True, timeout=self.patience).transferred(keys))

    def prefix(self, name: str) -> str:
        """A key prefix of this class's own (its subclasses share servers)."""
        return f"{type(self).__name__.lower()}-{name}"

    # -- the scenarios ---------------------------------------------------------------------------
    def test_two_engine_processes_share_blocks_and_tenants_never_do(self) -> None:
        """Blocks one engine process stored are byte-exact hits for another; an engine of another
        tenant (``cache_salt``) on the same store finds none of them."""
        cfg = self.engine_config(self.prefix(f"share-{os.getpid()}-{time.monotonic_ns()}"))
        assert self.engine_proc(cfg, "store", 8, seed=7) == {"stored": 8, "tier_stores": 8}
        assert self.engine_proc(cfg, "load", 8, seed=7) == {"hits": 8, "exact": 8}
        other_tenant = {**cfg, "cache_salt": "tenant-b"}
        assert self.engine_proc(other_tenant, "load", 8, seed=7, timeout=1.5)["hits"] == 0

    def test_engine_round_trip_is_byte_exact(self) -> None:
        """Blocks stored through the engine come back byte-exact after its primary tier is reset."""
        keys = [BlockKey(f"e{i}".encode()) for i in range(6)]
        data = np.random.default_rng(3).integers(0, 256, (6, self.engine_block), dtype=np.uint8)
        out = np.zeros_like(data)
        with Engine(self.engine_config(self.prefix(f"rt-{time.monotonic_ns()}"))) as eng:
            assert isinstance(eng.tiers[0], RemoteTier)
            assert eng.store_blocks(keys, data) == 6
            eng.drain()
            eng.reset()
            deadline = time.monotonic() + self.patience
            while eng.lookup(keys).num_hits < 6:
                assert time.monotonic() < deadline, "stored blocks never became hits"
                eng.poll()
                time.sleep(0.005)
            assert eng.load_blocks(keys, out) == 6
            assert np.array_equal(out, data)

    def test_damaged_values_are_never_served(self, damage_kind: str) -> None:
        """A value damaged on the server is a miss counted in ``corrupt`` that leaves the slot
        zeroed and is forgotten; the other keys of the same job still load."""
        primary = PrimaryBuffer.heap(4, self.row_stride, 5000)
        written = primary.fill_random([0, 1], seed=5)
        a, b = BlockKey(b"victim"), BlockKey(b"donor")
        tier = self.tier_on(primary, self.prefix(f"corrupt-{damage_kind}-{time.monotonic_ns()}"))
        try:
            assert self.store(tier, [a, b], [0, 1], 1)
            self.damage(tier, a, b, damage_kind, written[0])
            primary.rows[2] = self.poison
            assert self.load(tier, [a, b], [2, 3], 2) == {b}
            assert not primary.block(2).any(), "a bad value must not reach the slot"
            assert primary.block(3).tobytes() == written[1]
            assert tier.get_stats()["corrupt"] == 1
            assert tier.lookup(a) is LookupResult.MISS  # forgotten, not served again
            self.after_damage(tier, a, primary, written[0])
        finally:
            tier.shutdown()

    def test_a_value_the_server_lost_is_a_miss_not_an_error(self) -> None:
        """A key the server evicted behind the tier's back fails its load as a miss: no breaker."""
        primary = PrimaryBuffer.heap(4, self.row_stride, 5000)
        primary.fill_random([0], seed=6)
        tier = self.tier_on(primary, self.prefix(f"lost-{time.monotonic_ns()}"))
        try:
            k = BlockKey(b"gone")
            assert self.store(tier, [k], [0], 1) and tier.lookup(k) is LookupResult.HIT
            self.raw_delete(tier, k)
            assert self.load(tier, [k], [1], 2) == set()
            assert tier.lookup(k) is LookupResult.MISS and tier.get_stats()["failed_jobs"] == 1
            assert tier.get_stats()["breaker_open"] == 0
        finally:
            tier.shutdown()
