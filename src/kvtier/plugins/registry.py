"""The generic plug-in registry: name -> class resolution, the ``module_path`` trust boundary, notices.

One :class:`Registry` serves every plug-in kind (tiers, policies, specs: see :mod:`kvtier.plugins.kinds`);
the resolution order and the trust rules are described in :mod:`kvtier.plugins`. This module imports
no contract module: a registry names its base class and its built-ins as ``"module:Class"`` strings and
imports them only when a name is used, so the registry sits below every kind it serves.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import importlib
import importlib.metadata
import keyword
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from kvtier.errors import (
    PluginError,
    PluginImportError,
    PluginNotAllowedError,
    PluginTypeError,
    UnknownPluginError,
    install_hint,
)

if TYPE_CHECKING:
    from kvtier.config import PluginsConfig

__all__ = [
    "BUILTIN",
    "ENTRY_POINT",
    "EXPERIMENTAL_NOTICE",
    "MODULE_PATH",
    "REGISTERED",
    "PluginInfo",
    "Registry",
    "reset_notices",
    "trust_boundary",
]

logger = logging.getLogger("kvtier.plugins")

T = TypeVar("T")

BUILTIN = "built-in"
REGISTERED = "registered"
ENTRY_POINT = "entry point"
MODULE_PATH = "module_path"

#: The fixed text of the once-per-process-per-kind WARNING (``{kind}`` is tier, policy or spec).
EXPERIMENTAL_NOTICE = (
    "kvtier: loading an out-of-tree {kind} plug-in; the plug-in API is experimental and may change "
    "between minor releases"
)

_notice_lock = threading.Lock()
_noticed_kinds: set[str] = set()

# The trust boundary of the config being built. A plug-in's constructor that resolves further
# plug-ins (the fs tier picks its own eviction policy by name) inherits it without having to be
# handed the config's ``plugins`` section.
_active_plugins: contextvars.ContextVar[PluginsConfig | None] = contextvars.ContextVar(
    "kvtier_active_plugins", default=None
)


@contextlib.contextmanager
def trust_boundary(plugins: PluginsConfig | None) -> Iterator[None]:
    """Within this block, :meth:`Registry.resolve` calls without ``plugins`` use ``plugins``.

    The factories enter it while a plug-in is being constructed; it is per thread/context.
    """
    if plugins is None:
        yield
        return
    token = _active_plugins.set(plugins)
    try:
        yield
    finally:
        _active_plugins.reset(token)


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One row of :func:`list_plugins` (and ``kvtier plugins``).

    Attributes:
        kind: ``"tier"``, ``"policy"`` or ``"spec"``.
        name: the name config uses.
        source: ``"built-in"``, ``"registered"`` or ``"entry point"``.
        target: import target ``"module:Class"``.
    """

    kind: str
    name: str
    source: str
    target: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "source": self.source, "target": self.target}


def _is_own(ep: importlib.metadata.EntryPoint) -> bool:
    """Whether an entry point is declared by kvtier's own distribution."""
    return ep.dist is not None and ep.dist.name == "kvtier"


def _is_dotted_name(module: str) -> bool:
    parts = module.split(".")
    return all(p.isidentifier() and not keyword.iskeyword(p) for p in parts)


def _target_of(obj: type[Any]) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def _split_target(target: str) -> tuple[str, str | None]:
    """``"pkg.mod:Class"`` -> ``("pkg.mod", "Class")``; ``"pkg.mod"`` -> ``("pkg.mod", None)``."""
    module, sep, attr = target.partition(":")
    return module.strip(), (attr.strip() or None) if sep else None


def _announce(kind: str, name: str, module: str, source: str) -> None:
    # One WARNING per kind per process, whatever the number of plug-ins: operators need to know the
    # API is experimental once, not once per tier. The INFO line is what tells them *which* code ran.
    with _notice_lock:
        first = kind not in _noticed_kinds
        _noticed_kinds.add(kind)
    if first:
        logger.warning(EXPERIMENTAL_NOTICE.format(kind=kind))
    logger.info("kvtier: loaded %s plug-in %r from module %s (%s)", kind, name, module, source)


