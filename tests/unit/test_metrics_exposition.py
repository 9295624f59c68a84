"""What kvtier exports to Prometheus: names linted by prometheus_client's own parsers, every family
present, the collector on any registry, a real engine's counters, and the Grafana dashboard.

Real parts: a real :class:`~kvtier.engine.Engine` with the example and fs tiers, prometheus_client's
registries, exposition and parsers (text format and the stricter OpenMetrics one), real HTTP on
127.0.0.1 (the exporter a real-mode ``replay`` serves on port 0, scraped while it runs). The naming
and shape checks use a stats mapping carrying every optional entry, so that a family a real engine
leaves empty (no corrupt block, say) is linted too.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from needs import need_module

need_module("prometheus_client", "metrics")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.openmetrics import exposition as om_exposition  # noqa: E402
from prometheus_client.openmetrics import parser as om_parser  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import kvtier  # noqa: E402
from kvtier.engine import Engine  # noqa: E402
from kvtier.keys import BlockKey, LookupResult  # noqa: E402
from kvtier.metrics import FAMILIES, METRICS, register_collector, start_exporter  # noqa: E402
from kvtier.tiers.base import TierContext  # noqa: E402
from kvtier.tiers.example import ExampleTier  # noqa: E402

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana-dashboard.json"
BLOCK = 4096


def full_stats() -> dict[str, Any]:
    """Stats carrying every optional entry the collector reads (what a future engine reports)."""
    return {
        "lookups": 100, "hits": 30, "evictions": 7, "dropped_stores": 1, "tier_errors": 4,
        "promotions": 9, "promotions_failed": 1, "promotions_rejected": 2, "promotions_skipped_cost": 3,
        "jobs_inflight": 5, "promotions_inflight": 1, "deferred_stores": 2, "tier_stores_dropped": 6,
        "primary": {"hits": 30, "lookups": 100, "num_slots": 64, "resident": 50, "row_stride": BLOCK},
        "tiers": {
            "fs0": {
                "lookups": 70, "hits": 12, "bytes_read": 12 * BLOCK, "bytes_written": 60 * BLOCK,
                "evictions": 3, "corrupt": 1, "dropped_stores": 0, "failed_jobs": 2, "loads": 12,
                "promotions": 12, "read_seconds": 0.5, "write_seconds": 1.5, "inflight_jobs": 3, "errors": 4,
                "used_bytes": 48 * BLOCK, "max_bytes": 1000 * BLOCK, "gate_state": 1, "gate_throttled": 5,
                "root0_used_bytes": 20 * BLOCK, "root1_used_bytes": 28 * BLOCK,
                "root0_max_bytes": 500 * BLOCK, "root1_max_bytes": 500 * BLOCK,
                "root0_fenced": 0, "root1_fenced": 1, "root0_errors": 0,
                "root1_errors": 7, "root0_timeouts": 0, "root1_timeouts": 2,
            }
        },
        "latency": {
            "fs0": {
                "load": {"buckets": [[0.001, 2], [0.01, 9], [0.1, 12]], "sum": 0.05, "count": 12},
                "store": {"buckets": [[0.001, 0], [0.01, 30], [0.1, 60]], "sum": 1.5, "count": 61},
            },
            "primary": {"lookup": {"buckets": [[1e-5, 90], [1e-4, 100]], "sum": 0.001, "count": 100}},
        },
    }  # fmt: skip


def exposition(stats: Any, **labels: str) -> tuple[str, str]:
    reg = CollectorRegistry(auto_describe=True)
    register_collector(lambda: stats, reg, const_labels=labels or None)
    return generate_latest(reg).decode(), om_exposition.generate_latest(reg).decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


# -- names and types -------------------------------------------------------------------------------


def test_every_family_is_exported_with_its_declared_type_and_labels() -> None:
    text, _ = exposition(full_stats())
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name, kind, labels in METRICS:
        base = name.removesuffix("_total") if kind == "counter" else name
        assert base in fams, f"{name} not exported"
        fam = fams[base]
        assert fam.type == kind, (name, fam.type)
        assert fam.samples, f"{name} has no samples although the stats carry its source"
        for s in fam.samples:
            got = set(s.labels) - {"le"}
            assert got == set(labels), (name, s.labels)
    assert set(fams) == {n.removesuffix("_total") if k == "counter" else n for n, k, _ in METRICS}


def test_names_follow_prometheus_conventions_and_parse_strictly() -> None:
    text, om = exposition(full_stats(), instance="a")
    # The OpenMetrics parser rejects bad names, suffixes, label names, histogram shapes and types.
    om_fams = list(om_parser.text_string_to_metric_families(om))
    assert len(om_fams) == len(METRICS)
    for name, kind, labels in METRICS:
        assert re.fullmatch(r"kvtier_[a-z][a-z0-9_]*", name), name
        assert (kind == "counter") == name.endswith("_total"), f"{name}: only counters end in _total"
        assert not name.endswith(("_count", "_sum", "_bucket", "_created")), name
        assert "le" not in labels and "quantile" not in labels and not any(x.startswith("__") for x in labels)
        # Base units only: seconds and bytes, never ms / KiB.
        assert not re.search(r"_(ms|milliseconds|kib|mib|kb|mb)(_|$)", name), name
        if "seconds" in name or "duration" in name:
            assert re.search(r"_seconds(_total)?$", name), name
        if kind == "gauge" and name.endswith("_info"):
            assert labels, "an _info metric carries its information in labels"
    assert all(s.labels["instance"] == "a" for f in text_string_to_metric_families(text) for s in f.samples)


def test_histograms_are_cumulative_with_inf_bucket_sum_and_count() -> None:
    text, _ = exposition(full_stats())
    got = samples(text)
    load = (("operation", "load"), ("tier", "fs0"))

    def bucket(le: str) -> float:
        return got[("kvtier_operation_duration_seconds_bucket", tuple(sorted((*load, ("le", le)))))]

    assert [bucket(le) for le in ("0.001", "0.01", "0.1", "+Inf")] == [2, 9, 12, 12]
    assert got[("kvtier_operation_duration_seconds_count", load)] == 12
    assert got[("kvtier_operation_duration_seconds_sum", load)] == pytest.approx(0.05)
    lookup = (("operation", "lookup"), ("tier", "primary"))
    assert got[("kvtier_operation_duration_seconds_count", lookup)] == 100


def test_per_tier_inflight_errors_promotions_and_fs_bytes() -> None:
    got = samples(exposition(full_stats())[0])
    fs0 = (("tier", "fs0"),)
    # The old collector exported only the engine total, as tier="all".
    assert got[("kvtier_inflight_jobs", fs0)] == 3
    assert not any(k[0] == "kvtier_inflight_jobs" and ("tier", "all") in k[1] for k in got)
    assert got[("kvtier_engine_inflight_jobs", ())] == 5
    assert got[("kvtier_tier_errors_total", fs0)] == 4 and got[("kvtier_engine_tier_errors_total", ())] == 4
    assert got[("kvtier_promotions_total", fs0)] == 12
    assert got[("kvtier_engine_promotions_total", (("result", "rejected"),))] == 2
    assert got[("kvtier_tier_used_bytes", fs0)] == 48 * BLOCK
    assert got[("kvtier_tier_max_bytes", fs0)] == 1000 * BLOCK
    assert got[("kvtier_store_gate_state", fs0)] == 1 and got[("kvtier_store_gate_throttled_total", fs0)] == 5
    r0, r1 = (("root", "0"), *fs0), (("root", "1"), *fs0)  # labels sorted by name
    assert got[("kvtier_root_fenced", r1)] == 1 and got[("kvtier_root_errors_total", r1)] == 7
    assert got[("kvtier_root_used_bytes", r0)] == 20 * BLOCK and got[("kvtier_root_fenced", r0)] == 0
    assert got[("kvtier_tier_used_bytes", (("tier", "primary"),))] == 50 * BLOCK
    assert got[("kvtier_tier_max_bytes", (("tier", "primary"),))] == 64 * BLOCK
    assert got[("kvtier_engine_throttled_stores_total", ())] == 6
    assert got[("kvtier_engine_deferred_stores", ())] == 2
    assert got[("kvtier_build_info", (("python", __import__("platform").python_version()),
                                      ("version", kvtier.__version__)))] == 1  # fmt: skip


def test_malformed_latency_entries_are_skipped_not_fatal() -> None:
    stats = full_stats()
    stats["latency"] = {"fs0": {"load": {"buckets": [["x", 1]]}, "store": "nope"}, "primary": 3}
    got = samples(exposition(stats)[0])
    assert not any(k[0].startswith("kvtier_operation_duration") for k in got)
    assert got[("kvtier_lookups_total", ())] == 100


# -- a real engine ---------------------------------------------------------------------------------


def _keys(n: int) -> list[BlockKey]:
    return [BlockKey(f"m/{i}".encode()) for i in range(n)]


def test_real_engine_on_a_host_registry(tmp_path: Path) -> None:
    config = {
        "cpu_bytes_to_use": 4 * BLOCK, "block_bytes": BLOCK,
        "secondary_tiers": [
            {"type": "fs", "root_dir": str(tmp_path / "fs"), "max_bytes": "1MiB"},
            {"type": "example"},
        ],
    }  # fmt: skip
    host = CollectorRegistry()  # stands for vLLM's prometheus_client.REGISTRY
    with Engine(config) as e:
        collector = register_collector(e, host)
        keys = _keys(6)
        data = np.arange(6 * BLOCK, dtype=np.uint64).astype(np.uint8).reshape(6, BLOCK)
        for lo in (0, 3):
            assert e.store_blocks(keys[lo : lo + 3], data[lo : lo + 3]) == 3
            e.drain()
        e.lookup(keys[:2])  # evicted from the primary tier: promoted from fs0
        inflight = samples(generate_latest(host).decode())  # the promotion job is not reported yet
        e.drain()
        e.lookup(keys)
        st = e.stats()
        got = samples(generate_latest(host).decode())
        host.unregister(collector)
    assert got[("kvtier_lookups_total", ())] == st["lookups"] > 0
    for name, t in st["tiers"].items():
        assert got[("kvtier_hits_total", (("tier", name),))] == t["hits"]
        for direction, key in (("read", "read_seconds"), ("write", "write_seconds")):
            sample = ("kvtier_transfer_seconds_total", (("direction", direction), ("tier", name)))
            assert got[sample] == pytest.approx(t[key])
    # The primary tier's stores were timed (store_blocks); nothing was copied out of it, so its
    # read direction has no series rather than a constant 0 pretending it is infinitely fast.
    primary_write = ("kvtier_transfer_seconds_total", (("direction", "write"), ("tier", "primary")))
    assert got[primary_write] == pytest.approx(st["primary"]["write_seconds"]) and got[primary_write] > 0
    assert (primary_write[0], (("direction", "read"), ("tier", "primary"))) not in got
    # fs capacity and bytes on disk from the tier itself.
    fs0 = (("tier", "fs0"),)
    assert got[("kvtier_tier_max_bytes", fs0)] == 1 << 20
    assert got[("kvtier_tier_used_bytes", fs0)] == st["tiers"]["fs0"]["used_bytes"] > 3 * BLOCK
    # Per tier: in flight while the promotion was pending, none after; promotions where they came from.
    assert inflight[("kvtier_inflight_jobs", fs0)] == 1 and got[("kvtier_inflight_jobs", fs0)] == 0
    assert got[("kvtier_inflight_jobs", (("tier", "primary"),))] == 0
    assert got[("kvtier_promotions_total", fs0)] == st["tiers"]["fs0"]["promotions"] == st["promotions"] > 0
    assert got[("kvtier_promotions_total", (("tier", "example1"),))] == 0
    assert got[("kvtier_tier_errors_total", fs0)] == 0
    # Histograms per tier and operation, fed by the engine's own timings.
    for tier, op in (("primary", "lookup"), ("primary", "store"), ("fs0", "store"), ("fs0", "load")):
        lab = (("operation", op), ("tier", tier))
        assert got[("kvtier_operation_duration_seconds_count", lab)] == st["latency"][tier][op]["count"] > 0
        assert got[("kvtier_operation_duration_seconds_sum", lab)] == pytest.approx(
            st["latency"][tier][op]["sum"]
        )
        inf = ("kvtier_operation_duration_seconds_bucket", tuple(sorted((*lab, ("le", "+Inf")))))
        assert got[inf] == st["latency"][tier][op]["count"]
    assert got[("kvtier_primary_slots", ())] == 4
    assert got[("kvtier_engine_inflight_jobs", ())] == st["jobs_inflight"]
    assert got[("kvtier_build_info", (("python", __import__("platform").python_version()),
                                      ("version", kvtier.__version__)))] == 1  # fmt: skip


def _real_stats(tmp_path: Path) -> dict[str, Any]:
    """``stats()`` of a real engine (fs + example tiers) after stores, evictions and a promotion."""
    config = {
        "cpu_bytes_to_use": 4 * BLOCK, "block_bytes": BLOCK,
        "secondary_tiers": [
            {"type": "fs", "root_dir": str(tmp_path / "fs"), "max_bytes": "1MiB"},
            {"type": "example"},
            # Two roots: the per-root families have samples too.
            {"type": "fs", "root_dirs": [str(tmp_path / "r0"), str(tmp_path / "r1")], "max_bytes": "1MiB"},
        ],
    }  # fmt: skip
    with Engine(config) as e:
        keys = _keys(6)
        data = np.arange(6 * BLOCK, dtype=np.uint64).astype(np.uint8).reshape(6, BLOCK)
        for lo in (0, 3):
            e.store_blocks(keys[lo : lo + 3], data[lo : lo + 3])
            e.drain()
        e.lookup(keys)
        e.drain()
        return e.stats()


def _holders(stats: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """The mappings of ``stats`` that hold the last part of ``path`` (``tiers.*``: every tier's)."""
    *parents, _ = path.split(".")
    level: list[dict[str, Any]] = [stats]
    for part in parents:
        level = [v for d in level for v in (d.values() if part == "*" else [d[part]])]
    return level


def test_every_family_is_fed_by_fields_a_real_engine_reports(tmp_path: Path) -> None:
    """Each family's declared ``fields`` exist in a real engine's ``stats()`` (in at least one tier
    for ``tiers.*``), and changing one changes that family's samples: no family reads a name the
    engine never emits, none declares a field it does not read."""
    import copy

    stats = _real_stats(tmp_path)
    for fam in FAMILIES:
        for path in fam.fields:
            leaf = path.split(".")[-1]
            # TierReport.roots gathers a tier's root<N>_<stat> entries.
            keys = (lambda d: [k for k in d if re.fullmatch(r"root\d+_\w+", k)]) if leaf == "roots" else (
                lambda d, leaf=leaf: [leaf] if leaf in d else []
            )  # fmt: skip
            holders = [d for d in _holders(stats, path) if keys(d)]
            assert holders, f"{fam.name} reads {path}, which the engine does not report"
            changed = copy.deepcopy(stats)
            for d in _holders(changed, path):
                for k in keys(d):
                    d[k] = {} if k == "latency" else 12345
            before = [x for x in exposition(stats)[0].splitlines() if x.startswith(fam.base)]
            after = [x for x in exposition(changed)[0].splitlines() if x.startswith(fam.base)]
            assert before != after, f"{fam.name} does not change with {path}"


def test_every_family_field_is_a_field_of_the_typed_stats() -> None:
    """The collector reads :class:`kvtier.stats.EngineStats` field by field: each declared source is
    one of its fields (``primary.x``: PrimaryStats, ``tiers.*.x``: TierReport)."""
    import dataclasses

    from kvtier.stats import EngineStats, PrimaryStats, TierReport

    names = {
        "": {f.name for f in dataclasses.fields(EngineStats)},
        "primary": {f.name for f in dataclasses.fields(PrimaryStats)},
        "tiers.*": {f.name for f in dataclasses.fields(TierReport)},
    }
    for fam in FAMILIES:
        for path in fam.fields:
            owner, _, leaf = path.rpartition(".")
            assert leaf in names[owner], f"{fam.name}: {path} is no field of the typed stats"


def test_families_are_declared_once_and_documented() -> None:
    """METRICS is FAMILIES' view; the module docstring's table lists exactly the same names."""
    import kvtier.metrics as m

    assert [(f.name, f.kind, f.labels) for f in FAMILIES] == list(METRICS)
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)
    documented = set(re.findall(r"``(kvtier_[a-z_]+)``", m.__doc__ or ""))
    assert documented == {f.name for f in FAMILIES}


