"""The obj tier on a real S3 gateway (Ceph RGW) as a shared store (kvtier.testing.SharedStoreTests:
through the engine, shared by two engine processes, tenants apart, damaged objects never served, a
deleted object a miss); then what only S3 has: long keys' headers in the body, both data paths
reading each other's objects, multipart for large blocks, max_bytes, the warming listing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from needs import need_module
from remote_servers import s3_settings
from test_obj_contract import BUCKET, obj_options

from kvtier.jobs import JobResult
from kvtier.keys import BlockKey, LookupResult
from kvtier.testing import PrimaryBuffer, SharedStoreTests, run_job
from kvtier.tiers.remote import RemoteTier

need_module("boto3", "s3")

from kvtier.tiers.obj import ObjTier  # noqa: E402


def raw_client() -> Any:
    import boto3

    s3 = s3_settings()
    return boto3.client(
        "s3", endpoint_url=s3["endpoint_url"], aws_access_key_id=s3["access_key_id"],
        aws_secret_access_key=s3["secret_access_key"], region_name="us-east-1",
    )  # fmt: skip


class TestObjShared(SharedStoreTests):
    patience = 20.0
    #: An object is the payload alone, its header in the metadata: damage either.
    damages: ClassVar[tuple[str, ...]] = (
        "truncate", "flip_payload", "other_key", "empty", "no_metadata", "bad_metadata",
    )  # fmt: skip

    def tier_config(self, prefix: str, **options: Any) -> dict[str, Any]:
        return {"type": "obj", **obj_options(Path(prefix), key_prefix=prefix, **options)}

    def make_tier(self, primary: PrimaryBuffer, prefix: str, **options: Any) -> ObjTier:
        opts = obj_options(Path(prefix), key_prefix=prefix, **options)
        return ObjTier(primary_kv_view=primary.view, context=primary.context("obj"), **opts)

    def damage(self, tier: RemoteTier, victim: BlockKey, donor: BlockKey, how: str, payload: bytes) -> None:
        assert isinstance(tier, ObjTier)
        raw = raw_client()
        name = tier.object_name(victim)
        got = raw.get_object(Bucket=BUCKET, Key=name)
        value, meta = got["Body"].read(), got["Metadata"]
        assert value == payload and set(meta) == {"kvtier-head"}  # the header rides in metadata
        if how == "truncate":
            value = value[: len(value) // 2]
        elif how == "flip_payload":
            value = value[:-7] + bytes([value[-7] ^ 0x10]) + value[-6:]
        elif how == "other_key":
            other = raw.get_object(Bucket=BUCKET, Key=tier.object_name(donor))
            value, meta = other["Body"].read(), other["Metadata"]
        elif how == "no_metadata":
            meta = {}
        elif how == "bad_metadata":
            meta = {"kvtier-head": "not*base64"}
        else:
            value = b""
        raw.put_object(Bucket=BUCKET, Key=name, Body=value, Metadata=meta)

    def raw_delete(self, tier: RemoteTier, key: BlockKey) -> None:
        assert isinstance(tier, ObjTier)
        raw_client().delete_object(Bucket=BUCKET, Key=tier.object_name(key))


def _run(tier: ObjTier, keys: list[BlockKey], slots: list[int], jid: int, *, load: bool) -> JobResult:
    return run_job(tier, jid, keys, slots, load=load, timeout=60)


def test_long_keys_lead_the_body_with_their_header(tmp_path: Path) -> None:
    """A header too big for S3's 2 KB of metadata goes in front of the payload; both layouts load."""
    primary = PrimaryBuffer.heap(4, 8192, 5000)
    written = primary.fill_random([0, 1], seed=9)
    long_key, short_key = BlockKey(b"L" * 2000), BlockKey(b"short")
    tier = ObjTier(primary_kv_view=primary.view, context=primary.context("obj"), **obj_options(tmp_path))
    try:
        assert _run(tier, [long_key, short_key], [0, 1], 1, load=False).success
        raw = raw_client()
        long_obj = raw.get_object(Bucket=BUCKET, Key=tier.object_name(long_key))
        assert long_obj["Metadata"] == {} and long_obj["ContentLength"] > 5000 + 2000
        assert raw.head_object(Bucket=BUCKET, Key=tier.object_name(short_key))["ContentLength"] == 5000
        got = _run(tier, [long_key, short_key], [2, 3], 2, load=True)
        assert got.success, got.error
        assert primary.block(2).tobytes() == written[0] and primary.block(3).tobytes() == written[1]
    finally:
        tier.shutdown()


