"""The plug-in registry: resolution order, module_path, entry points, trust boundary, logging."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import tomllib
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvtier import plugins
from kvtier.config import load_config
from kvtier.errors import (
    ConfigError,
    PluginError,
    PluginImportError,
    PluginNotAllowedError,
    PluginTypeError,
    UnknownPluginError,
)
from kvtier.specs.tiering import TieringSpec
from kvtier.tiers.base import SecondaryTier, TierContext
from kvtier.tiers.example import ExampleTier

REPO = Path(__file__).resolve().parents[2]

TIER_SRC = '''
from kvtier.tiers.example import ExampleTier

class {cls}(ExampleTier):
    """An out-of-tree tier with options of its own."""

    def __init__(self, *, primary_kv_view, context, color, weight=1, capacity_blocks=None):
        super().__init__(primary_kv_view=primary_kv_view, context=context, capacity_blocks=capacity_blocks)
        if color == "invalid":
            from kvtier.errors import ConfigError
            raise ConfigError("color", "must be a real colour")
        self.color = color
        self.weight = weight
'''

POLICY_SRC = '''
from kvtier.policies.base import CachePolicy

class {cls}(CachePolicy):
    """A FIFO policy (enough for the registry tests)."""

    def __init__(self, capacity, *, bias=0):
        super().__init__(capacity)
        self.bias = bias
        self._keys = {{}}

    def __len__(self):
        return len(self._keys)

    def __contains__(self, key):
        return key in self._keys

    def __iter__(self):
        return iter(list(self._keys))

    def insert(self, key, info=None):
        self._keys[key] = None

    def touch(self, key):
        pass

    def remove(self, key):
        self._keys.pop(key, None)

    def evict(self, n=1, protected=(), incoming=None):
        victims = [k for k in self._keys if k not in protected][:n]
        if len(victims) < n:
            return []
        for k in victims:
            del self._keys[k]
        return victims
'''

SPEC_SRC = '''
from kvtier.specs.tiering import TieringSpec

class {cls}(TieringSpec):
    """A spec that only renames the default one."""
'''


def write_module(root: Path, source: str, *, package: str | None = None) -> str:
    """Write a uniquely named module under ``root`` and return its dotted name."""
    name = f"kvt_test_{uuid.uuid4().hex[:12]}"
    if package:
        pkg_dir = root / package
        pkg_dir.mkdir(exist_ok=True)
        (pkg_dir / "__init__.py").touch()
        (pkg_dir / f"{name}.py").write_text(textwrap.dedent(source))
        return f"{package}.{name}"
    (root / f"{name}.py").write_text(textwrap.dedent(source))
    return name


@pytest.fixture
def plugdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "plugins"
    d.mkdir()
    monkeypatch.syspath_prepend(str(d))
    return d


@pytest.fixture
def view() -> memoryview:
    return memoryview(np.zeros((8, 4096), dtype=np.uint8))


def ctx(name: str = "t0", block_bytes: int = 4096) -> TierContext:
    return TierContext(name=name, block_bytes=block_bytes)


# -- module_path -------------------------------------------------------------------------------
def test_tier_from_module_path_with_custom_kwargs(plugdir: Path, view: memoryview) -> None:
    mod = write_module(plugdir, TIER_SRC.format(cls="ColorTier"))
    assert not plugins.TIERS.is_registered("ColorTier")
    assert "ColorTier" not in plugins.TIERS.names()
    assert mod not in sys.modules
    tier = plugins.create_tier(
        {"type": "ColorTier", "module_path": mod, "color": "red", "weight": 3, "capacity_blocks": 2},
        primary_kv_view=view,
        context=ctx(),
    )
    assert type(tier).__name__ == "ColorTier"
    assert isinstance(tier, SecondaryTier)
    assert (tier.color, tier.weight, tier.capacity_blocks) == ("red", 3, 2)  # type: ignore[attr-defined]
    # Loading by module_path does not register the class: the next config must name it again.
    assert not plugins.TIERS.is_registered("ColorTier")
    assert "ColorTier" not in plugins.TIERS.names()
    assert all(info.name != "ColorTier" for info in plugins.list_plugins("tier"))


def test_module_colon_class_form(plugdir: Path, view: memoryview) -> None:
    mod = write_module(plugdir, TIER_SRC.format(cls="Inner"))
    tier = plugins.create_tier(
        {"type": "shade", "module_path": f"{mod}:Inner", "color": "blue"}, primary_kv_view=view, context=ctx()
    )
    assert type(tier).__name__ == "Inner"
    # The whole target may also be given as the type.
    tier2 = plugins.create_tier({"type": f"{mod}:Inner", "color": "green"}, primary_kv_view=view)
    assert tier2.color == "green"  # type: ignore[attr-defined]
    assert tier2.name == "Inner0"


def test_invalid_module_is_module_not_found(view: memoryview) -> None:
    missing = f"kvt_missing_{uuid.uuid4().hex[:8]}"
    with pytest.raises(ModuleNotFoundError) as info:
        plugins.create_tier({"type": "Ghost", "module_path": missing}, primary_kv_view=view, context=ctx())
    err = info.value
    assert isinstance(err, PluginImportError)
    assert err.kind == "tier" and err.plugin_name == "Ghost" and err.module == missing
    msg = str(err)
    assert "secondary_tiers[0].module_path" in msg and missing in msg and "'Ghost'" in msg and "tier" in msg


def test_missing_attribute_is_import_error(plugdir: Path, view: memoryview) -> None:
    mod = write_module(plugdir, TIER_SRC.format(cls="Present"))
    with pytest.raises(PluginImportError, match="no attribute 'Absent'"):
        plugins.create_tier({"type": "Absent", "module_path": mod}, primary_kv_view=view)


def test_syntax_error_in_plugin_module_is_import_error(plugdir: Path, view: memoryview) -> None:
    mod = write_module(plugdir, "def broken(:\n")
    with pytest.raises(PluginImportError, match="SyntaxError"):
        plugins.create_tier({"type": "X", "module_path": mod}, primary_kv_view=view)


def test_malformed_module_path_is_refused(view: memoryview) -> None:
    with pytest.raises(PluginImportError, match="not an importable module name"):
        plugins.create_tier({"type": "X", "module_path": "../etc/passwd"}, primary_kv_view=view)


def test_non_subclass_is_type_error(plugdir: Path, view: memoryview) -> None:
    mod = write_module(plugdir, "class NotATier:\n    pass\n")
    with pytest.raises(TypeError) as info:
        plugins.create_tier({"type": "NotATier", "module_path": mod}, primary_kv_view=view)
    assert isinstance(info.value, PluginTypeError)
    assert "not a subclass of kvtier.tiers.base.SecondaryTier" in str(info.value)
    with pytest.raises(PluginTypeError):
        plugins.register_tier("nope", NotATier := type("NotATier", (), {}))  # type: ignore[arg-type]
    assert NotATier is not None
    # A function is not a class either.
    mod2 = write_module(plugdir, "def make():\n    return 1\n")
    with pytest.raises(PluginTypeError, match="function object"):
        plugins.POLICIES.resolve("make", mod2)


def test_non_subclass_is_type_error_under_python_O(plugdir: Path) -> None:
    mod = write_module(plugdir, "class NotAPolicy:\n    pass\n")
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(plugdir)!r})
        from kvtier import plugins
        from kvtier.config import load_config
        from kvtier.errors import PluginTypeError
        cfg = load_config({{"eviction_policy": "NotAPolicy", "cache_policy_module_path": {mod!r}}})
        try:
            plugins.create_policy(cfg, 4)
        except TypeError as exc:
            print("TypeError", isinstance(exc, PluginTypeError), sys.flags.optimize)
        else:
            print("no error", sys.flags.optimize)
        """
    )
    out = subprocess.run(
        [sys.executable, "-O", "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "TypeError True 1", out.stderr


def test_unknown_type_lists_every_name_and_mentions_module_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, view: memoryview
) -> None:
    install_distribution(tmp_path, monkeypatch, "kvtier.tiers", "ep_tier", "ep_mod_unused:Nothing")
    plugins.register_tier("runtime_tier", ExampleTier)
    with pytest.raises(UnknownPluginError) as info:
        plugins.create_tier({"type": "exampel"}, primary_kv_view=view)
    msg = str(info.value)
    assert isinstance(info.value, LookupError)
    for name in ("example", "fs", "runtime_tier", "ep_tier"):
        assert name in msg
    assert "module_path" in msg and "did you mean 'example'" in msg
    assert msg.startswith("secondary_tiers[0].type: ")
    # Same mechanism, other kinds, other config keys.
    with pytest.raises(UnknownPluginError, match="cache_policy_module_path"):
        plugins.create_policy(load_config({"eviction_policy": "nope"}), 4)
    with pytest.raises(UnknownPluginError, match="spec_module_path"):
        plugins.create_spec(load_config({"spec_name": "nope"}))


# -- entry points ------------------------------------------------------------------------------
def install_distribution(
    root: Path, monkeypatch: pytest.MonkeyPatch, group: str, name: str, target: str
) -> Path:
    """Install a real (metadata-only) distribution on a new sys.path entry: importlib.metadata
    reads its dist-info exactly as it reads pip-installed ones."""
    site = root / f"site-{uuid.uuid4().hex[:8]}"
    dist = f"kvt_ext_{uuid.uuid4().hex[:8]}"
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_entry_point_plugin_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, view: memoryview
) -> None:
    site = install_distribution(tmp_path, monkeypatch, "kvtier.tiers", "striped", "")
    mod = write_module(site, TIER_SRC.format(cls="StripedTier"))
    (next(site.glob("*.dist-info")) / "entry_points.txt").write_text(
        f"[kvtier.tiers]\nstriped = {mod}:StripedTier\n"
    )
    assert "striped" in plugins.TIERS.names()
    rows = {(i.kind, i.name): i for i in plugins.list_plugins()}
    assert rows[("tier", "striped")].source == plugins.ENTRY_POINT
    assert rows[("tier", "striped")].target == f"{mod}:StripedTier"
    assert rows[("tier", "example")].source == plugins.BUILTIN
    assert mod not in sys.modules  # listing imports nothing
    tier = plugins.create_tier({"type": "striped", "color": "teal"}, primary_kv_view=view)
    assert type(tier).__name__ == "StripedTier" and tier.color == "teal"  # type: ignore[attr-defined]


