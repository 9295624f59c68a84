"""Typed, validated configuration.

Loaded from a dict, a JSON or YAML file, or a JSON string (the form vLLM users pass as
``kv_connector_extra_config``). Key names match vLLM's where the concept exists (``cpu_bytes_to_use``,
``secondary_tiers``, ``type``, ``module_path``, ``eviction_policy``, ``cache_policy_module_path``,
``spec_name``, ``spec_module_path``; the fs tier's ``n_read_threads``/``n_write_threads``); a vLLM key
with no kvtier meaning (``block_size`` counts tokens) is refused with what vLLM means by it and what
to write instead. vLLM's whole ``--kv-transfer-config`` object is accepted too: it loads as the
config of the kvtier tiers in it (:mod:`kvtier.config.vllm`).

Every error is a one-line :class:`~kvtier.errors.ConfigError` whose message starts with the key path
(``secondary_tiers[1].root_dir: ...``) and says what would be accepted.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError

__all__ = [
    "KvtierConfig",
    "PluginsConfig",
    "TierConfig",
    "load_config",
    "parse_size",
    "row_stride",
]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1, "B": 1,
    "K": 1000, "KB": 1000, "KIB": 1 << 10, "KI": 1 << 10,
    "M": 1000**2, "MB": 1000**2, "MIB": 1 << 20, "MI": 1 << 20,
    "G": 1000**3, "GB": 1000**3, "GIB": 1 << 30, "GI": 1 << 30,
    "T": 1000**4, "TB": 1000**4, "TIB": 1 << 40, "TI": 1 << 40,
    "P": 1000**5, "PB": 1000**5, "PIB": 1 << 50, "PI": 1 << 50,
}  # fmt: skip

WRITE_POLICIES = ("write_through", "write_back", "after_hits")
PRIMARY_BACKINGS = ("heap", "shm", "torch", "none")


def parse_size(value: Any, key_path: str) -> int:
    """Bytes from an integer or a string such as ``"8GiB"``, ``"512 MB"``, ``"4096"``.

    Binary units (KiB, MiB, GiB...) are powers of 1024; decimal ones (KB, MB, GB...) powers of 1000.
    """
    if isinstance(value, bool):
        raise ConfigError(key_path, f"expected a size such as 8GiB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key_path, f"size must be >= 0, got {value}")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            unit = (m.group(2) or "").upper()
            if unit in _UNITS:
                # Decimal, not float: "9007199254740993" must not round to a neighbouring integer.
                return int(Decimal(m.group(1)) * _UNITS[unit])
    raise ConfigError(
        key_path, f"expected a size such as 8GiB, 512MB or an integer byte count, got {value!r}"
    )


def _expect(value: Any, typ: type | tuple[type, ...], key_path: str, what: str) -> Any:
    # bool is an int subclass; never accept True where a number is meant.
    if (
        isinstance(value, bool)
        and typ is not bool
        and bool not in (typ if isinstance(typ, tuple) else (typ,))
    ):
        raise ConfigError(key_path, f"expected {what}, got {value!r}")
    if not isinstance(value, typ):
        raise ConfigError(key_path, f"expected {what}, got {type(value).__name__} {value!r}")
    return value


def _optional_str(raw: Mapping[str, Any], key: str, path: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    s = _expect(value, str, path, "a string")
    if not s.strip():
        raise ConfigError(path, "must not be empty (omit the key instead)")
    return str(s)


def _unknown_key(path: str, key: str, valid: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"{path}{key}", f"unknown key{hint}; valid keys are: {', '.join(sorted(valid))}")


@dataclass(frozen=True, slots=True)
class TierConfig:
    """One entry of ``secondary_tiers``.

    ``type`` and ``module_path`` select the class; every other key is a constructor keyword
    argument, kept in ``options`` untouched (the tier validates its own values; the registry checks
    the names against the constructor's signature).
    """

    type: str
    module_path: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    index: int = 0

    @property
    def key_path(self) -> str:
        return f"secondary_tiers[{self.index}]"


@dataclass(frozen=True, slots=True)
class PluginsConfig:
    """Trust boundary for ``module_path`` / ``cache_policy_module_path`` / ``spec_module_path``.

    Attributes:
        allow_module_path: ``False`` refuses every ``module_path`` (only built-ins, registered and
            entry-point plug-ins load).
        allowed_modules: when not empty, a module is imported only if its dotted name equals one of
            these prefixes or starts with ``prefix + "."``. Empty means any module (the default, as in
            vLLM); production deployments should list their plug-in packages.
    """

    allow_module_path: bool = True
    allowed_modules: tuple[str, ...] = ()

    def permits(self, module: str) -> bool:
        if not self.allow_module_path:
            return False
        if not self.allowed_modules:
            return True
        return any(module == p or module.startswith(p + ".") for p in self.allowed_modules)


@dataclass(frozen=True, slots=True)
class KvtierConfig:
    """The whole configuration. Build it with :func:`load_config` (validates) or directly.

    Sizes are in bytes. ``raw`` keeps the mapping it was loaded from (for ``kvtier check --json``).
    """

    cpu_bytes_to_use: int = 1 << 30
    block_bytes: int = 1 << 20
    eviction_policy: str = "lru"
    cache_policy_module_path: str | None = None
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    spec_name: str = "tiering"
    spec_module_path: str | None = None
    secondary_tiers: tuple[TierConfig, ...] = ()
    plugins: PluginsConfig = field(default_factory=PluginsConfig)
    # Primary tier memory: "heap" (numpy), "shm" (POSIX shared memory, named by shm_name),
    # "torch" (pinned tensor when CUDA exists, else plain), "none" (metadata only, for simulation).
    primary_backing: str = "heap"
    shm_name: str | None = None
    # When blocks go to the secondary tiers: on store (write_through), on eviction from the primary
    # tier (write_back), or once a block has been hit write_after_hits times (after_hits).
    write_policy: str = "write_through"
    write_after_hits: int = 1
    # Namespace inputs: blocks of different models/layouts or tenants never share keys.
    model: str = "default"
    cache_salt: str = ""
    max_inflight_jobs: int = 64
    # Admission control: promotions may hold at most this share of the in-flight job budget so
    # they cannot starve stores.
    promotion_share: float = 0.5
    # Pins with a deadline (``Engine.pin_for``, vLLM's ``kv_hints``): they may hold at most this
    # share of the primary slots (0 turns them off), each for at most pin_max_ttl_s seconds.
    pin_share: float = 0.25
    pin_max_ttl_s: float = 3600.0
    metrics_port: int | None = None
    cost_model: Mapping[str, Any] = field(default_factory=dict)
    # Bytes each primary row keeps free after its block (rounded up to 4 KiB): the mooncake tier
    # writes the next slot's block header there, so header + payload move as one zero-copy piece.
    primary_row_pad: int = 0
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def row_stride(self) -> int:
        """Bytes per primary slot: ``block_bytes`` rounded up to 4 KiB (page-aligned rows), plus
        ``primary_row_pad`` rounded up to 4 KiB."""
        return row_stride(self.block_bytes, self.primary_row_pad)

    @property
    def num_primary_slots(self) -> int:
        """Slots that fit in ``cpu_bytes_to_use``."""
        return self.cpu_bytes_to_use // self.row_stride

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> KvtierConfig:
        """Validate ``raw`` and build a config (see :func:`load_config`)."""
        return _from_mapping(raw)


_TOP_KEYS = [f.name for f in fields(KvtierConfig) if f.name != "raw"]


#: Longest ``pin_max_ttl_s``: a week (a pin is a hint, not storage).
_MAX_PIN_TTL_S = 604800.0

#: Largest ``primary_row_pad``: room for headers, not a second block.
_MAX_ROW_PAD = 1 << 20


def row_stride(block_bytes: int, row_pad: int = 0) -> int:
    """Bytes per primary row: ``block_bytes`` and then ``row_pad``, each rounded up to 4 KiB."""
    return -(-block_bytes // 4096) * 4096 + -(-row_pad // 4096) * 4096


# Built-in tiers whose entries take vLLM's tier keys with vLLM's meaning (or refuse them saying why).
_VLLM_AWARE_TIERS = ("fs", "example")


def _vllm_tier_keys(ttype: str, options: dict[str, Any], path: str) -> dict[str, Any]:
    from kvtier.config import vllm as vllm_config

    for key, value in options.items():
        if key == "backpressure" and not (isinstance(value, Mapping) and "backpressure_cls" in value):
            continue  # kvtier's own store-gate marks (GateConfig), not vLLM's detector object
        error = vllm_config.explain_vllm_key(key, path, tier=True)
        if error is not None:
            raise error
    return vllm_config.fs_threads(options, path) if ttype == "fs" else options


def _parse_tiers(value: Any) -> tuple[TierConfig, ...]:
    if value is None:
        return ()
    _expect(value, list, "secondary_tiers", 'a list of tier objects such as [{"type": "fs"}]')
    tiers = []
    for i, entry in enumerate(value):
        path = f"secondary_tiers[{i}]"
        _expect(entry, Mapping, path, 'an object such as {"type": "fs", "root_dir": "/mnt/kv"}')
        if "type" not in entry:
            raise ConfigError(f"{path}.type", 'missing; name a tier such as "fs" or a class name')
        ttype = _expect(entry["type"], str, f"{path}.type", "a tier name string")
        if not ttype.strip():
            raise ConfigError(f"{path}.type", "must not be empty")
        module_path = _optional_str(entry, "module_path", f"{path}.module_path")
        options = {k: v for k, v in entry.items() if k not in ("type", "module_path")}
        for k in options:
            _expect(k, str, path, "string keys")
        if module_path is None and ttype in _VLLM_AWARE_TIERS:
            options = _vllm_tier_keys(ttype, options, f"{path}.")
        tiers.append(TierConfig(type=ttype, module_path=module_path, options=options, index=i))
    return tuple(tiers)


def _parse_plugins(value: Any) -> PluginsConfig:
    if value is None:
        return PluginsConfig()
    _expect(value, Mapping, "plugins", "an object with allow_module_path and allowed_modules")
    valid = ["allow_module_path", "allowed_modules"]
    for k in value:
        if k not in valid:
            raise _unknown_key("plugins.", str(k), valid)
    allow = _expect(value.get("allow_module_path", True), bool, "plugins.allow_module_path", "true or false")
    mods = value.get("allowed_modules", [])
    _expect(mods, list, "plugins.allowed_modules", "a list of module prefixes")
    prefixes = []
    for i, m in enumerate(mods):
        _expect(m, str, f"plugins.allowed_modules[{i}]", "a module prefix string")
        # "mypkg." would otherwise silently match nothing (the check appends the dot itself).
        prefix = m.strip().rstrip(".")
        if not prefix:
            raise ConfigError(f"plugins.allowed_modules[{i}]", "must name a module prefix such as mypkg")
        prefixes.append(prefix)
    return PluginsConfig(allow_module_path=allow, allowed_modules=tuple(prefixes))


def _from_mapping(raw: Mapping[str, Any]) -> KvtierConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError("", f"config must be an object/mapping, got {type(raw).__name__}")
    from kvtier.config import vllm as vllm_config

    if vllm_config.is_kv_transfer_config(raw):
        # vLLM's whole --kv-transfer-config: the kvtier tiers in it, keeping their index in vLLM's list.
        inner, indices = vllm_config.kvtier_mapping(raw)
        cfg = _from_mapping(inner)
        tiers = tuple(replace(tc, index=i) for tc, i in zip(cfg.secondary_tiers, indices, strict=True))
        return replace(cfg, secondary_tiers=tiers, raw=dict(raw))
    for k in raw:
        if not isinstance(k, str) or k not in _TOP_KEYS:
            raise vllm_config.explain_vllm_key(str(k), "") or _unknown_key("", str(k), _TOP_KEYS)
    kw: dict[str, Any] = {**_numbers(raw), **_names(raw)}
    kw["secondary_tiers"] = _parse_tiers(raw.get("secondary_tiers"))
    kw["plugins"] = _parse_plugins(raw.get("plugins"))
    cfg = KvtierConfig(**kw, raw=dict(raw))
    if cfg.primary_backing != "none" and cfg.num_primary_slots < 1:
        raise ConfigError(
            "cpu_bytes_to_use",
            f"{cfg.cpu_bytes_to_use} bytes hold no slot of {cfg.row_stride} bytes; "
            "raise it to at least one block",
        )
    return cfg


def _names(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level settings that are strings, choices or option objects, checked."""
    kw: dict[str, Any] = {}
    for key in ("eviction_policy", "spec_name", "model"):
        if key in raw:
            kw[key] = _expect(raw[key], str, key, "a string")
            if not kw[key].strip():
                raise ConfigError(key, "must not be empty")
    if "cache_salt" in raw:
        kw["cache_salt"] = _expect(raw["cache_salt"], str, "cache_salt", "a string")
    for key in ("cache_policy_module_path", "spec_module_path", "shm_name"):
        kw[key] = _optional_str(raw, key, key)
    for key in ("policy_options", "cost_model"):
        if key in raw:
            kw[key] = dict(_expect(raw[key], Mapping, key, "an object"))
    if "primary_backing" in raw:
        kw["primary_backing"] = _choice(raw["primary_backing"], "primary_backing", PRIMARY_BACKINGS)
    if "write_policy" in raw:
        kw["write_policy"] = _choice(raw["write_policy"], "write_policy", WRITE_POLICIES)
    return kw


def _numbers(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level sizes, counts, shares and ports, each checked against its range."""
    d = KvtierConfig()
    kw: dict[str, Any] = {}
    for key in ("cpu_bytes_to_use", "block_bytes"):
        if key in raw:
            kw[key] = parse_size(raw[key], key)
    if kw.get("block_bytes", d.block_bytes) < 1:
        raise ConfigError("block_bytes", "must be at least 1 byte")
    if "primary_row_pad" in raw:
        kw["primary_row_pad"] = parse_size(raw["primary_row_pad"], "primary_row_pad")
        if kw["primary_row_pad"] > _MAX_ROW_PAD:
            raise ConfigError(
                "primary_row_pad",
                f"at most {_MAX_ROW_PAD} bytes (4096 holds a header), got {raw['primary_row_pad']!r}",
            )
    for key, lo in (("write_after_hits", 1), ("max_inflight_jobs", 1)):
        if key in raw:
            kw[key] = _expect(raw[key], int, key, "an integer")
            if kw[key] < lo:
                raise ConfigError(key, f"must be >= {lo}, got {kw[key]}")
    if "promotion_share" in raw:
        share = _expect(raw["promotion_share"], (int, float), "promotion_share", "a number")
        if not 0.0 < float(share) <= 1.0:
            raise ConfigError("promotion_share", f"must be in (0, 1], got {share}")
        kw["promotion_share"] = float(share)
    kw.update(_pin_numbers(raw))
    if raw.get("metrics_port") is not None:
        port = _expect(raw["metrics_port"], int, "metrics_port", "a TCP port number")
        if not 0 <= port <= 65535:
            raise ConfigError("metrics_port", f"must be in 0..65535, got {port}")
        kw["metrics_port"] = port
    return kw


def _pin_numbers(raw: Mapping[str, Any]) -> dict[str, float]:
    """``pin_share`` in [0, 1] and ``pin_max_ttl_s`` in (0, a week], when given."""
    kw: dict[str, float] = {}
    if "pin_share" in raw:
        share = _finite(raw["pin_share"], "pin_share")
        if not 0.0 <= share <= 1.0:
            raise ConfigError("pin_share", f"must be in [0, 1] (0 turns pins off), got {share}")
        kw["pin_share"] = share
    if "pin_max_ttl_s" in raw:
        ttl = _finite(raw["pin_max_ttl_s"], "pin_max_ttl_s")
        if not 0.0 < ttl <= _MAX_PIN_TTL_S:
            raise ConfigError("pin_max_ttl_s", f"must be in (0, {_MAX_PIN_TTL_S:g}] seconds, got {ttl}")
        kw["pin_max_ttl_s"] = ttl
    return kw


def _finite(value: Any, key: str) -> float:
    """``value`` as a float when it is a finite number (not a bool), else a one-line error."""
    number = _expect(value, (int, float), key, "a number")
    if isinstance(number, bool) or not math.isfinite(number):
        raise ConfigError(key, f"expected a finite number, got {value!r}")
    return float(number)


def _choice(value: Any, key: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(key, f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def load_config(
    source: KvtierConfig | Mapping[str, Any] | str | os.PathLike[str] | None,
) -> KvtierConfig:
    """Build a validated :class:`KvtierConfig`.

    ``source`` may be a config (returned as is), a mapping, a JSON string (starts with ``{``), or the
    path of a ``.json``, ``.yaml`` or ``.yml`` file. ``None`` gives the defaults.
    """
    if source is None:
        return _from_mapping({})
    if isinstance(source, KvtierConfig):
        return source
    if isinstance(source, Mapping):
        return _from_mapping(source)
    text_or_path = os.fspath(source)
    from kvtier.config.files import check_depth, loads_json, read_config_file

    if isinstance(source, str) and text_or_path.lstrip().startswith("{"):
        data = loads_json(text_or_path, "config JSON string", file=False)
        check_depth(data, "config JSON string")
        return _from_mapping(data)

    return _from_mapping(read_config_file(Path(text_or_path)))
