"""Cost model: is loading a block from a tier faster than recomputing it, and by how much?

Offloading only pays when moving a block's KV bytes back costs less than running prefill again over
the block's tokens. This module turns three figures into that answer:

* **prefill cost** — seconds of prefill per token (config ``cost_model.prefill_seconds_per_token`` or
  ``prefill_tokens_per_second``, or measured with :func:`measure_prefill` around a real model call);
* **block size** — bytes of KV per block (``cost_model.kv_bytes_per_token`` times tokens per block, or
  the config's ``block_bytes``);
* **per-tier load speed** — a fixed latency per load job plus a bandwidth (config
  ``cost_model.tiers.<name>``, a ``kvtier bench --json`` report via ``cost_model.bench_file``, or a
  conservative default for the tier's medium).

The model is linear: loading ``n`` blocks from tier ``t`` takes ``latency_t + n * block_bytes /
bandwidth_t`` and recomputing them ``n * tokens_per_block * prefill_seconds_per_token``. So for every
tier there is a smallest batch that pays (:meth:`CostModel.min_blocks_to_load`), computed once; the
engine's hot path is an integer comparison (:meth:`CostModel.should_load`).

Config example (every key optional)::

    cost_model:
      prefill_seconds_per_token: 1.0e-4   # or prefill_tokens_per_second: 10000
      tokens_per_block: 512
      kv_bytes_per_token: 131072          # real model's KV per token; default: block_bytes / tokens
      bench_file: bench.json              # output of `kvtier bench --json`
      tiers:
        primary: {load_bandwidth: 10GB, load_latency: 2e-6}
        fs0:     {load_bandwidth: 1.5GB, load_latency: 2e-4}

Bandwidths are bytes per second and accept size strings (``"1.5GB"``); latencies are seconds.
"""

from __future__ import annotations

import difflib
import json
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.config import KvtierConfig, parse_size
from kvtier.errors import ConfigError
from kvtier.numbers import COUNT, NONNEG_SECONDS, POSITIVE, check_bandwidth, check_number

__all__ = [
    "DEFAULT_PREFILL_SECONDS_PER_TOKEN",
    "MEDIUM_DEFAULTS",
    "CostModel",
    "TierCost",
    "check_cost_model_keys",
    "measure_prefill",
]

#: 10,000 prefill tokens per second: a 7-8B model on one current datacenter GPU, order of magnitude.
#: Only a default; set ``cost_model.prefill_seconds_per_token`` for your model and hardware.
DEFAULT_PREFILL_SECONDS_PER_TOKEN = 1.0e-4

#: Conservative load speeds per tier medium, used when neither config nor a bench report names the
#: tier: (bandwidth bytes/s, latency s per job).
MEDIUM_DEFAULTS: Mapping[str, tuple[float, float]] = {
    "PRIMARY": (8e9, 2e-6),
    "CPU": (5e9, 1e-5),
    "STORAGE": (1e9, 2e-4),
    "REMOTE": (5e8, 1e-3),
}

_MODEL_KEYS = (
    "prefill_seconds_per_token",
    "prefill_tokens_per_second",
    "tokens_per_block",
    "kv_bytes_per_token",
    "bench_file",
    "tiers",
)
_TIER_KEYS = ("load_bandwidth", "load_latency", "store_bandwidth", "store_latency")


@dataclass(frozen=True, slots=True)
class TierCost:
    """Load/store speed of one tier.

    Attributes:
        name: tier name (``"primary"`` for the primary tier).
        load_bandwidth: bytes per second when copying blocks into the primary tier.
        load_latency: fixed seconds per load job, whatever its size.
        store_bandwidth / store_latency: same for writes (reported, not used for decisions).
        source: where the figures came from: ``"config"``, ``"bench"`` or ``"default"``.
    """

    name: str
    load_bandwidth: float
    load_latency: float
    store_bandwidth: float = 0.0
    store_latency: float = 0.0
    source: str = "default"

    def load_seconds(self, nbytes: int) -> float:
        """Seconds to load ``nbytes`` in one job."""
        return self.load_latency + nbytes / self.load_bandwidth


