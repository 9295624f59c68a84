"""What a replay measured, as a value (``ReplayReport``), as JSON and as printable tables.

Hit-ratio definitions (all over the replayed requests):

* ``block``: block references answered HIT or HIT_PENDING by the engine (any tier) / all references;
* ``prefix``: blocks in each request's *leading* run of hits / all references — what a prefix cache
  can actually reuse (a hit after the first miss saves no prefill);
* ``token``: input tokens of hit blocks / all input tokens (the last block of a request may be partial);
* ``prefix_token``: input tokens of leading-run hits / all input tokens.

A tier's ``hit_ratio`` is its hits / all block references, so the tiers' ratios add up to the block hit
ratio (the primary tier is listed first, as ``primary``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtier.tables import TextTable

__all__ = ["LATENCY_TITLE", "ReplayReport", "TierReport", "percentiles", "report_tables", "sweep_tables"]


@dataclass(slots=True)
class TierReport:
    """Counters of one tier over a replay (from ``engine.stats()``)."""

    name: str
    type: str
    hits: int = 0
    hit_ratio: float = 0.0
    lookups: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    evictions: int = 0
    corrupt: int = 0
    dropped_stores: int = 0
    failed_jobs: int = 0


@dataclass(slots=True)
class ReplayReport:
    """Result of one replay (see the module docstring for the ratio definitions)."""

    trace: str
    mode: str
    policy: str
    capacity_blocks: int
    requests: int = 0
    block_refs: int = 0
    unique_blocks: int = 0
    tokens: int = 0
    block_hits: int = 0
    prefix_hits: int = 0
    token_hits: int = 0
    prefix_token_hits: int = 0
    tiers: list[TierReport] = field(default_factory=list)
    verify_mismatches: int = 0
    verified_blocks: int = 0
    failed_loads: int = 0
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    opt: dict[str, float] | None = None
    infinite: dict[str, float] = field(default_factory=dict)
    elapsed_seconds: float = 0.0
    engine_seconds: float = 0.0
    semantics: str = "engine"
    notes: list[str] = field(default_factory=list)

    @property
    def hit_ratio(self) -> dict[str, float]:
        """Each of :attr:`hits` over block references (``block``, ``prefix``) or over input tokens."""
        refs = max(self.block_refs, 1)
        toks = max(self.tokens, 1)
        return {name: n / (toks if name.endswith("token") else refs) for name, n in self.hits.items()}

    @property
    def refs_per_second(self) -> float:
        """Block references per second through the engine (trace parsing and keying excluded)."""
        return self.block_refs / self.engine_seconds if self.engine_seconds > 0 else 0.0

    @property
    def hits(self) -> dict[str, int]:
        """The ``<name>_hits`` counters by name: ``block``, ``prefix``, ``token``, ``prefix_token``."""
        return {name: getattr(self, f"{name}_hits") for name in _HIT_NAMES}

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object (stable keys, in :data:`_JSON_KEYS` order; see docs/replay.md)."""
        doc = {key: getattr(self, key) for key in _JSON_KEYS}
        doc["tiers"] = [asdict(t) for t in self.tiers]
        doc["notes"] = list(self.notes)
        return doc