def test_real_replay_endpoint_serves_histograms_and_per_tier_series(tmp_path: Path) -> None:
    """``replay`` with metrics port 0 (what ``kvtier replay --metrics-port 0`` runs), real mode with
    fs + example tiers, scraped over HTTP after the last request and before the engine closes."""
    from kvtier.config import load_config
    from kvtier.keys import KeyNamespace
    from kvtier.sim.replay import prepare_trace, replay
    from kvtier.sim.trace import TraceRequest

    config = load_config({
        "cpu_bytes_to_use": 16 * BLOCK, "block_bytes": BLOCK,
        "secondary_tiers": [
            {"type": "fs", "root_dir": str(tmp_path / "fs"), "max_bytes": "1MiB"},
            {"type": "example"},
        ],
    })  # fmt: skip
    # 40 prefixes of 4 blocks, each asked three times: the 16-slot primary tier cannot hold them all.
    requests = [
        TraceRequest(timestamp_ms=i, blocks=tuple(range(4 * (i % 40), 4 * (i % 40) + 4))) for i in range(120)
    ]
    trace = prepare_trace(requests, KeyNamespace.from_config(config, block_size=16), name="t")
    urls: list[str] = []
    scraped: list[str] = []

    def hook(engine: Any, done: int, exporter: Any) -> None:
        if done == trace.requests:
            with urllib.request.urlopen(urls[0], timeout=5) as resp:
                scraped.append(resp.read().decode())

    rep = replay(trace, config, metrics_port=0, on_listen=urls.append, hook=hook, sync=True)
    assert rep.mode == "real" and scraped
    fams = {f.name: f for f in text_string_to_metric_families(scraped[-1])}
    got = samples(scraped[-1])
    hist = fams["kvtier_operation_duration_seconds"]
    assert hist.type == "histogram"
    counts = {
        (s.labels["tier"], s.labels["operation"]): s.value for s in hist.samples if s.name.endswith("_count")
    }
    assert counts[("primary", "lookup")] == trace.requests
    assert counts[("primary", "store")] > 0 and counts[("primary", "load")] > 0
    assert counts[("fs0", "store")] > 0 and counts[("fs0", "load")] > 0 and counts[("example1", "store")] > 0
    for s in hist.samples:  # plausible: cumulative buckets, a mean between 0 and a minute
        if s.name.endswith("_sum"):
            key = (s.labels["tier"], s.labels["operation"])
            assert 0 <= s.value < 60 * max(counts[key], 1)
    for (tier, op), n in counts.items():
        lab = (("operation", op), ("tier", tier))
        les = sorted(
            (float(dict(k[1])["le"]), v)
            for k, v in got.items()
            if k[0] == "kvtier_operation_duration_seconds_bucket" and set(lab) <= set(k[1])
        )
        assert [v for _, v in les] == sorted(v for _, v in les) and les[-1] == (float("inf"), n)
    fs0 = (("tier", "fs0"),)
    assert got[("kvtier_promotions_total", fs0)] > 0
    assert got[("kvtier_tier_errors_total", fs0)] == 0
    assert got[("kvtier_inflight_jobs", fs0)] == 0  # sync replay: every job reported
    assert 0 < got[("kvtier_tier_used_bytes", fs0)] <= got[("kvtier_tier_max_bytes", fs0)] == 1 << 20
    for direction in ("read", "write"):
        sample = ("kvtier_transfer_seconds_total", (("direction", direction), ("tier", "primary")))
        assert 0 < got[sample] < rep.elapsed_seconds


