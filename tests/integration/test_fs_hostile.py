"""Hostile files in the fs tier's tree (issue 17): whoever can write into the tree cannot make the
tier touch anything outside its root, serve bytes it did not write, or hang.

Real files, FIFOs, symlinks and hard links in a real directory; every assertion is about the disk
outside the root or about bytes handed to the engine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import fs_helpers as h  # tests/integration is on pytest's pythonpath

from kvtier.tiers.fs.accounting import ACCOUNTING_FILE

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