_HIT_NAMES = ("block", "prefix", "token", "prefix_token")
#: ``ReplayReport.to_json``'s keys in order: fields and properties of the report.
_JSON_KEYS = (
    "trace",
    "mode",
    "semantics",
    "policy",
    "capacity_blocks",
    "requests",
    "block_refs",
    "unique_blocks",
    "tokens",
    "hit_ratio",
    "hits",
    "tiers",
    "verify_mismatches",
    "verified_blocks",
    "failed_loads",
    "latency",
    "cost",
    "opt",
    "infinite",
    "elapsed_seconds",
    "engine_seconds",
    "refs_per_second",
    "notes",
)


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean of ``samples`` in milliseconds (empty -> zeros)."""
    import numpy as np

    if not samples:
        return {"p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "mean_ms": 0.0, "count": 0}
    a = np.asarray(samples, dtype=np.float64) * 1e3
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "p50_ms": float(p50),
        "p90_ms": float(p90),
        "p99_ms": float(p99),
        "max_ms": float(a.max()),
        "mean_ms": float(a.mean()),
        "count": int(a.size),
    }


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - loop always returns


def report_tables(report: ReplayReport) -> list[TextTable | str]:
    """``report`` as the CLI prints it: a summary, notes, a per-tier table and a latency table.

    Plain values (:class:`kvtier.tables.TextTable`); :func:`kvtier.cli.output.emit` prints them with
    rich when it is installed and as aligned text otherwise. No text is read as markup.
    """
    from kvtier.tables import TextTable

    hr = report.hit_ratio
    summary = TextTable(
        f"kvtier replay — {report.trace} ({report.mode}, {report.policy})",
        ["what", "value"],
        right=frozenset({"value"}),
        show_header=False,
    )
    summary.add_row("requests", f"{report.requests:,}")
    summary.add_row("block references", f"{report.block_refs:,} ({report.unique_blocks:,} unique)")
    summary.add_row("primary capacity", f"{report.capacity_blocks:,} blocks")
    summary.add_row("block hit ratio", _pct(hr["block"]))
    summary.add_row("prefix hit ratio", _pct(hr["prefix"]))
    summary.add_row("token hit ratio", _pct(hr["token"]))
    if report.opt is not None:
        summary.add_row("OPT (Belady) at primary capacity", _pct(report.opt["block"]))
    if report.infinite:
        summary.add_row("infinite cache block hit ratio", _pct(report.infinite["block"]))
    if report.mode == "real":
        verified = f"{report.verified_blocks:,} / {report.verify_mismatches}"
        summary.add_row("verified blocks / mismatches", verified)
    if report.cost:
        summary.add_row(
            "projected prefill saved",
            f"{report.cost['saved_seconds']:.1f} s of {report.cost['prefill_seconds']:.1f} s "
            f"({_pct(report.cost['saved_fraction'])})",
        )
    summary.add_row("elapsed", f"{report.elapsed_seconds:.2f} s ({report.refs_per_second:,.0f} refs/s)")
    out: list[TextTable | str] = [summary]
    out += [f"note: {note}" for note in report.notes]

    cols = ["tier", "type", "hits", "hit ratio", "read", "written", "evictions", "corrupt", "dropped"]
    tiers = TextTable("per tier", cols, right=frozenset(cols[2:]))
    for t in report.tiers:
        tiers.add_row(
            t.name,
            t.type,
            f"{t.hits:,}",
            _pct(t.hit_ratio),
            _bytes(t.bytes_read),
            _bytes(t.bytes_written),
            f"{t.evictions:,}",
            str(t.corrupt),
            f"{t.dropped_stores:,}",
        )
    out.append(tiers)
    if report.latency:
        cols = ["operation", "p50", "p90", "p99", "max", "count"]
        lat = TextTable(LATENCY_TITLE, cols, right=frozenset(cols[1:]))
        for op, p in report.latency.items():
            cells = [f"{p[k]:.3f}" for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")]
            lat.add_row(op, *cells, f"{int(p['count']):,}")
        out.append(lat)
    return out


#: Title of the latency table (``load[t]`` is literal text, never markup).
LATENCY_TITLE = "latency per request (ms); load[t]: requests whose slowest hits came from t"


def sweep_tables(rows: Sequence[Mapping[str, Any]]) -> list[TextTable | str]:
    """A sweep (one row per capacity) with one column per policy plus OPT and infinite."""
    from kvtier.tables import TextTable

    if not rows:
        return []
    policies = list(rows[0]["policies"])
    cols = ["capacity", "blocks", *policies, "OPT", "infinite"]
    table = TextTable("block hit ratio by capacity and policy", cols, right=frozenset(cols[1:]))
    for row in rows:
        table.add_row(
            row["capacity"],
            f"{row['capacity_blocks']:,}",
            *(_pct(row["policies"][p]["hit_ratio"]["block"]) for p in policies),
            _pct(row["opt"]["block"]) if row.get("opt") else "-",
            _pct(row["infinite"]["block"]),
        )
    return [table]
