"""The menu the planner buys from: tier kinds with a price, a bandwidth and a latency, and the GPU.

Every default below is an **assumption** (order-of-magnitude list prices and device speeds, late
2025), not a measurement; ``kvtier plan`` prints them with the answer and labels them ``default``.
Override any figure from a JSON or YAML file (``--menu FILE``)::

    {"gpu":   {"prefill_tokens_per_second": 25000, "price_per_hour": 3.0},
     "tiers": {"nvme": {"price_per_gib_month": 0.08, "load_bandwidth": "6GB"},
               "redis": {"load_latency": 0.0002}}}

Bandwidths are bytes per second (size strings accepted, ``"6GB"`` = 6e9); latencies are seconds per
load job; prices are US dollars per GiB per month (730 hours). A figure given in the file is
labelled ``menu`` in reports.

Default kinds (fastest first, the order of a stack):

================  =========  ==========  =========  ==============================================
kind              $/GiB-mo   load B/s    latency    what the default assumes
================  =========  ==========  =========  ==============================================
``ram``           4.00       25e9        10 us      host DRAM share of a cloud GPU node; PCIe 5 x16
``nvme``          0.10       5e9         100 us     local NVMe SSD (cloud local-SSD list price)
``redis``         12.00      2.5e9       500 us     managed in-memory cache per GiB, 25 GbE
``s3``            0.023      1e9         30 ms      object storage (Standard); request fees ignored
================  =========  ==========  =========  ==============================================

A disk kind (``nvme``) may say how many drives a node carries and how large each is::

    {"tiers": {"nvme": {"drives": 4, "drive_bytes": "3.5TiB"}}}

``drives`` > 1 makes the planned tier a striped ``fs`` tier (``root_dirs``, one root per drive, each
with its share of the blocks); ``drive_bytes`` bounds the sizes searched at ``drives x drive_bytes``.
``load_bandwidth`` stays the tier's (all drives together).

GPU default: 10,000 prefill tokens per second (kvtier's cost-model default: a 7-8B model on one
datacenter GPU, order of magnitude) at $2.50 per GPU-hour.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtier.config import parse_size
from kvtier.errors import ConfigError
from kvtier.numbers import NONNEGATIVE, POSITIVE, Range, check_bandwidth, check_number

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_KINDS",
    "HOURS_PER_MONTH",
    "GpuSpec",
    "Menu",
    "TierKind",
    "load_menu",
    "menu_from_mapping",
]

#: Hours in the month that prices are quoted for (365 * 24 / 12).
HOURS_PER_MONTH = 730.0


@dataclass(frozen=True, slots=True)
class TierKind:
    """One kind of storage on the menu.

    Attributes:
        name: ``ram`` (the primary tier), ``nvme``, ``redis`` or ``s3``.
        price_per_gib_month: dollars per GiB of capacity per month.
        load_bandwidth: bytes per second when loading blocks back to the GPU node.
        load_latency: seconds per load job, whatever its size.
        assumption: what the figure stands for (one line, for reports and docs).
        source: ``"default"`` or ``"menu"`` (overridden from a file).
        drives: drives a node carries for this kind (>1: a striped ``fs`` tier, one root each).
        drive_bytes: capacity of one drive (``None``: unbounded); bounds the sizes searched.
    """

    name: str
    price_per_gib_month: float
    load_bandwidth: float
    load_latency: float
    assumption: str
    source: str = "default"
    drives: int = 1
    drive_bytes: int | None = None

    def load_seconds(self, nbytes: int) -> float:
        """Seconds to load ``nbytes`` in one job."""
        return self.load_latency + nbytes / self.load_bandwidth


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """The GPU whose prefill a hit saves: its prefill rate and its price."""

    prefill_tokens_per_second: float = 10_000.0
    price_per_hour: float = 2.50
    source: str = "default"

    @property
    def prefill_seconds_per_token(self) -> float:
        return 1.0 / self.prefill_tokens_per_second


DEFAULT_KINDS: Mapping[str, TierKind] = {
    "ram": TierKind("ram", 4.00, 25e9, 10e-6, "host DRAM share of a cloud GPU node; PCIe 5 x16 to the GPU"),
    "nvme": TierKind("nvme", 0.10, 5e9, 100e-6, "local NVMe SSD at cloud local-SSD list price"),
    "redis": TierKind("redis", 12.00, 2.5e9, 500e-6, "managed in-memory cache, price per GiB; 25 GbE"),
    "s3": TierKind("s3", 0.023, 1e9, 30e-3, "object storage (Standard class); request fees not modelled"),
}
DEFAULT_GPU = GpuSpec()


@dataclass(frozen=True)
class Menu:
    """Tier kinds by name (fastest first) and the GPU."""

    kinds: Mapping[str, TierKind] = field(default_factory=lambda: dict(DEFAULT_KINDS))
    gpu: GpuSpec = DEFAULT_GPU

    def kind(self, name: str) -> TierKind:
        try:
            return self.kinds[name]
        except KeyError:
            raise ConfigError(
                "--tiers", f"unknown tier kind {name!r}; the menu has {', '.join(self.kinds)}"
            ) from None

    def with_drives(
        self, name: str, drives: Any = None, drive_bytes: Any = None, *, where: tuple[str, str]
    ) -> Menu:
        """This menu with kind ``name``'s drives (and drive size) replaced, checked; errors name
        ``where`` (the options or file keys that gave the two figures)."""
        if drives is None and drive_bytes is None:
            return self
        k = self.kind(name)
        if name == "ram":
            raise ConfigError(where[0], "ram is the primary tier; drives apply to a disk kind such as nvme")
        return Menu(
            {
                **self.kinds,
                name: dataclasses.replace(
                    k,
                    drives=k.drives if drives is None else _drives(drives, where[0]),
                    drive_bytes=k.drive_bytes if drive_bytes is None else _drive_bytes(drive_bytes, where[1]),
                    source="menu",
                ),
            },
            self.gpu,
        )

    def with_gpu(self, **changes: Any) -> Menu:
        """This menu with GPU figures replaced (command-line options), labelled ``menu``."""
        given = {k: v for k, v in changes.items() if v is not None}
        if not given:
            return self
        return dataclasses.replace(self, gpu=dataclasses.replace(self.gpu, **given, source="menu"))

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu": dataclasses.asdict(self.gpu),
            "tiers": {n: dataclasses.asdict(k) for n, k in self.kinds.items()},
            "hours_per_month": HOURS_PER_MONTH,
        }


_KIND_KEYS = ("price_per_gib_month", "load_bandwidth", "load_latency", "drives", "drive_bytes")
#: Most drives one kind may stripe over (the fs tier's limit on ``root_dirs``).
MAX_DRIVES = 64
_GPU_KEYS = ("prefill_tokens_per_second", "price_per_hour")


def _number(value: Any, key: str, *, positive: bool = True) -> float:
    """A menu figure: finite, > 0 (``>= 0`` for prices and latencies); kvtier.numbers' one check."""
    return float(check_number(key, value, POSITIVE if positive else NONNEGATIVE))


