"""``kvtier check CONFIG``: validate a config and prove every configured tier works.

CONFIG may also be vLLM's whole ``--kv-transfer-config`` object: its kvtier tiers (the
``KvtierTier`` entries) are checked, vLLM's own tiers are listed and left to vLLM.

Steps: load and validate the config; run the checks ``Engine`` runs first
(:mod:`kvtier.engine.preflight`); build the spec, the primary tier's policy and every secondary
tier (out-of-tree ones too, through the registry and the ``plugins`` trust boundary; every entry is
checked before any is built, so a bad later entry leaves nothing on disk) over a small heap buffer
of two slots; round-trip one random block through each tier (store, lookup, load, compare
bytes); shut the tiers down and print a table.

The probe block is stored with a random key under a namespace of its own per block size
(``kvtier-check-<block_bytes>``, :func:`check_namespace`), so it never collides with serving data and
re-checking a root with another ``block_bytes`` works; afterwards a tier that exposes its namespace
directory (``config_info()["ns_dir"]``, the ``fs`` tier) has that directory removed, so a check
leaves nothing behind.

The config is resolved through :mod:`kvtier.config.layers` (defaults < CONFIG or ``KVTIER_CONFIG`` <
``KVTIER_*`` environment); ``--show-config`` prints the merged values and their origins, secrets
redacted, and checks nothing.

Exit codes: 0 every tier round-tripped; 1 a tier failed its round trip; 2 bad config (one line
``ErrorType: message`` naming the key).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kvtier.cli import options
from kvtier.cli.args import duration

__all__ = [
    "CHECK_NAMESPACE",
    "DESCRIPTION",
    "HELP",
    "TierCheck",
    "add_arguments",
    "check_config",
    "check_namespace",
    "run",
]

#: Prefix of the probe namespaces (one per block size).
CHECK_NAMESPACE = "kvtier-check"


def check_namespace(block_bytes: int) -> str:
    """The probe namespace for ``block_bytes`` (a persistent tier records one block size per namespace)."""
    return f"{CHECK_NAMESPACE}-{block_bytes}"


@dataclass
class TierCheck:
    """Outcome of one tier's round trip."""

    name: str
    type: str
    target: str
    medium: str
    ok: bool = False
    store_seconds: float | None = None
    load_seconds: float | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` entry: every field, in declaration order."""
        return asdict(self)


#: The command's line in ``kvtier --help``; :data:`DESCRIPTION` opens ``kvtier check --help``.
HELP = "validate a config, build every tier and round-trip one block through each"
DESCRIPTION = (
    "Validate CONFIG (.json/.yaml file or a JSON string), build the spec, policy and every "
    "secondary tier, and round-trip one block through each. Exit 0 ok, 1 a tier failed, "
    "2 bad config."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``check`` options to its parser (built by :func:`kvtier.cli.main.build_parser`)."""
    p.add_argument(
        "config",
        metavar="CONFIG",
        nargs="?",
        help="config file (.json, .yaml) or a JSON string (default: $KVTIER_CONFIG, else defaults)",
    )
    p.add_argument(
        "--show-config",
        action="store_true",
        help="print the merged config with each value's origin (secrets redacted) and exit",
    )
    options.add_json(p, "print one JSON object instead of a table")
    p.add_argument("--timeout", type=duration, default=30.0, help="seconds to wait for each tier job")


def _round_trip(tier: Any, rows: Any, block_bytes: int, timeout: float, check: TierCheck) -> None:
    import numpy as np

    from kvtier.jobs import TransferJob, wait_for_job
    from kvtier.keys import BlockKey, LookupResult

    key = BlockKey(f"kvtier-check/{uuid.uuid4().hex}".encode())
    payload = np.random.default_rng().integers(0, 256, block_bytes, dtype=np.uint8)
    rows[0, :block_bytes] = payload
    rows[1, :block_bytes] = 0
    t0 = time.perf_counter()
    tier.submit_store(TransferJob(1, [key], np.array([0], dtype=np.int32)))
    stored = wait_for_job(tier, 1, timeout)
    check.store_seconds = time.perf_counter() - t0
    if not stored.success:
        raise RuntimeError(f"store job failed: {stored.error or 'no reason given'}")
    deadline = time.monotonic() + timeout
    while (answer := tier.lookup(key)) is LookupResult.RETRY and time.monotonic() < deadline:
        time.sleep(0.005)
    if answer is not LookupResult.HIT:
        raise RuntimeError(f"lookup after a successful store answered {answer.name}")
    t0 = time.perf_counter()
    tier.submit_load(TransferJob(2, [key], np.array([1], dtype=np.int32), is_promotion=True))
    loaded = wait_for_job(tier, 2, timeout)
    check.load_seconds = time.perf_counter() - t0
    if not loaded.success:
        raise RuntimeError(f"load job failed: {loaded.error or 'no reason given'}")
    if not np.array_equal(rows[1, :block_bytes], payload):
        raise RuntimeError("loaded bytes differ from the stored block")
    check.ok = True


def _check_installed_vllm(raw: Mapping[str, Any]) -> None:
    """Keys of a ``--kv-transfer-config`` the installed vLLM would refuse (none without vLLM)."""
    from kvtier.config.vllm import check_vllm_version_keys
    from kvtier.integrations.vllm import compat

    if compat.VLLM_VERSION is None:
        return
    check_vllm_version_keys(raw, failure_threshold=compat.FAILED_STORES_FEED_BACKPRESSURE)


def check_config(source: Any, *, timeout: float = 30.0) -> dict[str, Any]:
    """Run the check; returns the report ``kvtier check --json`` prints.

    Raises:
        ConfigError / PluginError: the config is invalid or names a plug-in that cannot be loaded.
    """
    import numpy as np

    from kvtier.cli.main import error_line
    from kvtier.config import load_config
    from kvtier.config.vllm import vllm_owned_tiers
    from kvtier.engine.build import config_namespace
    from kvtier.engine.preflight import preflight
    from kvtier.plugins import create_spec, tier_contexts
    from kvtier.specs.base import OffloadingSpec

    cfg = load_config(source)
    if isinstance(cfg.raw, Mapping):
        _check_installed_vllm(cfg.raw)
    preflight(cfg)  # what Engine checks first; the spec checks every tier before building any
    spec: OffloadingSpec = create_spec(cfg)
    policy = spec.create_policy(max(1, spec.num_primary_slots))
    # Two slots are enough for a round trip; the real buffer is never allocated here.
    rows = np.zeros((2, cfg.row_stride), dtype=np.uint8)
    contexts = tier_contexts(cfg, namespace=check_namespace(cfg.block_bytes))
    created = _missing_dirs(cfg)  # what building the tiers will create: removed again at the end
    try:
        tiers = spec.create_tiers(rows.data, contexts)
    except BaseException:
        _remove_empty(created)
        raise
    checks: list[TierCheck] = []
    try:
        for tc, tier in zip(cfg.secondary_tiers, tiers, strict=False):
            cls = type(tier)
            check = TierCheck(tier.name, tc.type, f"{cls.__module__}:{cls.__qualname__}", cls.medium)
            checks.append(check)
            try:
                check_peers = getattr(tier, "check_peers", None)
                if getattr(tier, "stores_nothing", False) and callable(check_peers):
                    check_peers(config_namespace(cfg))  # p2p: handshake with its peers instead
                    check.ok = True
                else:
                    _round_trip(tier, rows, cfg.block_bytes, timeout, check)
            except Exception as exc:
                # A tier that fails its probe is reported (and makes the exit code 1), never a crash.
                check.error = error_line(exc)
    finally:
        for tier in tiers:
            try:
                tier.shutdown()
            except Exception as exc:
                for check in checks:
                    if check.name == tier.name and check.error is None:
                        check.ok, check.error = False, f"shutdown failed: {error_line(exc)}"
            _remove_probe_namespace(tier, check_namespace(cfg.block_bytes))
        _remove_empty(created)
    spec_cls, policy_cls = type(spec), type(policy)
    return {
        "ok": all(c.ok for c in checks),
        "spec": {"name": cfg.spec_name, "target": f"{spec_cls.__module__}:{spec_cls.__qualname__}"},
        "policy": {
            "name": cfg.eviction_policy,
            "target": f"{policy_cls.__module__}:{policy_cls.__qualname__}",
            "capacity": policy.capacity,
        },
        "primary": {
            "slots": spec.num_primary_slots,
            "block_bytes": cfg.block_bytes,
            "row_stride": cfg.row_stride,
            "backing": cfg.primary_backing,
        },
        "tiers": [c.as_dict() for c in checks],
        # vLLM's --kv-transfer-config also lists tiers vLLM builds itself; kvtier leaves them to vLLM.
        "vllm_tiers": vllm_owned_tiers(cfg.raw),
    }


def _missing_dirs(cfg: Any) -> list[str]:
    """The directories a tier's ``root_dir`` names that do not exist yet (deepest first): the
    check leaves nothing behind that was not there before it."""
    import os

    out: list[str] = []
    for tc in cfg.secondary_tiers:
        root = tc.options.get("root_dir")
        if not isinstance(root, str) or not root.strip():
            continue
        p = os.path.realpath(os.path.expanduser(root))
        while not os.path.lexists(p) and p not in out:
            out.append(p)
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
    return sorted(out, key=lambda d: d.count(os.sep), reverse=True)


def _remove_empty(dirs: list[str]) -> None:
    """``rmdir`` each of ``dirs`` (deepest first); one that holds anything is left alone."""
    import contextlib
    import os

    for d in dirs:
        with contextlib.suppress(OSError):  # not empty (something else wrote there) or gone
            os.rmdir(d)


def _remove_probe_namespace(tier: Any, namespace: str) -> None:
    """Delete the probe namespace directory of a shut-down tier, if it says where it is."""
    import shutil
    from pathlib import Path

    try:
        ns_dir = tier.config_info().get("ns_dir")
    except Exception:
        return
    # Only a directory that is one of ours by name: never anything a misreporting tier points at.
    if isinstance(ns_dir, str) and Path(ns_dir).name == namespace:
        shutil.rmtree(ns_dir, ignore_errors=True)


def _fmt_seconds(s: float | None) -> str:
    return "-" if s is None else f"{s * 1000:.2f} ms"


def run(args: argparse.Namespace) -> int:
    from kvtier.cli.main import print_table
    from kvtier.config.layers import resolve_config

    resolved = resolve_config(args.config)
    if args.show_config:
        return _show_config(resolved, args.json)
    report = check_config(resolved.config, timeout=args.timeout)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        p, pol, spec = report["primary"], report["policy"], report["spec"]
        source = resolved.file or ("(JSON string)" if args.config else "(defaults)")
        print(f"config: {source}")
        print(f"spec:   {spec['name']} ({spec['target']})")
        print(f"policy: {pol['name']} ({pol['target']}), capacity {pol['capacity']} blocks")
        print(f"primary: {p['slots']} slots x {p['block_bytes']} bytes ({p['backing']})")
        rows = [
            (
                t["name"],
                t["type"],
                t["target"],
                t["medium"],
                _fmt_seconds(t["store_seconds"]),
                _fmt_seconds(t["load_seconds"]),
                "ok" if t["ok"] else f"FAIL {t['error']}",
            )
            for t in report["tiers"]
        ]
        if rows:
            print_table(
                "secondary tiers", ["tier", "type", "target", "medium", "store", "load", "round trip"], rows
            )
        else:
            print("secondary tiers: none configured (primary tier only)")
        if report["vllm_tiers"]:
            print(f"vLLM's own tiers (built by vLLM, not checked): {', '.join(report['vllm_tiers'])}")
        print("OK" if report["ok"] else "FAILED: a tier did not round-trip its probe block")
    return 0 if report["ok"] else 1


def _show_config(resolved: Any, as_json: bool) -> int:
    from kvtier.cli.main import print_table

    rows = resolved.show()
    if as_json:
        shown = {k: {"value": v if v == "<redacted>" else json.loads(v), "origin": o} for k, v, o in rows}
        print(json.dumps(shown, indent=2))  # fmt: skip
    else:
        title = "merged config (defaults < file < KVTIER_* env < arguments)"
        print_table(title, ["key", "value", "origin"], rows)
    return 0