@dataclass(frozen=True)
class CostModel:
    """Projected cost of recomputing versus loading KV blocks.

    Attributes:
        prefill_seconds_per_token: prefill time per input token.
        tokens_per_block: tokens covered by one block.
        block_bytes: KV bytes of one block as the cost model sees it (the real model's size, which
            may differ from the synthetic payload a replay moves).
        tiers: per-tier speeds by name; a name not listed falls back to ``default_tier``.
    """

    prefill_seconds_per_token: float = DEFAULT_PREFILL_SECONDS_PER_TOKEN
    tokens_per_block: int = 512
    block_bytes: int = 1 << 20
    tiers: Mapping[str, TierCost] = field(default_factory=dict)
    default_tier: TierCost = field(
        default_factory=lambda: TierCost("default", *MEDIUM_DEFAULTS["STORAGE"], source="default")
    )
    _min_blocks: dict[str, int | None] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.prefill_seconds_per_token > 0:
            raise ConfigError("cost_model.prefill_seconds_per_token", "must be > 0")
        if self.tokens_per_block < 1:
            raise ConfigError("cost_model.tokens_per_block", "must be >= 1")
        if self.block_bytes < 1:
            raise ConfigError("cost_model.kv_bytes_per_token", "gives a block of < 1 byte")

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_config(
        cls,
        config: KvtierConfig,
        *,
        tier_media: Mapping[str, str] | None = None,
        bench: Mapping[str, Any] | None = None,
    ) -> CostModel:
        """Build the model from ``config.cost_model``.

        ``tier_media`` maps tier names to their medium (``"CPU"``, ``"STORAGE"``, ``"REMOTE"``) for
        tiers the config and bench report do not describe; ``bench`` is a ``kvtier bench --json``
        object (overrides ``cost_model.bench_file``). Priority per tier: config, bench, medium default.
        Raises :class:`ConfigError` naming the key on bad values.
        """
        raw = dict(config.cost_model)
        check_cost_model_keys(raw)
        prefill = _prefill_from(raw)
        tpb = _positive_int(raw.get("tokens_per_block", 512), "cost_model.tokens_per_block")
        if "kv_bytes_per_token" in raw:
            per_tok = parse_size(raw["kv_bytes_per_token"], "cost_model.kv_bytes_per_token")
            block_bytes = per_tok * tpb
        else:
            block_bytes = config.block_bytes
        if bench is None and raw.get("bench_file") is not None:
            bench = _read_bench(raw["bench_file"])
        tiers: dict[str, TierCost] = {}
        for name, medium in (tier_media or {}).items():
            bw, lat = MEDIUM_DEFAULTS.get(medium.upper(), MEDIUM_DEFAULTS["STORAGE"])
            tiers[name] = TierCost(name, bw, lat, bw, lat, source="default")
        tiers.setdefault("primary", TierCost("primary", *MEDIUM_DEFAULTS["PRIMARY"], source="default"))
        if bench is not None:
            tiers.update(_tiers_from_bench(bench))
        cfg_tiers = raw.get("tiers", {})
        if not isinstance(cfg_tiers, Mapping):
            raise ConfigError("cost_model.tiers", "expected an object keyed by tier name")
        for name, spec in cfg_tiers.items():
            tiers[str(name)] = _tier_from_config(str(name), spec, tiers.get(str(name)))
        return cls(prefill, tpb, block_bytes, tiers)

    # -- the model ---------------------------------------------------------------------------
    def tier(self, name: str) -> TierCost:
        """Speeds of tier ``name`` (the default tier when unknown)."""
        return self.tiers.get(name, self.default_tier)

    def recompute_seconds(self, nblocks: int, ntokens: int | None = None) -> float:
        """Prefill seconds for ``nblocks`` full blocks (or exactly ``ntokens`` tokens when given)."""
        tokens = nblocks * self.tokens_per_block if ntokens is None else ntokens
        return tokens * self.prefill_seconds_per_token

    def load_seconds(self, tier: str, nblocks: int) -> float:
        """Seconds to load ``nblocks`` blocks from ``tier`` in one job (0 for 0 blocks)."""
        if nblocks <= 0:
            return 0.0
        return self.tier(tier).load_seconds(nblocks * self.block_bytes)

    def saving_seconds(self, tier: str, nblocks: int, ntokens: int | None = None) -> float:
        """Projected TTFT saving of serving ``nblocks`` hits from ``tier`` instead of recomputing.

        Never negative: an engine following :meth:`should_load` recomputes when loading is slower.
        """
        if nblocks <= 0:
            return 0.0
        return max(0.0, self.recompute_seconds(nblocks, ntokens) - self.load_seconds(tier, nblocks))

    def total_saving_seconds(self, tier: str, nblocks: Sequence[int], ntokens: Sequence[int]) -> float:
        """Sum of :meth:`saving_seconds` over many loads at once (``nblocks[i]`` blocks holding
        ``ntokens[i]`` tokens each time; zero-block entries save nothing)."""
        n = np.asarray(nblocks, dtype=np.float64)
        toks = np.asarray(ntokens, dtype=np.float64)
        if n.size == 0:
            return 0.0
        t = self.tier(tier)
        load = t.load_latency + n * (self.block_bytes / t.load_bandwidth)
        saving = np.maximum(0.0, toks * self.prefill_seconds_per_token - load)
        return float(saving[n > 0].sum())

    def min_blocks_to_load(self, tier: str) -> int | None:
        """Smallest batch of blocks whose load from ``tier`` beats recomputing them; ``None`` = never.

        Loading ``n`` blocks wins when ``latency < n * (recompute_per_block - transfer_per_block)``.
        Cached per tier name: the engine may call this on every lookup.
        """
        try:
            return self._min_blocks[tier]
        except KeyError:
            pass
        t = self.tier(tier)
        gain_per_block = self.recompute_seconds(1) - self.block_bytes / t.load_bandwidth
        # Strictly faster: the smallest n with n * gain > latency.
        result = None if gain_per_block <= 0 else max(1, math.floor(t.load_latency / gain_per_block) + 1)
        self._min_blocks[tier] = result
        return result

    def should_load(self, tier: str, nblocks: int) -> bool:
        """Whether loading ``nblocks`` hits from ``tier`` in one job is faster than recomputing them.

        This is the decision the engine uses to skip a tier: O(1) after the first call per tier.
        """
        n = self.min_blocks_to_load(tier)
        return n is not None and nblocks >= n

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready description (for reports)."""
        return {
            "prefill_seconds_per_token": self.prefill_seconds_per_token,
            "tokens_per_block": self.tokens_per_block,
            "block_bytes": self.block_bytes,
            "recompute_seconds_per_block": self.recompute_seconds(1),
            "tiers": {
                name: {
                    "load_bandwidth": t.load_bandwidth,
                    "load_latency": t.load_latency,
                    "source": t.source,
                    "load_seconds_per_block": self.load_seconds(name, 1),
                    "min_blocks_to_load": self.min_blocks_to_load(name),
                }
                for name, t in sorted(self.tiers.items())
            },
        }


def measure_prefill(run_prefill: Callable[[int], object], num_tokens: int = 2048, repeats: int = 3) -> float:
    """Seconds per token of ``run_prefill(num_tokens)`` (best of ``repeats``, after one warm-up).

    ``run_prefill`` runs a real prefill of ``num_tokens`` tokens (e.g. a transformers model forward
    over a prompt of that length); the result goes in ``cost_model.prefill_seconds_per_token``.
    """
    if num_tokens < 1 or repeats < 1:
        raise ValueError("num_tokens and repeats must be >= 1")
    run_prefill(num_tokens)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        run_prefill(num_tokens)
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-12) / num_tokens


# -- parsing helpers ---------------------------------------------------------------------------
def check_cost_model_keys(raw: Mapping[str, Any], tier_names: Collection[str] | None = None) -> None:
    """Refuse an unknown key at any level of ``cost_model`` with a did-you-mean: the model's own
    keys, the keys of each ``tiers.<name>`` entry and, when ``tier_names`` is given (the engine's
    configured tiers), a ``tiers.<name>`` naming no tier (``primary`` always exists). A typo would
    otherwise leave the default speeds in place without a word."""
    _known(raw, _MODEL_KEYS, "cost_model")
    tiers = raw.get("tiers", {})
    if not isinstance(tiers, Mapping):
        raise ConfigError("cost_model.tiers", "expected an object keyed by tier name")
    names = None if tier_names is None else ("primary", *tier_names)
    for name, spec in tiers.items():
        if names is not None and name not in names:
            raise _unknown(f"cost_model.tiers.{name}", str(name), names, "no tier of that name")
        if isinstance(spec, Mapping):
            _known(spec, _TIER_KEYS, f"cost_model.tiers.{name}")


def _known(spec: Mapping[str, Any], valid: Sequence[str], path: str) -> None:
    for key in spec:
        if key not in valid:
            raise _unknown(f"{path}.{key}", str(key), valid, "unknown key")


def _unknown(key_path: str, key: str, valid: Sequence[str], what: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(valid), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(key_path, f"{what}{hint}; valid: {', '.join(valid)}")


def _positive_float(value: Any, key: str) -> float:
    return float(check_number(key, value, POSITIVE))


def _nonneg_float(value: Any, key: str) -> float:
    return float(check_number(key, value, NONNEG_SECONDS))


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, float):
        raise ConfigError(key, f"expected an integer >= 1, got {value!r}")
    return int(check_number(key, value, COUNT))


def _bandwidth(value: Any, key: str) -> float:
    return check_bandwidth(key, value)


def _prefill_from(raw: Mapping[str, Any]) -> float:
    if "prefill_seconds_per_token" in raw and "prefill_tokens_per_second" in raw:
        raise ConfigError(
            "cost_model.prefill_tokens_per_second",
            "give either prefill_seconds_per_token or prefill_tokens_per_second, not both",
        )
    if "prefill_tokens_per_second" in raw:
        return 1.0 / _positive_float(raw["prefill_tokens_per_second"], "cost_model.prefill_tokens_per_second")
    if "prefill_seconds_per_token" in raw:
        return _positive_float(raw["prefill_seconds_per_token"], "cost_model.prefill_seconds_per_token")
    return DEFAULT_PREFILL_SECONDS_PER_TOKEN


def _tier_from_config(name: str, spec: Any, base: TierCost | None) -> TierCost:
    path = f"cost_model.tiers.{name}"
    if not isinstance(spec, Mapping):
        raise ConfigError(path, "expected an object such as {load_bandwidth: 2GB, load_latency: 0.0002}")
    _known(spec, _TIER_KEYS, path)
    dflt = base or TierCost(name, *MEDIUM_DEFAULTS["STORAGE"])

    def opt(key: str, conv: Callable[[Any, str], float]) -> float | None:
        return conv(spec[key], f"{path}.{key}") if key in spec else None

    bw = opt("load_bandwidth", _bandwidth)
    lat = opt("load_latency", _nonneg_float)
    sbw = opt("store_bandwidth", _bandwidth)
    slat = opt("store_latency", _nonneg_float)
    return TierCost(
        name,
        bw if bw is not None else dflt.load_bandwidth,
        lat if lat is not None else dflt.load_latency,
        sbw if sbw is not None else dflt.store_bandwidth,
        slat if slat is not None else dflt.store_latency,
        source="config",
    )


def _read_bench(path: Any) -> Mapping[str, Any]:
    from kvtier.files import read_bounded

    p = Path(str(path))
    try:
        data = json.loads(read_bounded(p, "cost_model.bench_file"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        msg = f"{p}: not a `kvtier bench --json` report ({exc})"
        raise ConfigError("cost_model.bench_file", msg) from exc
    if not isinstance(data, Mapping):
        raise ConfigError("cost_model.bench_file", f"{p}: expected a JSON object from `kvtier bench --json`")
    return data


def _tiers_from_bench(bench: Mapping[str, Any]) -> dict[str, TierCost]:
    """Per-tier speeds from a ``kvtier bench --json`` object (its ``tiers`` list)."""
    out: dict[str, TierCost] = {}
    entries = bench.get("tiers", [])
    if not isinstance(entries, list):
        raise ConfigError("cost_model.bench_file", "bench report has no 'tiers' list")
    for entry in entries:
        if not isinstance(entry, Mapping) or "name" not in entry:
            continue
        try:
            bw = float(entry["load_bytes_per_s"])
            lat = float(entry.get("load_latency_s", 0.0))
            sbw = float(entry.get("store_bytes_per_s", 0.0))
            slat = float(entry.get("store_latency_s", 0.0))
        except (KeyError, TypeError, ValueError):
            continue  # an entry that failed to measure keeps the default
        if bw > 0:
            out[str(entry["name"])] = TierCost(str(entry["name"]), bw, lat, sbw, slat, source="bench")
    return out