#: Drives one node holds.
_DRIVES = Range(1, MAX_DRIVES, integer=True, unit="drives")


def _drives(value: Any, key: str) -> int:
    return int(check_number(key, value, _DRIVES))


def _drive_bytes(value: Any, key: str) -> int:
    size = parse_size(value, key)
    if size <= 0:
        raise ConfigError(key, f"expected a drive size > 0 such as 3.5TiB, got {value!r}")
    return size


def _check_keys(raw: Mapping[str, Any], valid: tuple[str, ...], path: str) -> None:
    for key in raw:
        if key not in valid:
            raise ConfigError(f"{path}.{key}", f"unknown key; valid keys are: {', '.join(valid)}")


def menu_from_mapping(raw: Mapping[str, Any], base: Menu | None = None, *, where: str = "menu") -> Menu:
    """``base`` (the defaults) with the figures in ``raw`` replaced; errors name ``where.key``."""
    menu = base or Menu()
    _check_keys(raw, ("gpu", "tiers"), where)
    kinds = dict(menu.kinds)
    tiers = raw.get("tiers", {})
    if not isinstance(tiers, Mapping):
        raise ConfigError(f"{where}.tiers", "expected an object keyed by tier kind (ram, nvme, redis, s3)")
    for name, spec in tiers.items():
        path = f"{where}.tiers.{name}"
        if name not in kinds:
            raise ConfigError(path, f"unknown tier kind; the menu has {', '.join(kinds)}")
        if not isinstance(spec, Mapping):
            raise ConfigError(path, "expected an object such as {price_per_gib_month: 0.1}")
        _check_keys(spec, _KIND_KEYS, path)
        k = kinds[name]
        kinds[name] = dataclasses.replace(
            k,
            price_per_gib_month=_number(
                spec["price_per_gib_month"], f"{path}.price_per_gib_month", positive=False
            )
            if "price_per_gib_month" in spec
            else k.price_per_gib_month,
            load_bandwidth=check_bandwidth(f"{path}.load_bandwidth", spec["load_bandwidth"])
            if "load_bandwidth" in spec
            else k.load_bandwidth,
            load_latency=_number(spec["load_latency"], f"{path}.load_latency", positive=False)
            if "load_latency" in spec
            else k.load_latency,
            source="menu",
        )
        if "drives" in spec or "drive_bytes" in spec:
            menu = Menu(kinds, menu.gpu).with_drives(
                name,
                spec.get("drives"),
                spec.get("drive_bytes"),
                where=(f"{path}.drives", f"{path}.drive_bytes"),
            )
            kinds = dict(menu.kinds)
    gpu = menu.gpu
    graw = raw.get("gpu", {})
    if not isinstance(graw, Mapping):
        raise ConfigError(f"{where}.gpu", "expected an object such as {prefill_tokens_per_second: 10000}")
    _check_keys(graw, _GPU_KEYS, f"{where}.gpu")
    if graw:
        rate = graw.get("prefill_tokens_per_second", gpu.prefill_tokens_per_second)
        price = graw.get("price_per_hour", gpu.price_per_hour)
        gpu = GpuSpec(
            _number(rate, f"{where}.gpu.prefill_tokens_per_second"),
            _number(price, f"{where}.gpu.price_per_hour", positive=False),
            source="menu",
        )
    return Menu(kinds, gpu)


def load_menu(path: str | Path | None) -> Menu:
    """The default menu, with the figures of a JSON/YAML file (``--menu``) applied when given."""
    if path is None:
        return Menu()
    from kvtier.config.files import read_object_file

    raw = read_object_file(path, "--menu", what="menu file", expected="an object with 'gpu' and/or 'tiers'")
    return menu_from_mapping(raw, where=Path(path).name)