def test_entry_point_policy_and_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = install_distribution(tmp_path, monkeypatch, "kvtier.policies", "x", "")
    pmod = write_module(site, POLICY_SRC.format(cls="EpPolicy"))
    smod = write_module(site, SPEC_SRC.format(cls="EpSpec"))
    (next(site.glob("*.dist-info")) / "entry_points.txt").write_text(
        f"[kvtier.policies]\nep_fifo = {pmod}:EpPolicy\n\n[kvtier.specs]\nep_spec = {smod}:EpSpec\n"
    )
    cfg = load_config({"eviction_policy": "ep_fifo", "policy_options": {"bias": 2}, "spec_name": "ep_spec"})
    spec = plugins.create_spec(cfg)
    assert type(spec).__name__ == "EpSpec"
    policy = spec.create_policy(8)
    assert type(policy).__name__ == "EpPolicy" and policy.capacity == 8 and policy.bias == 2  # type: ignore[attr-defined]


def test_builtin_table_matches_pyproject_entry_points() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    for kind, group in (("tier", "kvtier.tiers"), ("policy", "kvtier.policies"), ("spec", "kvtier.specs")):
        reg = plugins.get_registry(kind)
        declared = project[group]
        for name, target in declared.items():
            assert reg._builtins[name] == target, (kind, name)
        # Built-ins not declared there are aliases of declared targets.
        for name, target in reg._builtins.items():
            assert target in declared.values(), (kind, name)


