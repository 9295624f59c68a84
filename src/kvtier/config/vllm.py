"""vLLM's configuration as users write it, read in kvtier's terms. Imports no vLLM.

Shared by kvtier's config loader, ``kvtier check`` and the vLLM adapter
(:mod:`kvtier.integrations.vllm`), so the three agree on every key:

* :func:`is_kv_transfer_config` / :func:`kvtier_mapping`: the object a user passes to
  ``vllm serve --kv-transfer-config`` (``kv_connector``, ``kv_connector_extra_config`` with
  ``secondary_tiers``) becomes the kvtier config of the kvtier tiers in it; vLLM's own tiers are
  listed by :func:`vllm_owned_tiers` and left to vLLM.
* :func:`split_adapter_entry`: one ``{"type": "KvtierTier", "module_path": ...}`` entry of vLLM's
  ``secondary_tiers`` -> the kvtier tier entry it builds and the keys the adapter itself consumes.
* :func:`explain_vllm_key`: what vLLM means by a key kvtier's own config does not take, and what to
  write instead (a one-line :class:`~kvtier.errors.ConfigError`).
* :func:`fs_threads`: vLLM's fs keys ``n_read_threads``/``n_write_threads`` in kvtier's fs terms.
* :func:`inline_secrets`: which keys of an entry hold a secret in the JSON itself (vLLM logs it).
* :func:`spec_block`: the ``kvtier`` block of a ``KvtierOffloadingSpec`` config
  (:mod:`kvtier.integrations.vllm.spec`), with vLLM's keys refused where vLLM decides them.
* :func:`vllm_namespace`: kvtier's key namespace of a vLLM offloading config, so a model, KV layout,
  block size or dtype change never reuses old blocks.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kvtier.config.files import read_config_file
from kvtier.errors import ConfigError
from kvtier.keys import KeyNamespace, make_namespace

__all__ = [
    "ADAPTER_CLASS",
    "ADAPTER_MODULE",
    "AdapterOptions",
    "explain_vllm_key",
    "fs_threads",
    "inline_secrets",
    "is_adapter_entry",
    "is_kv_transfer_config",
    "is_spec_config",
    "kvtier_mapping",
    "spec_block",
    "split_adapter_entry",
    "vllm_namespace",
    "vllm_owned_tiers",
]

ADAPTER_MODULE = "kvtier.integrations.vllm"
ADAPTER_CLASS = "KvtierTier"
EXTRA = "kv_connector_extra_config"
TIERING_SPEC = "TieringOffloadingSpec"
CONNECTOR = "OffloadingConnector"
SPEC_MODULE = "kvtier.integrations.vllm"
SPEC_CLASS = "KvtierOffloadingSpec"
# Earlier configs name the spec's former module; it still loads.
SPEC_MODULES = (SPEC_MODULE, "kvtier.integrations.vllm_spec")
# kvtier's engine as vLLM's manager: on a GPU (vLLM's own copy worker) and on vLLM's CPU backend.
SPEC_CLASSES = (SPEC_CLASS, "KvtierCPUOffloadingSpec")
# vLLM's tiering (its CPU primary tier + secondary_tiers) on vLLM's CPU backend, kvtier's copy worker.
CPU_TIERING_SPEC = "KvtierCPUTieringSpec"
KVTIER_KEY = "kvtier"
_WHERE = f"{EXTRA}.{KVTIER_KEY}"
# kvtier keys the spec derives from vLLM: what to write instead.
_SET_BY_VLLM = {
    "cpu_bytes_to_use": "set it at the top of kv_connector_extra_config (vLLM sizes its region from it)",
    "block_bytes": "remove it: a block is one vLLM chunk (vLLM's block_size / blocks_per_chunk)",
    "primary_backing": "remove it: the primary buffer is vLLM's shared offload region",
    "shm_name": "remove it: the primary buffer is vLLM's shared offload region",
    "primary_row_pad": "remove it: vLLM's shared offload region fixes the row layout",
    "model": "remove it: the namespace comes from vLLM's model, KV layout and chunk size",
}
# vLLM's keys for its own primary tier / tiering manager, which the spec does not build.
_VLLM_ONLY = (
    "eviction_policy",
    "cache_policy_module_path",
    "secondary_tiers",
    "store_threshold",
    "max_tracker_size",
    "backpressure",
    "tier_poll_interval_s",
)

# Fields of vLLM 0.33's KVTransferConfig (vllm/config/kv_transfer.py): the whole
# --kv-transfer-config object. Everything but the extra config is vLLM's business.
_KV_TRANSFER_KEYS = (
    "kv_connector",
    "engine_id",
    "kv_buffer_device",
    "kv_role",
    "kv_port",
    EXTRA,
    "kv_connector_module_path",
    "enable_permute_local_kv",
    "kv_load_failure_policy",
)

# vLLM's fs tier defaults (tiering/fs/manager.py): 16 read-priority and 16 write-priority threads.
_VLLM_FS_THREADS = 16

_BLOCK_HINT = (
    'kvtier\'s own config sizes blocks in bytes: write "block_bytes" (the bytes of one block of your '
    'model, e.g. "2MiB"); inside vLLM keep it in kv_connector_extra_config, where the KvtierTier '
    "entry takes its block size from vLLM"
)
# key -> (what vLLM means by it, what to write in kvtier's own config).
_VLLM_TOP_KEYS: dict[str, tuple[str, str]] = {
    "block_size": ("tokens per offloaded chunk, a multiple of the GPU block size", _BLOCK_HINT),
    "blocks_per_chunk": ("GPU blocks per offloaded chunk", _BLOCK_HINT),
    "tier_poll_interval_s": (
        "the pause of vLLM's tier-poll thread",
        "remove it: kvtier's engine polls its tiers on every call",
    ),
    "backpressure": (
        "the back-pressure detector vLLM's tiering manager consults before each store",
        "remove it: kvtier tiers drop stores themselves (a tier's backpressure marks); inside vLLM keep it",
    ),
    "store_threshold": (
        "how many times a block is seen before CPUOffloadingSpec stores it",
        'write "write_policy": "after_hits" with "write_after_hits"',
    ),
    "max_tracker_size": (
        "how many block hashes CPUOffloadingSpec tracks for store_threshold",
        "remove it: kvtier's after_hits policy needs no bound",
    ),
    "offload_prompt_only": (
        "whether vLLM offloads only prompt blocks",
        "remove it: kvtier stores what its caller gives it",
    ),
    "self_describing_kv_events": ("vLLM's KV-event payload format", "remove it: kvtier emits no KV events"),
    "canonical_layout": ("vLLM's per-layer host byte layout", "remove it: the layout is vLLM's business"),
    "sync_load_budget_bytes": ("vLLM's per-step synchronous load budget", "remove it"),
}
_VLLM_TIER_KEYS: dict[str, tuple[str, str]] = {
    "enable_kv_events": (
        "publish KV events for the blocks the tier stores and drops",
        "remove it from kvtier's own config; inside vLLM put it on the KvtierTier entry (vLLM "
        "publishes them with --kv-events-config)",
    ),
    "locality": (
        "LOCAL or REMOTE: picks back-pressure watermarks and per-request tier filters",
        "remove it from kvtier's own config; inside vLLM put it on the KvtierTier entry",
    ),
    "custom_param": (
        "a dummy option of vLLM's example tier that only shows how tier options are passed",
        "remove it (kvtier's example tier takes capacity_blocks)",
    ),
    "backpressure": (
        "the back-pressure detector of this tier",
        "remove it from kvtier's own config; inside vLLM put it on the KvtierTier entry",
    ),
}


def explain_vllm_key(key: str, path: str, *, tier: bool = False) -> ConfigError | None:
    """A ConfigError saying what vLLM means by ``key`` and what to write, or ``None`` (not vLLM's).

    ``path`` is the key path prefix (``""`` or ``"secondary_tiers[1]."``); ``tier`` selects the
    table of tier-entry keys instead of top-level keys.
    """
    table = _VLLM_TIER_KEYS if tier else _VLLM_TOP_KEYS
    if key not in table:
        return None
    meaning, instead = table[key]
    return ConfigError(f"{path}{key}", f"vLLM's {key!r} means {meaning}; {instead}")


def fs_threads(options: Mapping[str, Any], path: str) -> dict[str, Any]:
    """``options`` of an fs tier with vLLM's ``n_read_threads``/``n_write_threads`` turned into
    kvtier's ``threads``.

    vLLM's fs tier runs ``n_read_threads`` read-priority plus ``n_write_threads`` write-priority I/O
    threads (16 each by default); kvtier's fs tier has one pool of ``threads`` in which loads go
    first, so the same total is ``threads = n_read_threads + n_write_threads``.
    """
    given = [k for k in ("n_read_threads", "n_write_threads") if k in options]
    if not given:
        return dict(options)
    if "threads" in options:
        raise ConfigError(
            f"{path}{given[0]}",
            "give either kvtier's threads or vLLM's n_read_threads/n_write_threads, not both",
        )
    out = {k: v for k, v in options.items() if k not in given}
    total = 0
    for key in ("n_read_threads", "n_write_threads"):
        value = options.get(key, _VLLM_FS_THREADS)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"{path}{key}", f"expected an integer >= 1 (vLLM's thread count), got {value!r}"
            )
        total += value
    out["threads"] = total
    return out


def is_kv_transfer_config(raw: Mapping[str, Any]) -> bool:
    """Whether ``raw`` is vLLM's ``--kv-transfer-config`` object rather than a kvtier config."""
    return "kv_connector" in raw or EXTRA in raw


def _expect_mapping(value: Any, path: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"expected {what}, got {type(value).__name__} {value!r}")
    return value


def is_adapter_entry(entry: Mapping[str, Any]) -> bool:
    """Whether one entry of vLLM's ``secondary_tiers`` loads kvtier's adapter."""
    return entry.get("module_path") == ADAPTER_MODULE or entry.get("type") == ADAPTER_CLASS


def _extra(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    for key in raw:
        if key not in _KV_TRANSFER_KEYS:
            close = difflib.get_close_matches(str(key), _KV_TRANSFER_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                str(key),
                f"not a key of vLLM's --kv-transfer-config{hint}; valid: {', '.join(_KV_TRANSFER_KEYS)}",
            )
    connector = raw.get("kv_connector")
    if connector != CONNECTOR:
        raise ConfigError(
            "kv_connector",
            f'kvtier plugs into vLLM\'s offloading connector: write "kv_connector": "{CONNECTOR}", '
            f"got {connector!r}",
        )
    if EXTRA not in raw:
        raise ConfigError(EXTRA, 'missing; it holds "spec_name", "cpu_bytes_to_use" and "secondary_tiers"')
    extra = _expect_mapping(raw[EXTRA], EXTRA, "an object")
    spec = extra.get("spec_name", "CPUOffloadingSpec")
    if spec != TIERING_SPEC and extra.get("spec_module_path") is None:
        raise ConfigError(
            f"{EXTRA}.spec_name",
            f'vLLM reads secondary_tiers only with "spec_name": "{TIERING_SPEC}", got {spec!r}',
        )
    cpu = extra.get("cpu_bytes_to_use")
    if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 1:
        # vLLM does int(cpu_bytes_to_use): "8GiB" would stop vLLM at start-up.
        raise ConfigError(
            f"{EXTRA}.cpu_bytes_to_use",
            f"vLLM needs the primary tier's size as an integer byte count (e.g. 8589934592), got {cpu!r}",
        )
    tiers = extra.get("secondary_tiers", [])
    if not isinstance(tiers, list):
        raise ConfigError(f"{EXTRA}.secondary_tiers", f"expected a list of tier objects, got {tiers!r}")
    for i, entry in enumerate(tiers):
        entry = _expect_mapping(entry, f"{EXTRA}.secondary_tiers[{i}]", "a tier object")
        if not entry.get("type"):
            raise ConfigError(f"{EXTRA}.secondary_tiers[{i}].type", "missing; vLLM needs a tier type")
    return extra


@dataclass(frozen=True, slots=True)
class AdapterOptions:
    """The keys of a KvtierTier entry the adapter consumes (never passed to the kvtier tier)."""

    tier: str = "fs"
    tier_module_path: str | None = None
    name: str | None = None
    cache_salt: str = ""
    locality: str | None = None
    enable_kv_events: bool = False


_ADAPTER_KEYS = ("tier", "tier_module_path", "name", "cache_salt", "locality", "enable_kv_events")
_FACTORY_KEYS = ("type", "module_path", "backpressure")


def split_adapter_entry(entry: Mapping[str, Any], path: str) -> tuple[AdapterOptions, dict[str, Any]]:
    """One KvtierTier entry -> (the adapter's own options, the kvtier tier entry it builds).

    The kvtier entry is ``{"type": tier, "module_path": tier_module_path, "name": ..., **options}``
    with vLLM's fs thread keys translated (:func:`fs_threads`). ``path`` prefixes error key paths.
    """

    def text(key: str, default: str | None) -> str | None:
        value = entry.get(key, default)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigError(f"{path}{key}", f"expected a non-empty string, got {value!r}")
        return value

    tier = text("tier", "fs")
    assert tier is not None
    locality = text("locality", None)
    if locality is not None and locality.upper() not in ("LOCAL", "REMOTE"):
        raise ConfigError(
            f"{path}locality", f'expected "LOCAL" or "REMOTE" (vLLM\'s Locality), got {locality!r}'
        )
    salt = entry.get("cache_salt", "")
    if not isinstance(salt, str):
        raise ConfigError(f"{path}cache_salt", f"expected a string, got {salt!r}")
    events = entry.get("enable_kv_events", False)
    if not isinstance(events, bool):
        raise ConfigError(f"{path}enable_kv_events", f"expected true or false, got {events!r}")
    opts = AdapterOptions(
        tier=tier,
        tier_module_path=text("tier_module_path", None),
        name=text("name", None),
        cache_salt=salt,
        locality=None if locality is None else locality.upper(),
        enable_kv_events=events,
    )
    options = {k: v for k, v in entry.items() if k not in _ADAPTER_KEYS and k not in _FACTORY_KEYS}
    if tier == "fs" and opts.tier_module_path is None:
        options = fs_threads(options, path)
    if tier == "p2p" and opts.tier_module_path is None and "serve" in options and options.get("directory"):
        # The block server serves vLLM's primary tier through serve_external_requests, but vLLM's
        # primary tier never tells a secondary tier what it evicts, so a directory entry would name
        # this instance for blocks it dropped long ago.
        raise ConfigError(
            f"{path}directory",
            "inside vLLM a serving p2p tier cannot keep the directory current (vLLM's primary tier "
            "does not report its evictions); list the serving instances in peers instead",
        )
    kv_entry: dict[str, Any] = {"type": tier, **options}
    if opts.tier_module_path is not None:
        kv_entry["module_path"] = opts.tier_module_path
    if opts.name is not None:
        kv_entry["name"] = opts.name
    return opts, kv_entry


# Tier options that hold a credential inline, and the option that names an env variable instead.
_SECRET_KEYS = {
    "secret_access_key": "secret_key_env",
    "access_key_id": "access_key_env",
    "session_token": "an AWS profile or role",
}


def inline_secrets(entry: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(key, what to write instead)`` for each option of ``entry`` that holds a secret inline.

    vLLM 0.33 logs every non-default argument at start-up, ``--kv-transfer-config`` included and
    unredacted (vllm/entrypoints/common/startup.py, lines 50-96), so a secret in the JSON ends up
    in vLLM's log; kvtier's tiers read it from the environment variable an ``*_env`` option names.
    A ``url`` with a password counts too (write ``password_env``).
    """
    out = [(k, alt) for k, alt in _SECRET_KEYS.items() if entry.get(k)]
    url = entry.get("url")
    if isinstance(url, str):
        try:
            has_password = bool(urlsplit(url).password)
        except ValueError:  # a malformed URL: the tier itself reports it
            has_password = False
        if has_password:
            out.append(("url", "password_env"))
    return out


def is_spec_config(extra: Mapping[str, Any]) -> bool:
    """True when ``kv_connector_extra_config`` selects kvtier's own spec (``KvtierOffloadingSpec``)."""
    return extra.get("spec_module_path") in SPEC_MODULES and extra.get("spec_name") in SPEC_CLASSES


def spec_block(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The user's kvtier config under ``kv_connector_extra_config.kvtier`` (a mapping, or a path to a
    JSON/YAML file), without what vLLM decides.

    Raises a one-line :class:`~kvtier.errors.ConfigError` naming the key for vLLM's own tier keys
    beside the spec (it replaces them) and for kvtier keys vLLM decides (size, block, namespace).
    """
    for key in _VLLM_ONLY:
        if key in extra:
            raise ConfigError(
                key,
                f"configures vLLM's own offloading tiers, which {SPEC_CLASS} replaces; write "
                f"kvtier's equivalent under {_WHERE} (e.g. {_WHERE}.{key.replace('cache_policy_', '')})",
            )
    raw = extra.get(KVTIER_KEY, {})
    if isinstance(raw, str):
        raw = read_config_file(Path(raw).expanduser())
    if not isinstance(raw, Mapping):
        raise ConfigError(KVTIER_KEY, f"expected kvtier's config (a mapping or a file path), got {raw!r}")
    for key, fix in _SET_BY_VLLM.items():
        if key in raw:
            raise ConfigError(f"{KVTIER_KEY}.{key}", fix)
    return dict(raw)


def kvtier_mapping(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """vLLM's ``--kv-transfer-config`` object -> (kvtier config mapping, original tier indices).

    The mapping holds ``cpu_bytes_to_use`` and one ``secondary_tiers`` entry per KvtierTier entry,
    in order; ``indices[i]`` is that entry's index in vLLM's list. vLLM's own keys are checked only
    where a wrong value would stop vLLM (connector, spec, ``cpu_bytes_to_use``) and otherwise left
    to vLLM.
    """
    extra = _extra(raw)
    if is_spec_config(extra):
        # kvtier's spec: the whole engine is the kvtier block (block_bytes is vLLM's chunk at run time).
        block = spec_block(extra)
        count = len(block.get("secondary_tiers") or [])
        return {**block, "cpu_bytes_to_use": extra["cpu_bytes_to_use"]}, list(range(count))
    tiers: list[dict[str, Any]] = []
    indices: list[int] = []
    for i, entry in enumerate(extra.get("secondary_tiers", [])):
        if not is_adapter_entry(entry):
            continue
        path = f"{EXTRA}.secondary_tiers[{i}]."
        if entry.get("module_path") != ADAPTER_MODULE or entry.get("type") != ADAPTER_CLASS:
            raise ConfigError(
                f"{path}module_path",
                f'load kvtier with "type": "{ADAPTER_CLASS}", "module_path": "{ADAPTER_MODULE}"',
            )
        bp = entry.get("backpressure")
        if bp is not None and not (isinstance(bp, Mapping) and "backpressure_cls" in bp):
            raise ConfigError(
                f"{path}backpressure",
                'vLLM needs an object with "backpressure_cls" (e.g. "EMABackpressureDetector")',
            )
        _opts, kv_entry = split_adapter_entry(entry, path)
        tiers.append(kv_entry)
        indices.append(i)
    return {"cpu_bytes_to_use": extra["cpu_bytes_to_use"], "secondary_tiers": tiers}, indices


def vllm_owned_tiers(raw: Mapping[str, Any]) -> list[str]:
    """``type`` of every entry of vLLM's ``secondary_tiers`` that vLLM builds itself (not kvtier's)."""
    extra = raw.get(EXTRA)
    if not isinstance(extra, Mapping) or not isinstance(extra.get("secondary_tiers"), list):
        return []
    return [
        str(e.get("type"))
        for e in extra["secondary_tiers"]
        if isinstance(e, Mapping) and not is_adapter_entry(e)
    ]


def vllm_namespace(offloading_config: Any, *, row_bytes: int, cache_salt: str = "") -> KeyNamespace:
    """kvtier's namespace for the blocks of one vLLM offloading config.

    Everything that changes what the stored bytes mean goes in: the model name and KV dtype, the
    KV cache groups (tokens per block, layer names, sliding window), tokens per hash, blocks per
    chunk, the parallel layout (tp/pp/pcp/dcp sizes; not the rank, the scheduler-side row holds
    every worker's page), replicated/canonical layout flags, the KV cache layout name and the
    stored row size. Nothing per-instance (engine id, data-parallel index) goes in, so two vLLM
    instances serving the same model with the same layout share blocks.

    ``offloading_config`` is vLLM's ``OffloadingConfig`` (read by attribute with defaults, so a
    newer vLLM that adds fields still works; a missing field counts as its default).
    """

    def get(obj: Any, name: str, default: Any = None) -> Any:
        return getattr(obj, name, default) if obj is not None else default

    model = get(offloading_config, "model")
    cache = get(offloading_config, "cache")
    parallel = get(offloading_config, "parallel")
    groups = [
        {
            "tokens_per_block": int(get(g, "tokens_per_block", 0)),
            "layer_names": list(get(g, "layer_names", ())),
            "sliding_window_size_in_chunks": get(g, "sliding_window_size_in_chunks"),
        }
        for g in (get(offloading_config, "groups", ()) or ())
    ]
    blocks_per_chunk = int(get(cache, "blocks_per_chunk", 1) or 1)
    layout = {
        "engine": "vllm",
        "groups": groups,
        "tokens_per_hash": int(get(cache, "tokens_per_hash", 0) or 0),
        "blocks_per_chunk": blocks_per_chunk,
        "parallel": {
            k: int(get(parallel, k, 1) or 1) for k in ("tp_size", "pp_size", "pcp_size", "dcp_size")
        },
        "replicated_layout": bool(get(offloading_config, "replicated_layout", False)),
        "canonical_layout": bool(get(offloading_config, "canonical_layout", False)),
        "kv_cache_layout": get(offloading_config, "kv_cache_layout"),
        "worker_kv_bytes_per_block": int(get(offloading_config, "worker_kv_bytes_per_block", 0) or 0),
        "row_bytes": int(row_bytes),
    }
    tokens = groups[0]["tokens_per_block"] * blocks_per_chunk if groups else 1
    return make_namespace(
        str(get(model, "name", "default")),
        block_size=max(1, tokens),
        dtype=str(get(model, "dtype", "")),
        layout=json.dumps(layout, sort_keys=True, separators=(",", ":")),
        cache_salt=cache_salt,
    )
