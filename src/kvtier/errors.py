"""kvtier's exception tree: one root, four shallow branches.

::

    KvtierError                      root; catch this to catch everything kvtier raises
    ├── ConfigError (ValueError)     bad configuration; ``key_path`` names the offending key
    ├── PluginError                  a tier / policy / spec could not be resolved or loaded
    │   ├── UnknownPluginError (LookupError)          no such name; message lists every known name
    │   ├── PluginImportError (ModuleNotFoundError)   ``module_path`` could not be imported
    │   ├── PluginTypeError (TypeError)               resolved object is not a subclass of the base
    │   └── PluginNotAllowedError (PermissionError)   ``module_path`` refused by the allow-list
    ├── TierError                    a tier failed at run time (backend errors are translated here)
    │   └── TierUnavailableError     the backend is unreachable; the tier answers MISS until it returns
    └── MisuseError (RuntimeError)   the API was called out of contract (e.g. load of a WRITING slot)

Errors that mirror a builtin also subclass it (``PluginImportError`` is a ``ModuleNotFoundError``) so
callers that already catch the builtin keep working. Backend exceptions (OSError, redis, botocore) are
translated at the tier boundary with ``raise ... from exc`` so the cause is never lost. Exceptions
defined elsewhere in kvtier (the p2p protocol's, the fs tier's) derive from this tree too
(``tests/unit/test_errors.py`` walks every module). A missing optional dependency is named with the
extra that installs it (:func:`install_hint`).
"""

from __future__ import annotations

from kvtier.extras import EXTRA_OF, install_hint

__all__ = [
    "ConfigError",
    "KvtierError",
    "MisuseError",
    "PluginError",
    "PluginImportError",
    "PluginNotAllowedError",
    "PluginTypeError",
    "TierError",
    "TierUnavailableError",
    "UnknownPluginError",
    "install_hint",
]

# One table of which extra installs which module (kvtier.extras, which imports nothing of kvtier);
# re-exported here so an error message's hint and the table it comes from stay one definition.
EXTRA_OF_MODULE = EXTRA_OF


class KvtierError(Exception):
    """Root of every exception kvtier raises on purpose."""


class ConfigError(KvtierError, ValueError):
    """A configuration value is missing, malformed or inconsistent.

    ``key_path`` is the dotted/indexed path of the offending key (``secondary_tiers[1].root_dir``);
    the message always starts with it so a one-line report is enough to find the typo.
    """

    def __init__(self, key_path: str, message: str) -> None:
        self.key_path = key_path
        self.detail = message
        super().__init__(f"{key_path}: {message}" if key_path else message)

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str], dict[str, object]]:
        # The default reduce re-calls __init__ with the formatted message only, which fails; errors
        # must survive pickling to cross process pools (sweeps, shared-memory workers).
        return type(self), (self.key_path, self.detail), self.__dict__


class PluginError(KvtierError):
    """A plug-in (tier, policy or spec) could not be resolved, imported or validated.

    ``kind`` is ``"tier"``, ``"policy"`` or ``"spec"``; ``plugin_name`` is the name asked for.
    """

    def __init__(self, message: str, *, kind: str = "", name: str = "") -> None:
        self.kind = kind
        self.plugin_name = name
        super().__init__(message)


class UnknownPluginError(PluginError, LookupError):
    """No built-in, registered or entry-point plug-in has this name and no ``module_path`` was given."""


class PluginImportError(PluginError, ModuleNotFoundError):
    """The ``module_path`` named in config could not be imported (or lacks the attribute)."""

    def __init__(self, message: str, *, kind: str = "", name: str = "", module: str = "") -> None:
        PluginError.__init__(self, message, kind=kind, name=name)
        # ImportError's own ``name`` slot means "the module that failed"; fill it as the builtin
        # would so code written against ModuleNotFoundError sees a sensible value.
        self.name = module or None
        self.module = module


class PluginTypeError(PluginError, TypeError):
    """The resolved object is not a subclass of the base class its kind requires."""


class PluginNotAllowedError(PluginError, PermissionError):
    """``module_path`` is disabled, or the module is outside ``plugins.allowed_modules``.

    Raised before the module is imported, so refused code never runs.
    """


class TierError(KvtierError):
    """A secondary tier failed at run time. Engines turn these into misses and failed jobs."""


class TierUnavailableError(TierError):
    """The tier's backend is unreachable; the tier degrades to MISS until it comes back."""


class MisuseError(KvtierError, RuntimeError):
    """The API was used against its contract (double complete, unknown job, closed engine...)."""