def test_importing_and_listing_imports_no_plugin() -> None:
    script = (
        "import sys, kvtier.plugins as p; rows = p.list_plugins(); "
        "print(len(rows), sorted(m for m in sys.modules if m.startswith('kvtier.') and "
        "m.split('.')[1] in ('tiers', 'policies', 'specs', 'engine')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    count, loaded = out.stdout.split(" ", 1)
    assert int(count) >= 9
    assert loaded.strip() == "[]"


# -- trust boundary ----------------------------------------------------------------------------
EVIL = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")
"""


def test_allow_list_refuses_before_import(plugdir: Path, tmp_path: Path, view: memoryview) -> None:
    marker = tmp_path / "ran.txt"
    pkg = f"kvt_evilpkg_{uuid.uuid4().hex[:8]}"
    (plugdir / pkg).mkdir()
    # Even the parent package's __init__ must not run (find_spec would run it).
    (plugdir / pkg / "__init__.py").write_text(EVIL.format(marker=str(marker)))
    (plugdir / pkg / "tiers.py").write_text(EVIL.format(marker=str(marker)))
    cfg = load_config(
        {
            "plugins": {"allowed_modules": ["trusted_corp", "kvt_evil"]},
            "secondary_tiers": [{"type": "Evil", "module_path": f"{pkg}.tiers"}],
        }
    )
    with pytest.raises(PermissionError) as info:
        plugins.create_tier(cfg.secondary_tiers[0], primary_kv_view=view, plugins=cfg.plugins)
    assert isinstance(info.value, PluginNotAllowedError)
    assert "allowed_modules" in str(info.value) and pkg in str(info.value)
    assert pkg not in sys.modules and f"{pkg}.tiers" not in sys.modules
    assert not marker.exists()


def test_allow_module_path_false_refuses_everything(plugdir: Path, view: memoryview) -> None:
    mod = write_module(plugdir, TIER_SRC.format(cls="Fine"))
    cfg = load_config({"plugins": {"allow_module_path": False}})
    with pytest.raises(PluginNotAllowedError, match="allow_module_path is false"):
        plugins.create_tier({"type": "Fine", "module_path": mod}, primary_kv_view=view, plugins=cfg.plugins)
    with pytest.raises(PluginNotAllowedError):
        plugins.create_tier({"type": f"{mod}:Fine"}, primary_kv_view=view, plugins=cfg.plugins)
    assert mod not in sys.modules
    # Built-ins are not module_path loads and keep working.
    assert isinstance(
        plugins.create_tier({"type": "example"}, primary_kv_view=view, plugins=cfg.plugins), ExampleTier
    )


def test_allowed_prefix_loads(plugdir: Path, view: memoryview) -> None:
    mod = write_module(plugdir, TIER_SRC.format(cls="Ok"), package="kvt_corp_plugins")
    cfg = load_config({"plugins": {"allowed_modules": ["kvt_corp_plugins"]}})
    tier = plugins.create_tier(
        {"type": "Ok", "module_path": mod, "color": "x"}, primary_kv_view=view, plugins=cfg.plugins
    )
    assert type(tier).__name__ == "Ok"
    # A prefix is a whole dotted component: "kvt_corp" does not allow "kvt_corp_plugins".
    cfg2 = load_config({"plugins": {"allowed_modules": ["kvt_corp"]}})
    with pytest.raises(PluginNotAllowedError):
        plugins.create_tier({"type": "Ok", "module_path": mod}, primary_kv_view=view, plugins=cfg2.plugins)


# -- logging -----------------------------------------------------------------------------------
def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "kvtier.plugins" and r.levelno == level]


def test_tier_warning_once_info_per_load(
    plugdir: Path, view: memoryview, caplog: pytest.LogCaptureFixture
) -> None:
    plugins.reset_notices()
    caplog.set_level(logging.INFO, logger="kvtier.plugins")
    m1 = write_module(plugdir, TIER_SRC.format(cls="TierOne"))
    m2 = write_module(plugdir, TIER_SRC.format(cls="TierTwo"))
    plugins.create_tier({"type": "TierOne", "module_path": m1, "color": "a"}, primary_kv_view=view)
    plugins.create_tier({"type": "TierTwo", "module_path": m2, "color": "b"}, primary_kv_view=view)
    warnings = _records(caplog, logging.WARNING)
    infos = _records(caplog, logging.INFO)
    assert [w.getMessage() for w in warnings] == [plugins.EXPERIMENTAL_NOTICE.format(kind="tier")]
    assert len(infos) == 2
    assert "'TierOne'" in infos[0].getMessage() and m1 in infos[0].getMessage()
    assert "'TierTwo'" in infos[1].getMessage() and m2 in infos[1].getMessage()
    # Built-ins are not out-of-tree: no more log lines.
    plugins.create_tier({"type": "example"}, primary_kv_view=view)
    assert len(_records(caplog, logging.WARNING)) == 1 and len(_records(caplog, logging.INFO)) == 2


def test_policy_warning_once_info_per_load(plugdir: Path, caplog: pytest.LogCaptureFixture) -> None:
    plugins.reset_notices()
    caplog.set_level(logging.INFO, logger="kvtier.plugins")
    m1 = write_module(plugdir, POLICY_SRC.format(cls="PolOne"))
    m2 = write_module(plugdir, POLICY_SRC.format(cls="PolTwo"))
    p1 = plugins.create_policy(load_config({"eviction_policy": "PolOne", "cache_policy_module_path": m1}), 4)
    p2 = plugins.create_policy(load_config({"eviction_policy": "PolTwo", "cache_policy_module_path": m2}), 5)
    assert (p1.capacity, p2.capacity) == (4, 5)
    assert [w.getMessage() for w in _records(caplog, logging.WARNING)] == [
        plugins.EXPERIMENTAL_NOTICE.format(kind="policy")
    ]
    infos = [r.getMessage() for r in _records(caplog, logging.INFO)]
    assert len(infos) == 2 and m1 in infos[0] and m2 in infos[1]


def test_spec_warning_once_info_per_load(plugdir: Path, caplog: pytest.LogCaptureFixture) -> None:
    plugins.reset_notices()
    caplog.set_level(logging.INFO, logger="kvtier.plugins")
    m1 = write_module(plugdir, SPEC_SRC.format(cls="SpecOne"))
    m2 = write_module(plugdir, SPEC_SRC.format(cls="SpecTwo"))
    s1 = plugins.create_spec(load_config({"spec_name": "SpecOne", "spec_module_path": m1}))
    s2 = plugins.create_spec(load_config({"spec_name": "SpecTwo", "spec_module_path": m2}))
    assert (type(s1).__name__, type(s2).__name__) == ("SpecOne", "SpecTwo")
    assert [w.getMessage() for w in _records(caplog, logging.WARNING)] == [
        plugins.EXPERIMENTAL_NOTICE.format(kind="spec")
    ]
    infos = [r.getMessage() for r in _records(caplog, logging.INFO)]
    assert len(infos) == 2 and m1 in infos[0] and m2 in infos[1]


def test_notice_is_per_kind(plugdir: Path, view: memoryview, caplog: pytest.LogCaptureFixture) -> None:
    plugins.reset_notices()
    caplog.set_level(logging.INFO, logger="kvtier.plugins")
    mt = write_module(plugdir, TIER_SRC.format(cls="T"))
    mp = write_module(plugdir, POLICY_SRC.format(cls="P"))
    plugins.create_tier({"type": "T", "module_path": mt, "color": "c"}, primary_kv_view=view)
    plugins.create_policy(load_config({"eviction_policy": "P", "cache_policy_module_path": mp}), 2)
    assert len(_records(caplog, logging.WARNING)) == 2


# -- registration ------------------------------------------------------------------------------
class _Mine(ExampleTier):
    pass


def test_register_refuses_existing_names_unless_replacing(view: memoryview) -> None:
    plugins.register_tier("mine", _Mine)
    for bad in ("", "  ", "pkg.mod:Class"):
        with pytest.raises(ValueError, match="non-empty string without ':'"):
            plugins.register_tier(bad, _Mine)
    with pytest.raises(PluginError, match=r"already registered.*replace=True"):
        plugins.register_tier("mine", ExampleTier)
    with pytest.raises(PluginError, match="already built-in"):
        plugins.register_tier("example", _Mine)
    plugins.register_tier("example", _Mine, replace=True)
    assert type(plugins.create_tier({"type": "example"}, primary_kv_view=view)) is _Mine
    rows = {i.name: i for i in plugins.list_plugins("tier")}
    assert rows["example"].source == plugins.REGISTERED
    assert rows["example"].target.endswith(":_Mine")
    assert rows["mine"].source == plugins.REGISTERED


def test_registry_state_is_restored_between_tests_part1() -> None:
    plugins.register_tier("kvt_leak_check", _Mine)
    assert plugins.TIERS.is_registered("kvt_leak_check")


def test_registry_state_is_restored_between_tests_part2() -> None:
    # Runs after part1 (file order): the autouse fixture in tests/conftest.py undid the registration.
    assert not plugins.TIERS.is_registered("kvt_leak_check")


def test_snapshot_restore_round_trip() -> None:
    state = plugins.snapshot_state()
    plugins.register_tier("tmp_a", _Mine)
    plugins.register_tier("example", _Mine, replace=True)
    plugins.restore_state(state)
    assert not plugins.TIERS.is_registered("tmp_a")
    assert plugins.TIERS.target_of("example") == "kvtier.tiers.example:ExampleTier"


def test_builtin_aliases_for_vllm_users() -> None:
    assert plugins.SPECS.resolve("TieringOffloadingSpec") is TieringSpec
    assert plugins.SPECS.resolve("tiering") is TieringSpec


# -- constructor arguments ---------------------------------------------------------------------
def test_unexpected_tier_key_names_tier_and_key(plugdir: Path) -> None:
    mod = write_module(plugdir, TIER_SRC.format(cls="Kw"))
    cfg = load_config(
        {
            "block_bytes": 4096,
            "cpu_bytes_to_use": 8 * 4096,
            "secondary_tiers": [
                {"type": "example"},
                {"type": "Kw", "module_path": mod, "color": "red", "colour": "red"},
            ],
        }
    )
    buf = np.zeros((8, 4096), dtype=np.uint8)
    with pytest.raises(ConfigError) as info:
        TieringSpec(cfg).create_tiers(memoryview(buf), plugins.tier_contexts(cfg))
    assert info.value.key_path == "secondary_tiers[1].colour"
    assert "'Kw'" in str(info.value) and "color" in str(info.value)


def test_missing_required_option_and_rejected_value(plugdir: Path, view: memoryview) -> None:
    mod = write_module(plugdir, TIER_SRC.format(cls="Req"))
    with pytest.raises(ConfigError) as info:
        plugins.create_tier({"type": "Req", "module_path": mod}, primary_kv_view=view)
    assert info.value.key_path == "secondary_tiers[0].color" and "missing" in str(info.value)
    # A tier that raises ConfigError about its own option gets the config path prefixed.
    with pytest.raises(ConfigError) as info2:
        plugins.create_tier({"type": "Req", "module_path": mod, "color": "invalid"}, primary_kv_view=view)
    assert info2.value.key_path == "secondary_tiers[0].color"
    # A value the constructor rejects with ValueError/TypeError becomes a one-line ConfigError.
    with pytest.raises(ConfigError, match=r"secondary_tiers\[0\]\.capacity_blocks: expected an integer"):
        plugins.create_tier({"type": "example", "capacity_blocks": 0}, primary_kv_view=view)


def test_reserved_tier_keys(view: memoryview) -> None:
    with pytest.raises(ConfigError, match=r"secondary_tiers\[0\]\.context: is supplied by kvtier"):
        plugins.create_tier({"type": "example", "context": 1}, primary_kv_view=view)
    tier = plugins.create_tier({"type": "example", "name": "hot"}, primary_kv_view=view)
    assert tier.name == "hot"  # "name" names the instance, it is not a constructor argument


def test_policy_options_are_checked(plugdir: Path) -> None:
    mod = write_module(plugdir, POLICY_SRC.format(cls="Opt"))
    cfg = load_config(
        {"eviction_policy": "Opt", "cache_policy_module_path": mod, "policy_options": {"bais": 1}}
    )
    with pytest.raises(ConfigError) as info:
        plugins.create_policy(cfg, 4)
    assert info.value.key_path == "policy_options.bais" and "bias" in str(info.value)
    cfg2 = load_config(
        {"eviction_policy": "Opt", "cache_policy_module_path": mod, "policy_options": {"bias": 7}}
    )
    policy = plugins.create_policy(cfg2, 4)
    assert policy.bias == 7  # type: ignore[attr-defined]


def test_tier_contexts_names_are_unique() -> None:
    cfg = load_config(
        {"secondary_tiers": [{"type": "example"}, {"type": "example"}, {"type": "fs", "name": "disk"}]}
    )
    names = [c.name for c in plugins.tier_contexts(cfg, namespace="ns")]
    assert names == ["example0", "example1", "disk"]
    dup = load_config(
        {"secondary_tiers": [{"type": "example", "name": "a"}, {"type": "example", "name": "a"}]}
    )
    with pytest.raises(ConfigError, match=r"secondary_tiers\[1\]\.name: duplicate"):
        plugins.tier_contexts(dup)


def test_tiering_spec_builds_tiers_in_order_and_cleans_up(plugdir: Path) -> None:
    mod = write_module(plugdir, TIER_SRC.format(cls="Second"))
    cfg = load_config(
        {
            "block_bytes": 4096,
            "cpu_bytes_to_use": 4 * 4096,
            "secondary_tiers": [
                {"type": "example", "capacity_blocks": 3},
                {"type": "Second", "module_path": mod, "color": "c"},
            ],
        }
    )
    buf = np.zeros((4, 4096), dtype=np.uint8)
    tiers = TieringSpec(cfg).create_tiers(memoryview(buf), plugins.tier_contexts(cfg))
    assert [type(t).__name__ for t in tiers] == ["ExampleTier", "Second"]
    assert [t.name for t in tiers] == ["example0", "Second1"]

    shut: list[str] = []

    class Recording(ExampleTier):
        def shutdown(self) -> None:
            shut.append(self.name)
            super().shutdown()

    class Refusing(ExampleTier):
        def __init__(self, *, shade: str = "", **kw: Any) -> None:
            super().__init__(**kw)
            self.shutdown()
            raise ConfigError("shade", "only the constructor knows")

    plugins.register_tier("recording", Recording)
    plugins.register_tier("refusing", Refusing)
    # An option the constructor does not take is found before any tier is built: nothing to undo.
    tiers_cfg = [{"type": "recording"}, {"type": "example", "bogus": 1}]
    bad = load_config({"block_bytes": 4096, "cpu_bytes_to_use": 4 * 4096, "secondary_tiers": tiers_cfg})
    with pytest.raises(ConfigError, match=r"secondary_tiers\[1\]\.bogus"):
        TieringSpec(bad).create_tiers(memoryview(buf), plugins.tier_contexts(bad))
    # So is a number out of its declared range (kvtier.numbers).
    tiers_cfg = [{"type": "recording"}, {"type": "example", "capacity_blocks": -1}]
    bad = load_config({"block_bytes": 4096, "cpu_bytes_to_use": 4 * 4096, "secondary_tiers": tiers_cfg})
    with pytest.raises(ConfigError, match=r"secondary_tiers\[1\]\.capacity_blocks"):
        TieringSpec(bad).create_tiers(memoryview(buf), plugins.tier_contexts(bad))
    assert shut == []
    # A value only the constructor refuses: the tiers built before it are shut down.
    tiers_cfg = [{"type": "recording"}, {"type": "refusing", "shade": "x"}]
    bad = load_config({"block_bytes": 4096, "cpu_bytes_to_use": 4 * 4096, "secondary_tiers": tiers_cfg})
    with pytest.raises(ConfigError, match=r"secondary_tiers\[1\]\.shade"):
        TieringSpec(bad).create_tiers(memoryview(buf), plugins.tier_contexts(bad))
    assert shut == ["recording0"]


def test_resolution_order_registry_before_entry_point_before_module_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plugdir: Path, view: memoryview
) -> None:
    site = install_distribution(tmp_path, monkeypatch, "kvtier.tiers", "dup", "")
    ep_mod = write_module(site, TIER_SRC.format(cls="FromEp"))
    (next(site.glob("*.dist-info")) / "entry_points.txt").write_text(
        f"[kvtier.tiers]\ndup = {ep_mod}:FromEp\n"
    )
    mp_mod = write_module(plugdir, TIER_SRC.format(cls="dup"))
    options: dict[str, Any] = {"type": "dup", "module_path": mp_mod, "color": "x"}
    assert type(plugins.create_tier(options, primary_kv_view=view)).__name__ == "FromEp"
    plugins.register_tier("dup", _Mine)
    assert type(plugins.create_tier({"type": "dup"}, primary_kv_view=view)) is _Mine
    plugins.TIERS.unregister("dup")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(site)])
    assert type(plugins.create_tier(options, primary_kv_view=view)).__name__ == "dup"


def test_kvtier_own_entry_points_are_builtins() -> None:
    """kvtier declares its built-ins as entry points too; they never show up as third-party ones."""
    own = [
        ep for ep in plugins.TIERS.entry_points().values() if ep.dist is not None and ep.dist.name == "kvtier"
    ]
    assert {ep.name for ep in own} >= {"example"}
    rows = plugins.list_plugins()
    assert not [r for r in rows if r.source == plugins.ENTRY_POINT and r.target.startswith("kvtier.")]


@pytest.mark.parametrize(
    ("kind", "name"),
    [(k, n) for k in ("tier", "policy", "spec") for n in plugins.get_registry(k).builtin_names()],
)
def test_every_builtin_resolves_to_its_base(kind: str, name: str) -> None:
    """The built-in table names real classes (a renamed class or module fails here, not in production)."""
    reg = plugins.get_registry(kind)
    cls = reg.resolve(name)
    assert issubclass(cls, reg.base)
    assert f"{cls.__module__}:{cls.__qualname__}" == reg.target_of(name)
    if kind == "policy":
        policy = plugins.create_policy(load_config({"eviction_policy": name}), 8)
        assert policy.capacity == 8 and len(policy) == 0


NESTED_SRC = """
from kvtier.plugins import POLICIES
from kvtier.tiers.example import ExampleTier


class PolicyPickingTier(ExampleTier):
    '''Resolves an eviction policy by name in its constructor, as the fs tier does.'''

    def __init__(self, *, primary_kv_view, context, policy):
        super().__init__(primary_kv_view=primary_kv_view, context=context)
        self.policy_cls = POLICIES.resolve(policy)
"""


def test_nested_resolution_inherits_the_trust_boundary(
    plugdir: Path, tmp_path: Path, view: memoryview
) -> None:
    tier_mod = write_module(plugdir, NESTED_SRC, package="kvt_corp_nested")
    marker = tmp_path / "ran.txt"
    evil = f"kvt_evil_nested_{uuid.uuid4().hex[:8]}"
    (plugdir / f"{evil}.py").write_text(EVIL.format(marker=str(marker)) + POLICY_SRC.format(cls="Evil"))
    cfg = load_config({"plugins": {"allowed_modules": ["kvt_corp_nested"]}})
    tier_cfg = {"type": "PolicyPickingTier", "module_path": tier_mod, "policy": f"{evil}:Evil"}
    with pytest.raises(PluginNotAllowedError, match=evil):
        plugins.create_tier(tier_cfg, primary_kv_view=view, plugins=cfg.plugins)
    assert evil not in sys.modules and not marker.exists()
    # The boundary is the config's, not global: outside a factory call nothing is restricted.
    assert plugins.POLICIES.resolve(f"{evil}:Evil").__name__ == "Evil"
    assert marker.exists()
