"""Hostile files in the fs tier's tree (issue 17): whoever can write into the tree cannot make the
tier touch anything outside its root, serve bytes it did not write, or hang.

Real files, FIFOs, symlinks and hard links in a real directory; every assertion is about the disk
outside the root or about bytes handed to the engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import stat
import threading
import time
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath
import pytest

from kvtier.errors import ConfigError
from kvtier.keys import BlockKey
from kvtier.tiers.fs import FsTier
from kvtier.tiers.fs.accounting import ACCOUNTING_FILE
from kvtier.tiers.fs.io import write_block

BLOCK = 8192


def _outside(tmp_path: Path) -> dict[str, bytes]:
    """Files outside the root the attacker aims at; returns their path -> content."""
    out = tmp_path / "outside"
    out.mkdir(exist_ok=True)
    files = {}
    for name in ("victim", "x.1", "12-deadbeef.1"):
        p = out / name
        p.write_bytes(b"precious " + name.encode())
        os.chmod(p, 0o600)
        files[str(p)] = p.read_bytes()
    return files


def _unchanged(files: dict[str, bytes]) -> bool:
    return all(os.path.isfile(p) and Path(p).read_bytes() == b for p, b in files.items())


def _forge_accounting(ns_dir: str, outside: dict[str, bytes]) -> None:
    acct = Path(ns_dir, ACCOUNTING_FILE)
    doc = json.loads(acct.read_text() or "{}") if acct.exists() else {}
    procs = doc.setdefault("procs", {})
    doc.setdefault("published", 0)
    victim = next(iter(outside))
    rel = os.path.relpath(victim, os.path.join(ns_dir, "procs"))
    for token in (victim, rel, "../../../" + os.path.basename(victim)):
        procs[token] = {"pid": 1, "reserved": 5, "intent": [["pub", victim, 7], ["del", victim, 9]]}
    # A token of the right shape whose intents point outside: the token is dropped, the intents
    # are never probed.
    procs["12-deadbeef"] = {"pid": 1, "reserved": 0, "intent": [["del", victim, 1 << 40], ["pub", rel, 3]]}
    acct.write_text(json.dumps(doc))


def test_forged_accounting_tokens_and_intents_never_touch_files_outside_the_root(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    root = tmp_path / "root"
    primary = h.aligned_primary(4, BLOCK)
    tier = h.make_tier(primary, root)
    ns_dir = tier.layout.ns_dir
    tier.shutdown()
    _forge_accounting(ns_dir, outside)
    # A procs/ entry that is a symlink to the victim, and one that is a FIFO (opening it must not hang).
    os.symlink(next(iter(outside)), os.path.join(ns_dir, "procs", "99-00000000"))
    os.mkfifo(os.path.join(ns_dir, "procs", "98-00000000"))
    t0 = time.monotonic()
    tier = h.make_tier(primary, root)
    assert tier.wait_scan(30)
    usage = tier.usage()
    tier.shutdown()
    assert time.monotonic() - t0 < 20
    assert _unchanged(outside)
    assert set(usage.procs) <= {tier.accounting.token}
    assert usage.published == 0  # the forged 2^40-byte "del" intent was not applied
    assert tier.accounting.forged >= 3


def _snapshot(d: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _, files in os.walk(d):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p) and os.path.isfile(p):
                out[p] = Path(p).read_bytes()
    return out


def _within(seconds: float, fn: object) -> object:
    """Run ``fn`` in a thread; fail if it has not returned after ``seconds`` (a hang)."""
    box: list[object] = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)  # type: ignore[operator]
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} still blocked after {seconds}s"
    return box[0] if box else None


def test_fifo_symlink_hardlink_and_symlinked_shard_are_misses_and_nothing_outside_changes(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"precious")
    root = tmp_path / "root"
    primary = h.aligned_primary(8, BLOCK)
    tier = h.make_tier(primary, root, max_bytes=6 * (4096 + BLOCK))
    layout = tier.layout
    keys = [h.key_of(f"k{i}") for i in range(4)]
    assert h.store(tier, primary, keys).success
    fifo_k, link_k, hard_k, dir_k = keys
    os.unlink(layout.path_of(fifo_k))
    os.mkfifo(layout.path_of(fifo_k))
    os.unlink(layout.path_of(link_k))
    os.symlink(outside / "victim", layout.path_of(link_k))
    os.unlink(layout.path_of(hard_k))
    os.link(outside / "victim", layout.path_of(hard_k))
    # The top-level shard of dir_k becomes a link to a directory outside the root.
    top = os.path.dirname(layout.dir_of(dir_k))
    os.rename(top, outside / "moved")
    os.symlink(outside / "moved", top)
    before = _snapshot(outside)

    res = _within(10, lambda: h.load(tier, primary, [fifo_k, link_k, hard_k], timeout=10))
    assert res is not None and res.transferred([fifo_k, link_k, hard_k]) == []  # type: ignore[attr-defined]
    assert tier.stats.corrupt >= 3
    # New blocks of that shard, and enough stores to evict dir_k: nothing lands or goes outside.
    want_top = layout.shard_of(dir_k) >> 4
    same = [k for k in (h.key_of(f"n{i}") for i in range(5000)) if layout.shard_of(k) >> 4 == want_top][:3]
    assert len(same) == 3
    assert not h.store(tier, primary, same).transferred(same)  # refused: never stored through the link
    for i in range(3):
        h.store(tier, primary, [h.key_of(f"fill{i}-{j}") for j in range(8)])
    _within(20, tier.shutdown)
    assert _snapshot(outside) == before
    assert (outside / "victim").read_bytes() == b"precious"
    # Not provably the tier's files: left in place.
    assert os.path.islink(layout.path_of(link_k))
    assert stat.S_ISFIFO(os.lstat(layout.path_of(fifo_k)).st_mode)


def test_a_root_others_can_write_is_refused_in_one_line_unless_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary = h.aligned_primary(2, BLOCK)
    for mode, where in ((0o777, "root"), (0o770, "ns")):
        root = tmp_path / f"r{mode:o}"
        ns = root / h.NAMESPACE
        ns.mkdir(parents=True)
        os.chmod(root if where == "root" else ns, mode)
        with pytest.raises(ConfigError) as err:
            h.make_tier(primary, root)
        msg = str(err.value)
        assert "\n" not in msg and "writable" in msg and "shared_root" in msg
    monkeypatch.delenv("KVTIER_FS_SECRET", raising=False)
    with pytest.raises(ConfigError, match="secret"):
        h.make_tier(primary, tmp_path / "r777", shared_root=True)
    monkeypatch.setenv("KVTIER_FS_SECRET", "s3cret-s3cret-s3cret")
    tier = h.make_tier(primary, tmp_path / "r777", shared_root=True)
    assert "s3cret" not in repr(tier.config_info()) + repr(vars(tier))
    tier.shutdown()
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef-file")
    os.chmod(secret, 0o644)
    with pytest.raises(ConfigError, match="0600"):
        h.make_tier(primary, tmp_path / "r777", shared_root=True, secret_file=str(secret))


def test_planted_valid_looking_blocks_are_never_served_on_a_shared_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVTIER_FS_SECRET", "the-right-secret-0123")
    root = tmp_path / "root"
    primary = h.aligned_primary(4, BLOCK)
    tier = h.make_tier(primary, root, shared_root=True)
    layout = tier.layout
    good, overwritten, planted = h.key_of("good"), h.key_of("over"), h.key_of("planted")
    assert h.store(tier, primary, [good, overwritten]).success
    tier.shutdown()
    evil = memoryview(bytearray(b"EVIL" * (BLOCK // 4)))
    # The attacker writes well-formed blocks (right header, key, namespace, checksum) without the
    # secret: one new key, one replacing a stored block.
    for k in (overwritten, planted):
        os.makedirs(layout.dir_of(k), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(layout.path_of(k))
        write_block(layout.path_of(k), k, evil, layout.ns_tag, direct=False, fsync=False)
    tier = h.make_tier(primary, root, shared_root=True, verify="never")
    assert tier.wait_scan(30)
    res = h.load(tier, primary, [good, overwritten, planted])
    served = res.transferred([good, overwritten, planted])
    assert served == [good]
    assert primary.block(0).tobytes() == h.payload_of(good, BLOCK).tobytes()
    assert tier.stats.corrupt >= 1
    tier.shutdown()
    # A tier with another secret serves none of the blocks.
    monkeypatch.setenv("KVTIER_FS_SECRET", "another-secret-45678")
    tier = h.make_tier(primary, root, shared_root=True)
    assert tier.wait_scan(30)
    assert h.load(tier, primary, [good]).transferred([good]) == []
    tier.shutdown()


def _plant(
    rng: random.Random, tier: FsTier, outside: Path, stored: list[BlockKey], shared: bool
) -> list[BlockKey]:
    """Drop hostile objects into a live tier's tree; returns the keys whose block was replaced or
    planted (none of them may ever be served). On a private root only this user could write a
    well-formed block (the root is refused otherwise), so planted blocks there belong to another
    uid; on a shared root they are this user's too and only the MAC tells them apart."""
    layout = tier.layout
    evil = memoryview(bytearray(b"EVIL" * (BLOCK // 4)))
    poisoned: list[BlockKey] = []
    for i in range(12):
        kind = rng.choice(["fifo", "link_file", "link_dir", "hard", "owner", "planted"])
        if kind == "planted" and not shared:
            kind = "owner"
        if kind == "owner" and os.geteuid() != 0:
            kind = "fifo"  # chown needs root; the other kinds still run
        key = rng.choice(stored) if rng.random() < 0.5 else h.key_of(f"planted-{i}")
        path = layout.path_of(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "link_file":
            os.symlink(outside / "victim", path)
        elif kind == "link_dir":
            os.symlink(outside, path)
        elif kind == "hard":
            os.link(outside / "victim", path)
        else:  # a well-formed block with the EVIL payload (right key, namespace and checksum)
            write_block(path, key, evil, layout.ns_tag, direct=False, fsync=False)
            if kind == "owner":
                os.chown(path, 4242, 4242)
        poisoned.append(key)
    for name in ("procs", "tmp", f"tmp/{rng.randrange(16):x}"):  # tmp/<hex>: a temp-file shard
        os.symlink(outside / "victim", Path(layout.ns_dir, name, f"{rng.randrange(1 << 20)}-0000abcd.1"))
        os.mkfifo(Path(layout.ns_dir, name, f"{rng.randrange(1 << 20)}-0000abce.2"))
    os.symlink(outside, Path(layout.ns_dir, "zz"))
    return poisoned


@pytest.mark.parametrize(("seed", "shared"), [(1, False), (2, False), (3, True), (4, True)])
def test_seeded_hostile_tree_nothing_outside_changes_nothing_planted_served_no_call_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, shared: bool
) -> None:
    """The key test of issue 17: FIFOs, symlinks to files and directories, hard links, foreign-owned
    and planted well-formed blocks and forged accounting entries are dropped into a live tier's
    root; then the tier loads, stores, evicts, restarts and shuts down."""
    rng = random.Random(seed)
    monkeypatch.setenv("KVTIER_FS_SECRET", "hostile-tree-secret-0123")
    opts: dict[str, object] = {"max_bytes": 24 * (4096 + BLOCK)}
    if shared:
        opts["shared_root"] = True
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"precious")
    (outside / "sub").mkdir()
    (outside / "sub" / "deep").write_bytes(b"deep")
    root = tmp_path / "root"
    primary = h.aligned_primary(8, BLOCK)
    tier = h.make_tier(primary, root, **opts)
    stored = [h.key_of(f"s{seed}-{i}") for i in range(16)]
    for lo in range(0, 16, 8):
        assert h.store(tier, primary, stored[lo : lo + 8]).success
    poisoned = _plant(rng, tier, outside, stored, shared)
    _forge_accounting(tier.layout.ns_dir, {str(outside / "victim"): b"precious"})
    before = _snapshot(outside)
    for step in range(2):  # the live tier, then a restart that scans the hostile tree
        if step == 1:
            _within(30, tier.shutdown)
            tier = _within(30, lambda: h.make_tier(primary, root, **opts))  # type: ignore[assignment]
            assert tier.wait_scan(30)
        for lo in range(0, 16, 8):
            keys = stored[lo : lo + 8]
            res = _within(15, lambda t=tier, keys=keys: h.load(t, primary, keys, timeout=15))
            for slot, k in enumerate(keys):
                if k in res.transferred(keys):  # type: ignore[attr-defined]
                    assert k not in poisoned
                    assert primary.block(slot).tobytes() == h.payload_of(k, BLOCK).tobytes()
        planted = [k for k in poisoned if k not in stored]
        if planted:
            res = _within(15, lambda t=tier, p=planted: h.load(t, primary, p[:8], timeout=15))
            assert res.transferred(planted[:8]) == []  # type: ignore[attr-defined]
        # Stores and evictions (max_bytes is 24 blocks) around the hostile entries.
        for r in range(4):
            _within(
                15,
                lambda t=tier, r=r, s=step: h.store(
                    t, primary, [h.key_of(f"f{seed}-{s}-{r}-{j}") for j in range(8)]
                ),
            )
    _within(30, tier.shutdown)
    assert _snapshot(outside) == before


def test_a_cached_leaf_shard_renamed_away_and_replaced_by_a_link_receives_nothing(tmp_path: Path) -> None:
    """Shard descriptors are cached (bench: 4 KiB stores); a leaf renamed outside after the cache
    warmed and replaced by a link to it must be noticed at the next use, not written through."""
    outside = tmp_path / "outside"
    outside.mkdir()
    primary = h.aligned_primary(8, BLOCK)
    tier = h.make_tier(primary, tmp_path / "root", precreate_dirs=False)
    layout = tier.layout
    first = h.key_of("warm")
    assert h.store(tier, primary, [first]).success  # caches the shard of `first`
    leaf = layout.dir_of(first)
    os.rename(leaf, outside / "leaf")
    os.symlink(outside / "leaf", leaf)
    before = _snapshot(outside)
    want = layout.shard_of(first)
    same = [k for k in (h.key_of(f"s{i}") for i in range(20000)) if layout.shard_of(k) == want][:2]
    assert len(same) == 2
    assert not h.store(tier, primary, same).transferred(same)
    assert h.load(tier, primary, [first]).transferred([first]) == []  # read through the link: never
    _within(20, tier.shutdown)
    assert _snapshot(outside) == before


def test_shared_root_blocks_tagged_by_earlier_versions_still_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks are tagged with keyed BLAKE3 now; those an earlier version (or a host without the
    ``shared`` extra) tagged with keyed BLAKE2b still verify, with the same secret only."""
    from kvtier.tiers.fs import trust

    monkeypatch.setenv("KVTIER_FS_SECRET", "the-right-secret-0123")
    mac = trust.load_secret("root_dir", "KVTIER_FS_SECRET", None)
    assert mac.tag(b"h", b"p") != mac.legacy_tag(b"h", b"p")  # two algorithms, two keys
    assert mac.check(b"h", b"p", mac.legacy_tag(b"h", b"p")) and not mac.check(
        b"h", b"q", mac.tag(b"h", b"p")
    )
    root = tmp_path / "root"
    primary = h.aligned_primary(4, BLOCK)
    with monkeypatch.context() as m:
        m.setattr(trust, "blake3", None)  # written as by a host without BLAKE3 (keyed BLAKE2b)
        tier = h.make_tier(primary, root, shared_root=True)
        old = [h.key_of("old-0"), h.key_of("old-1")]
        assert h.store(tier, primary, old).success
        tier.shutdown()
    tier = h.make_tier(primary, root, shared_root=True)
    try:
        assert tier.wait_scan(30)
        assert h.load(tier, primary, old).success
        assert primary.block(1).tobytes() == h.payload_of(old[1], BLOCK).tobytes()
    finally:
        tier.shutdown()
    monkeypatch.setenv("KVTIER_FS_SECRET", "another-secret-45678")
    tier = h.make_tier(primary, root, shared_root=True)
    try:
        assert tier.wait_scan(30)
        assert h.load(tier, primary, old).transferred(old) == []
    finally:
        tier.shutdown()