@pytest.mark.parametrize(("writer", "reader"), [("direct", "boto3"), ("boto3", "direct")])
def test_each_data_path_reads_what_the_other_wrote(tmp_path: Path, writer: str, reader: str) -> None:
    """kvtier's own GET/PUT path and boto3's write the same objects (name, body, metadata):
    instances with either setting share a bucket, in both layouts (header in metadata, header
    leading the body)."""
    primary = PrimaryBuffer.heap(4, 8192, 5000)
    written = primary.fill_random([0, 1], seed=12)
    keys = [BlockKey(b"short-" + writer.encode()), BlockKey(b"L" * 1500 + writer.encode())]
    tiers = [
        ObjTier(
            primary_kv_view=primary.view, context=primary.context("obj"), **obj_options(tmp_path, data_path=p)
        )
        for p in (writer, reader)
    ]
    try:
        assert _run(tiers[0], keys, [0, 1], 1, load=False).success
        got = _run(tiers[1], keys, [2, 3], 2, load=True)
        assert got.success, got.error
        assert primary.block(2).tobytes() == written[0] and primary.block(3).tobytes() == written[1]
        meta = raw_client().get_object(Bucket=BUCKET, Key=tiers[0].object_name(keys[0]))["Metadata"]
        assert set(meta) == {"kvtier-head"}
    finally:
        for t in tiers:
            t.shutdown()


def test_large_blocks_use_multipart_uploads(tmp_path: Path) -> None:
    block = 11 << 20
    primary = PrimaryBuffer.heap(2, block, block)
    written = primary.fill_random([0], seed=6)
    opts = obj_options(tmp_path, multipart_threshold="6MiB", multipart_chunk="5MiB", op_timeout=10)
    tier = ObjTier(primary_kv_view=primary.view, context=primary.context("obj"), **opts)
    try:
        k = BlockKey(b"big")
        assert _run(tier, [k], [0], 1, load=False).success
        head = raw_client().head_object(Bucket=BUCKET, Key=tier.object_name(k))
        assert head["ETag"].strip('"').endswith("-3"), "an 11 MiB blob in 5 MiB parts has 3 parts"
        assert _run(tier, [k], [1], 2, load=True).success
        assert primary.block(1).tobytes() == written[0]
    finally:
        tier.shutdown()


def test_max_bytes_deletes_the_oldest_objects(tmp_path: Path) -> None:
    primary = PrimaryBuffer.heap(8, 65536, 65536)
    primary.fill_random(range(8), seed=7)
    size = 65536  # the object is the payload alone (the header rides in metadata)
    tier = ObjTier(
        primary_kv_view=primary.view, context=primary.context("obj"),
        **obj_options(tmp_path, max_bytes=4 * size, threads=1),
    )  # fmt: skip
    try:
        keys = [BlockKey(f"cap{i}".encode()) for i in range(6)]
        for i, k in enumerate(keys):
            assert _run(tier, [k], [i], i + 1, load=False).success
        assert tier.get_stats()["evictions"] == 2
        raw = raw_client()
        left = {o["Key"] for o in raw.list_objects_v2(Bucket=BUCKET, Prefix=tier.prefix).get("Contents", [])}
        assert left == {tier.object_name(k) for k in keys[2:]}
        assert tier.lookup(keys[0]) is LookupResult.MISS and tier.lookup(keys[5]) is LookupResult.HIT
    finally:
        tier.shutdown()


def test_listing_warms_a_new_instance(tmp_path: Path) -> None:
    primary = PrimaryBuffer.heap(4, 8192, 5000)
    primary.fill_random([0, 1], seed=8)
    keys = [BlockKey(b"w0"), BlockKey(b"w1")]
    first = ObjTier(primary_kv_view=primary.view, context=primary.context("obj"), **obj_options(tmp_path))
    try:
        assert _run(first, keys, [0, 1], 1, load=False).success
    finally:
        first.shutdown()
    again = ObjTier(primary_kv_view=primary.view, context=primary.context("obj"), **obj_options(tmp_path))
    try:
        deadline = time.monotonic() + 20
        while not again.index.warm:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # Known from the listing alone: HIT without any per-key check.
        assert [again.lookup(k) for k in keys] == [LookupResult.HIT] * 2
    finally:
        again.shutdown()