def reset_notices() -> None:
    """Forget which kinds already logged the experimental-API WARNING (for tests)."""
    with _notice_lock:
        _noticed_kinds.clear()


class Registry(Generic[T]):
    """Name -> class resolution for one plug-in kind.

    Args:
        kind: ``"tier"``, ``"policy"`` or ``"spec"`` (used in messages and logs).
        base: ``"module:Class"`` of the class every plug-in of this kind must subclass.
        group: the entry-point group.
        builtins: name -> ``"module:Class"``; imported only when the name is used.
        name_key / module_key: config keys that name a plug-in of this kind (for messages).
    """

    def __init__(
        self,
        kind: str,
        base: str,
        group: str,
        builtins: Mapping[str, str],
        *,
        name_key: str,
        module_key: str,
    ) -> None:
        self.kind = kind
        # The base class is imported lazily, by name, so this module imports no contract module:
        # tiers/base.py pulls numpy (a policy-only user should not pay for it), and the contracts
        # may use the factories without an import cycle.
        self._base_target = base
        self._base: type[T] | None = None
        self.group = group
        self.name_key = name_key
        self.module_key = module_key
        self._builtins: dict[str, str] = dict(builtins)
        self._registered: dict[str, type[T]] = {}
        self._resolved: dict[str, type[T]] = {}
        self._lock = threading.RLock()

    @property
    def base(self) -> type[T]:
        if self._base is None:
            module, attr = _split_target(self._base_target)
            self._base = getattr(importlib.import_module(module), attr or "")
        assert self._base is not None
        return self._base

    # -- registration ------------------------------------------------------------------------
    def register(self, name: str, cls: type[T], *, replace: bool = False) -> type[T]:
        """Make ``cls`` available as ``name``. Refuses an existing name unless ``replace=True``.

        Returns ``cls`` so it can be used as a decorator helper.
        """
        if not isinstance(name, str) or not name.strip() or ":" in name:
            # ":" is reserved for "pkg.module:Class" targets in config.
            raise ValueError(f"{self.kind} plug-in name must be a non-empty string without ':', got {name!r}")
        self._check_subclass(cls, name, _describe(cls))
        with self._lock:
            if not replace and (name in self._builtins or name in self._registered):
                where = BUILTIN if name in self._builtins and name not in self._registered else REGISTERED
                raise PluginError(
                    f"{self.kind} {name!r} is already {where} ({self.target_of(name)}); "
                    f"pass replace=True to replace it",
                    kind=self.kind,
                    name=name,
                )
            self._registered[name] = cls
            self._resolved.pop(name, None)
        return cls

    def unregister(self, name: str) -> None:
        """Remove a name added with :meth:`register` (built-ins cannot be removed)."""
        with self._lock:
            self._registered.pop(name, None)
            self._resolved.pop(name, None)

    # -- introspection -----------------------------------------------------------------------
    def builtin_names(self) -> list[str]:
        return sorted(self._builtins)

    def registered_names(self) -> list[str]:
        with self._lock:
            return sorted(self._registered)

    def is_registered(self, name: str) -> bool:
        """Whether ``name`` is known without importing anything from ``module_path``."""
        with self._lock:
            return name in self._registered or name in self._builtins

    def target_of(self, name: str) -> str:
        with self._lock:
            if name in self._registered:
                return _target_of(self._registered[name])
            return self._builtins[name]

    def entry_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        """Installed entry points of this kind's group, by name (read fresh every call)."""
        found: dict[str, importlib.metadata.EntryPoint] = {}
        for ep in importlib.metadata.entry_points(group=self.group):
            # First one wins, like importlib does for duplicate distributions on sys.path.
            found.setdefault(ep.name, ep)
        return found

    def names(self) -> list[str]:
        """Every name this kind resolves without ``module_path``: built-in, registered, entry point."""
        with self._lock:
            known = set(self._builtins) | set(self._registered)
        return sorted(known | set(self.entry_points()))

    def infos(self) -> list[PluginInfo]:
        """One :class:`PluginInfo` per name, built-ins first, then registered, then entry points."""
        rows: list[PluginInfo] = []
        with self._lock:
            registered = dict(self._registered)
            builtins = dict(self._builtins)
        for name in sorted(builtins):
            if name not in registered:
                rows.append(PluginInfo(self.kind, name, BUILTIN, builtins[name]))
        for name in sorted(registered):
            rows.append(PluginInfo(self.kind, name, REGISTERED, _target_of(registered[name])))
        for name, ep in sorted(self.entry_points().items()):
            if name not in builtins and name not in registered:
                # kvtier's own entry points are built-ins even if the table above lacks them.
                source = BUILTIN if _is_own(ep) else ENTRY_POINT
                rows.append(PluginInfo(self.kind, name, source, ep.value))
        return rows

    # -- resolution --------------------------------------------------------------------------
    def resolve(
        self,
        name: str,
        module_path: str | None = None,
        *,
        plugins: PluginsConfig | None = None,
        key_path: str = "",
    ) -> type[T]:
        """The class for ``name`` (see the module docstring for the order).

        ``key_path`` is the config key that named it (``secondary_tiers[0]``) for error messages.

        Raises:
            UnknownPluginError: no such name and no ``module_path``.
            PluginNotAllowedError: ``module_path`` refused by ``plugins`` (nothing was imported).
            PluginImportError: the module (or its attribute) cannot be imported.
            PluginTypeError: the object is not a subclass of the kind's base class.
        """
        if plugins is None:
            plugins = _active_plugins.get()
        name_key = f"{key_path}.{self.name_key}" if key_path else self.name_key
        module_key = f"{key_path}.{self.module_key}" if key_path else self.module_key
        if ":" in name and module_path is None:
            # "pkg.mod:Class" given as the name itself: same trust boundary as module_path.
            return self._from_module_path(name, name, plugins, name_key)
        with self._lock:
            cls = self._registered.get(name) or self._resolved.get(name)
            builtin = self._builtins.get(name)
        if cls is not None:
            if name in self._registered:
                _announce(self.kind, name, cls.__module__, REGISTERED)
            return cls
        if builtin is not None:
            if module_path:
                logger.warning(
                    "kvtier: %s %r is a built-in; %s=%r is ignored (rename the plug-in to load it)",
                    self.kind, name, module_key, module_path,
                )  # fmt: skip
            cls = self._import_target(name, builtin, name_key)
            with self._lock:
                self._resolved[name] = cls
            return cls
        ep = self.entry_points().get(name)
        if ep is not None:
            if module_path:
                logger.warning(
                    "kvtier: %s %r is an installed entry point (%s); %s=%r is ignored",
                    self.kind, name, ep.value, module_key, module_path,
                )  # fmt: skip
            cls = self._import_target(name, ep.value, name_key)
            if not _is_own(ep):
                _announce(self.kind, name, cls.__module__, ENTRY_POINT)
            return cls
        if module_path:
            return self._from_module_path(name, module_path, plugins, module_key)
        raise UnknownPluginError(self._unknown_message(name, name_key), kind=self.kind, name=name)

    def _unknown_message(self, name: str, name_key: str) -> str:
        names = self.names()
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (
            f"{name_key}: unknown {self.kind} {name!r}{hint}; available: {', '.join(names) or 'none'}. "
            f"To load an out-of-tree {self.kind}, set {self.module_key!r} to its module "
            f'(e.g. "mypkg.kv_{self.kind}", taking the attribute {name!r}, or "mypkg.module:Class"), '
            f"install it under the entry-point group {self.group!r}, or call register_{self.kind}()"
        )

    def _from_module_path(
        self, name: str, module_path: str, plugins: PluginsConfig | None, key: str
    ) -> type[T]:
        module, attr = _split_target(module_path)
        attr = attr or name
        if not module or not _is_dotted_name(module):
            raise PluginImportError(
                f"{key}: {module_path!r} is not an importable module name (expected e.g. mypkg.tiers "
                f"or mypkg.tiers:MyTier) for {self.kind} {name!r}",
                kind=self.kind,
                name=name,
                module=module,
            )
        # The trust check runs on the string, before any import: a refused module's code never runs,
        # not even its parent package's __init__.
        if plugins is not None and not plugins.permits(module):
            if not plugins.allow_module_path:
                why = "plugins.allow_module_path is false"
                fix = "set plugins.allow_module_path to true, or install the plug-in as an entry point"
            else:
                why = f"it is outside plugins.allowed_modules {list(plugins.allowed_modules)}"
                fix = f"add {module.split('.')[0]!r} (or a narrower prefix) to plugins.allowed_modules"
            raise PluginNotAllowedError(
                f"{key}: refusing to import module {module!r} for {self.kind} {name!r}: {why}; {fix}",
                kind=self.kind,
                name=name,
            )
        cls = self._import_target(name, f"{module}:{attr}", key)
        _announce(self.kind, name, module, MODULE_PATH)
        return cls

    def _import_target(self, name: str, target: str, key: str) -> type[T]:
        module, attr = _split_target(target)
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            missing = exc.name or module
            inner = "" if module == missing or module.startswith(missing + ".") else (
                f" (it needs {missing!r}, which is not installed: {install_hint(missing)})"
            )  # fmt: skip
            raise PluginImportError(
                f"{key}: cannot import module {module!r} for {self.kind} {name!r}{inner}: {exc}",
                kind=self.kind,
                name=name,
                module=module,
            ) from exc
        except Exception as exc:
            # Any failure while running the plug-in's module (SyntaxError, its own ImportError...)
            # means it cannot be imported; keep the cause chained for the traceback-minded.
            raise PluginImportError(
                f"{key}: importing module {module!r} for {self.kind} {name!r} failed: "
                f"{type(exc).__name__}: {exc}",
                kind=self.kind,
                name=name,
                module=module,
            ) from exc
        obj: Any = mod
        for part in (attr or name).split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise PluginImportError(
                    f"{key}: module {module!r} has no attribute {attr or name!r} for {self.kind} {name!r}",
                    kind=self.kind,
                    name=name,
                    module=module,
                ) from None
        self._check_subclass(obj, name, target)
        cls: type[T] = obj
        return cls

    def _check_subclass(self, obj: object, name: str, where: str) -> None:
        # Not an assert: this must hold under ``python -O`` too.
        base = self.base
        if not (isinstance(obj, type) and issubclass(obj, base)):
            what = f"class {obj.__qualname__}" if isinstance(obj, type) else f"{type(obj).__name__} object"
            raise PluginTypeError(
                f"{self.kind} {name!r} ({where}) is a {what}, not a subclass of "
                f"{base.__module__}.{base.__qualname__}",
                kind=self.kind,
                name=name,
            )

    # -- test support ------------------------------------------------------------------------
    def _snapshot(self) -> tuple[dict[str, str], dict[str, type[T]], dict[str, type[T]]]:
        with self._lock:
            return dict(self._builtins), dict(self._registered), dict(self._resolved)

    def _restore(self, state: tuple[dict[str, str], dict[str, type[T]], dict[str, type[T]]]) -> None:
        builtins, registered, resolved = state
        with self._lock:
            self._builtins, self._registered, self._resolved = (
                dict(builtins),
                dict(registered),
                dict(resolved),
            )


def _describe(obj: object) -> str:
    return _target_of(obj) if isinstance(obj, type) else repr(obj)