def test_exporter_on_port_zero_reports_its_url_and_serves() -> None:
    with start_exporter(full_stats) as exp:
        assert exp.port > 0 and exp.url == f"http://127.0.0.1:{exp.port}/metrics"
        with urllib.request.urlopen(exp.url, timeout=5) as resp:
            text = resp.read().decode()
    assert samples(text)[("kvtier_hits_total", (("tier", "fs0"),))] == 12


# -- the Grafana dashboard -------------------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _families_in(expr: str) -> set[str]:
    names = set(re.findall(r"\bkvtier_[a-z0-9_]+", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", n) if "duration_seconds" in n else n for n in names}


def test_dashboard_queries_exactly_the_exported_families() -> None:
    exported = {n for n, _, _ in METRICS}
    text, _ = exposition(full_stats())
    on_the_wire = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    used: set[str] = set()
    for p in _dashboard()["panels"]:
        for t in p["targets"]:
            raw = set(re.findall(r"\bkvtier_[a-z0-9_]+", t["expr"]))
            assert raw <= on_the_wire, f"panel {p['title']!r} queries {sorted(raw - on_the_wire)}"
            used |= _families_in(t["expr"])
    assert used <= exported
    assert exported <= used, f"exported but on no panel: {sorted(exported - used)}"


def test_dashboard_declares_only_what_it_uses_and_units_fit() -> None:
    dash = _dashboard()
    text = json.dumps(dash)
    declared = {i["name"] for i in dash.get("__inputs", [])}
    referenced = set(re.findall(r"\$\{(DS_[A-Z_]+)\}", text))
    assert declared == referenced, f"inputs declared {sorted(declared)} but used {sorted(referenced)}"
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert set(re.findall(r"\$\{?([a-z_]+)\}?", text)) - {"__rate_interval", "__all"} <= variables
    for p in dash["panels"]:
        unit = p["fieldConfig"]["defaults"]["unit"]
        exprs = [t["expr"] for t in p["targets"]]
        is_ratio = re.search(r"\bratio\b", p["title"].lower()) is not None
        for e in exprs:
            # A rate of a seconds counter is seconds per second: a ratio, not a duration.
            if is_ratio or re.search(r"rate\(kvtier_[a-z_]+_seconds_total", e):
                assert unit == "percentunit", (p["title"], unit)
            if "histogram_quantile" in e or "duration_seconds_sum" in e:
                assert unit == "s", (p["title"], unit)
            if re.search(r"kvtier_[a-z_]+_bytes\b.*/.*kvtier_[a-z_]+_bytes\b", e):
                assert unit == "percentunit", (p["title"], unit)  # bytes over bytes: a share
            elif re.search(r"kvtier_[a-z_]+_bytes\b", e):
                assert unit in ("bytes", "decbytes"), (p["title"], unit)
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


# -- tier errors from a real engine; the host-registry recipe in the docs ---------------------------


class _RaisingLookupTier(ExampleTier):
    """The example tier whose lookup raises (a dead backend); its calls are answered as misses."""

    def lookup(self, key: BlockKey, req_context: Any = None) -> LookupResult:
        raise ConnectionError("backend gone")


def test_tier_errors_of_a_real_engine_are_exported_per_tier() -> None:
    def bad(view: memoryview) -> ExampleTier:
        return _RaisingLookupTier(primary_kv_view=view, context=TierContext("bad", BLOCK))

    def good(view: memoryview) -> ExampleTier:
        return ExampleTier(primary_kv_view=view, context=TierContext("good", BLOCK))

    with Engine({"cpu_bytes_to_use": 4 * BLOCK, "block_bytes": BLOCK}, tiers=[bad, good]) as e:
        e.lookup(_keys(3))
        st = e.stats()
        got = samples(exposition(e.stats())[0])
    assert got[("kvtier_tier_errors_total", (("tier", "bad"),))] == st["tiers"]["bad"]["errors"] >= 1
    assert got[("kvtier_tier_errors_total", (("tier", "good"),))] == 0
    assert got[("kvtier_engine_tier_errors_total", ())] == st["tier_errors"] == st["tiers"]["bad"]["errors"]


def test_docs_recipe_for_a_host_registry_runs_as_written() -> None:
    docs = Path(__file__).parents[2] / "docs" / "replay.md"
    blocks = [b for b in re.findall(r"```python\n(.*?)```", docs.read_text(), flags=re.S) if "REGISTRY" in b]
    assert len(blocks) == 1, "docs/replay.md shows how to register on a host's registry"
    assert "register_collector" in (Path(__file__).parents[2] / "README.md").read_text()
    # The elided serving part becomes a scrape of the host's default registry, as vLLM's /metrics does.
    probe = "assert 'kvtier_lookups_total 1.0' in __import__('prometheus_client').generate_latest().decode()"
    code = re.sub(r"^\.\.\.$", probe, blocks[0], flags=re.M)
    assert probe in code
    with Engine({"cpu_bytes_to_use": 4 * BLOCK, "block_bytes": BLOCK}) as engine:
        engine.lookup(_keys(1))
        scope: dict[str, Any] = {"engine": engine}
        exec(compile(code, str(docs), "exec"), scope)
    from prometheus_client import REGISTRY

    assert scope["collector"] not in getattr(REGISTRY, "_collector_to_names", {}), "left registered"
