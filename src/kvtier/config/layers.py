"""Configuration layers: built-in defaults < config file < ``KVTIER_*`` environment < explicit arguments.

:func:`resolve_config` merges the layers, validates the result with :func:`kvtier.config.load_config`'s
rules and remembers where every value came from, for ``kvtier check --show-config``:

=========  =====================================================  =====================================
layer      where                                                  origin shown
=========  =====================================================  =====================================
defaults   :class:`kvtier.config.KvtierConfig`'s field defaults    ``default``
file       ``--config PATH`` (or a JSON string), else the file    ``file PATH`` / ``JSON string``
           named by ``KVTIER_CONFIG``
env        ``KVTIER_<KEY>`` variables (spelling below)            ``env KVTIER_<KEY>``
explicit   arguments a caller passes (``explicit=``, CLI flags)   ``argument``
=========  =====================================================  =====================================

Environment spelling. ``KVTIER_`` + the key in capitals; ``__`` (two underscores) descends one level;
a number is a list index (the next free index appends an entry)::

    KVTIER_CPU_BYTES_TO_USE=8GiB
    KVTIER_PLUGINS__ALLOW_MODULE_PATH=false
    KVTIER_SECONDARY_TIERS__0__TYPE=fs
    KVTIER_SECONDARY_TIERS__0__ROOT_DIR=/mnt/kv
    KVTIER_COST_MODEL__PREFILL_SECONDS_PER_TOKEN=2e-4
    KVTIER_SECONDARY_TIERS='[{"type": "fs", "root_dir": "/mnt/kv"}]'    # a whole value as JSON

Names are read in lower case (use a file for a key with capitals). A value is JSON when it parses as
JSON (``8``, ``true``, ``null``, ``[...]``, ``{...}``), else text; keys that take text (``model``,
``cache_salt``, ``eviction_policy``...) always get the text as written. ``KVTIER_CONFIG`` names the
file; ``KVTIER_TEST_*`` variables belong to the test suite. A ``KVTIER_*`` name close to a setting
(``KVTIER_EVICTION_POLCY``) is an error with a "did you mean" (a typo must not be silently ignored);
one that resembles no setting (``KVTIER_P2P_SECRET``, a secret a tier reads by name) is not a
setting and is left alone.

Secrets. A key named like a secret (``password``, ``mac_key``, ``token``, ``api_key``...; see
:func:`is_secret_key`) may be given as ``KVTIER_..._<KEY>_FILE=/run/secrets/x``: the file's content
(trailing newline removed) becomes the value, so the secret itself is never in the environment or a
manifest. Secret values, and passwords inside URLs (``redis://:pw@host``), are never shown: the
config's ``show`` rows print ``<redacted>``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtier.config.schema import KvtierConfig, load_config
from kvtier.errors import ConfigError

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "REDACTED",
    "ResolvedConfig",
    "env_name",
    "is_secret_key",
    "redact",
    "resolve_config",
]

ENV_PREFIX = "KVTIER_"
#: The environment variable naming the config file (used when no file is given explicitly).
CONFIG_ENV = "KVTIER_CONFIG"
#: ``KVTIER_*`` names that are not configuration keys.
_NOT_KEYS = ("KVTIER_TEST_",)
REDACTED = "<redacted>"

_DEFAULTS = KvtierConfig()
_FIELDS = {f.name: f for f in dataclasses.fields(KvtierConfig) if f.name != "raw"}
# Top-level keys whose value is text: an environment value for them is never parsed as JSON
# (KVTIER_MODEL=123 is the model named "123", not the number 123).
_TEXT_KEYS = frozenset(n for n, f in _FIELDS.items() if str(f.type).split(" ")[0] == "str")
_SECRET_NAMES = frozenset({
    "password", "passwd", "secret", "token", "auth_token", "session_token", "mac_key", "hmac_key",
    "api_key", "access_key", "secret_key", "secret_access_key", "aws_secret_access_key",
    "aws_session_token", "credentials", "private_key",
})  # fmt: skip
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/@:\s]*:)(?P<pw>[^@/\s]+)@", re.IGNORECASE)


def is_secret_key(name: str) -> bool:
    """Whether a key called ``name`` holds a secret (its value is never printed)."""
    n = name.lower()
    return n in _SECRET_NAMES or n.endswith(("_password", "_secret", "_mac_key", "_api_key"))


def redact(key: str, value: Any) -> Any:
    """``value`` as it may be shown: secrets replaced by ``<redacted>``, URL passwords masked."""
    if is_secret_key(key) and value not in (None, ""):
        return REDACTED
    if isinstance(value, str):
        return _URL_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}@", value)
    return value


def env_name(path: str) -> str:
    """The environment variable that sets ``path`` (``secondary_tiers[0].root_dir`` ->
    ``KVTIER_SECONDARY_TIERS__0__ROOT_DIR``)."""
    parts = [p for p in re.split(r"[.\[\]]+", path) if p]
    return ENV_PREFIX + "__".join(p.upper() for p in parts)


@dataclass(frozen=True)
class ResolvedConfig:
    """A validated config and the origin of every value in it.

    ``origins`` maps a key path (``cpu_bytes_to_use``, ``secondary_tiers[0].root_dir``) to its layer
    (see the module docstring); keys no layer set are ``default``. ``file`` is the config file used.
    """

    config: KvtierConfig
    origins: Mapping[str, str]
    file: Path | None = None
    merged: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def show(self) -> list[tuple[str, str, str]]:
        """``(key path, value as JSON, origin)`` for every setting, secrets redacted, in key order.

        Top-level keys no layer set show their default; nested values show as set.
        """
        rows: list[tuple[str, str, str]] = []
        for name in _FIELDS:
            if name in self.merged:
                for path, value in _leaves(name, self.merged[name]):
                    leaf = re.split(r"[.\[]", path)[-1].rstrip("]")
                    rows.append((path, _text(redact(leaf, value)), self.origins.get(path, "default")))
            else:
                rows.append((name, _text(_default_value(name)), "default"))
        return rows


def resolve_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    explicit: Mapping[str, Any] | None = None,
    fallback: Mapping[str, Any] | None = None,
) -> ResolvedConfig:
    """Merge defaults < ``source`` (else the ``KVTIER_CONFIG`` file) < ``KVTIER_*`` < ``explicit``.

    ``source`` is what ``--config`` takes: a ``.json``/``.yaml`` path, a JSON string, or a mapping.
    ``fallback`` is the file layer when neither ``source`` nor ``KVTIER_CONFIG`` gives one (a
    command's own default stack, origin ``command default``). ``env`` defaults to ``os.environ``.
    Mappings merge key by key (a list is replaced as a whole, except by indexed environment names).
    Raises :class:`ConfigError` naming the key — and, when an environment variable or the file set
    it, that origin — for any bad value.
    """
    env = os.environ if env is None else env
    merged: dict[str, Any] = {}
    origins: dict[str, str] = {}
    file: Path | None = None
    env_file = env.get(CONFIG_ENV, "").strip()
    if source is None and env_file:
        try:
            data, origin, file = _read_source(env_file)
        except ConfigError as exc:
            raise ConfigError(CONFIG_ENV, f"{exc} (unset {CONFIG_ENV} or point it at a config file)") from exc
        _merge(merged, origins, data, "", origin)
    elif source is not None:
        data, origin, file = _read_source(source)
        _merge(merged, origins, data, "", origin)
    elif fallback is not None:
        _merge(merged, origins, copy.deepcopy(dict(fallback)), "", "command default")
    for name, parts, value in _env_overrides(env):
        _set_path(merged, origins, parts, value, f"env {name}", name)
    if explicit:
        _merge(merged, origins, dict(explicit), "", "argument")
    try:
        config = load_config(merged)
    except ConfigError as exc:
        where = _origin_of(exc.key_path, origins)
        if where is None or where == "default":
            raise
        raise ConfigError(exc.key_path, f"{exc.detail} (set by {where})") from exc
    return ResolvedConfig(config=config, origins=origins, file=file, merged=merged)


# -- layers -------------------------------------------------------------------------------------


def _read_source(source: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[Any, str, Path | None]:
    from kvtier.config.files import check_depth, loads_json, read_config_file

    if isinstance(source, Mapping):
        check_depth(source, "config")  # before the deep copy, which recurses
        return copy.deepcopy(dict(source)), "argument", None
    text = os.fspath(source)
    if text.lstrip().startswith("{"):
        data = loads_json(text, "config JSON string", file=False)  # same wording as load_config
        check_depth(data, "config JSON string")
        return data, "JSON string", None
    path = Path(text)
    data = read_config_file(path)
    if not isinstance(data, Mapping):
        raise ConfigError("", f"{path}: config must be an object/mapping, got {type(data).__name__}")
    return data, f"file {path}", path


def _env_overrides(env: Mapping[str, str]) -> list[tuple[str, list[str | int], Any]]:
    out: list[tuple[str, list[str | int], Any]] = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV or name.startswith(_NOT_KEYS):
            continue
        segments = name[len(ENV_PREFIX) :].lower().split("__")
        if any(not s for s in segments):
            raise ConfigError(name, "empty key segment; levels are separated by exactly two underscores")
        if segments[0] not in _FIELDS:
            valid = sorted(_FIELDS)
            close = difflib.get_close_matches(segments[0], valid, n=1)
            if not close:
                # Not a setting and not a near miss: a variable of the deployment's own that merely
                # shares the prefix (a secret named by ``password_env``, say). Leave it alone.
                continue
            raise ConfigError(
                name,
                f"names no kvtier setting (did you mean {ENV_PREFIX}{close[0].upper()}?); settings are "
                f"{', '.join(valid)} (plus {CONFIG_ENV} for the file); unset it or fix the name",
            )
        raw = env[name]
        last = segments[-1]
        if last.endswith("_file") and is_secret_key(last[: -len("_file")]):
            segments[-1] = last[: -len("_file")]
            raw = _read_secret_file(name, raw)
            value: Any = raw
        elif len(segments) == 1 and segments[0] in _TEXT_KEYS:
            value = raw
        elif is_secret_key(segments[-1]):
            value = raw  # a secret is text, whatever it looks like
        else:
            value = _env_value(raw)
        parts: list[str | int] = [int(s) if s.isdigit() else s for s in segments]
        out.append((name, parts, value))
    return out


def _env_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _read_secret_file(name: str, path: str) -> str:
    from kvtier.files import MAX_SECRET_FILE_BYTES, read_bounded

    # The path is not secret; the content is, and never appears in a message.
    raw = read_bounded(path, name, MAX_SECRET_FILE_BYTES, what="secret file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(name, f"cannot read secret file {path} (not UTF-8 text)") from exc
    return text.removesuffix("\n").removesuffix("\r")


# -- merging and origins --------------------------------------------------------------------------


def _merge(
    dst: MutableMapping[str, Any], origins: dict[str, str], src: Any, prefix: str, origin: str
) -> None:
    """Deep-merge mapping ``src`` into ``dst``; every leaf written gets ``origin``."""
    for key, value in src.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and isinstance(dst.get(key), MutableMapping):
            _merge(dst[key], origins, value, path, origin)
            continue
        _forget(origins, path)
        dst[key] = copy.deepcopy(value)
        for leaf, _ in _leaves(path, value):
            origins[leaf] = origin


def _set_path(
    root: dict[str, Any], origins: dict[str, str], parts: list[str | int], value: Any, origin: str, name: str
) -> None:
    """Set ``root[parts[0]][parts[1]]...`` to ``value``, creating mappings and list entries on the way."""
    node: Any = root
    path = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        nxt: Any = None if last else ([] if isinstance(parts[i + 1], int) else {})
        if isinstance(part, int):
            if not isinstance(node, list):
                raise ConfigError(name, f"{path or 'value'} is not a list; a number can only index a list")
            if part > len(node):
                raise ConfigError(
                    name, f"{path} has {len(node)} entries; index {part} must be at most {len(node)} (append)"
                )
            if part == len(node):
                node.append(nxt if not last else None)
            path = f"{path}[{part}]"
        else:
            if not isinstance(node, MutableMapping):
                raise ConfigError(name, f"{path} is not an object; cannot set key {part!r} in it")
            path = f"{path}.{part}" if path else part
            if not last and not isinstance(node.get(part), list | MutableMapping):
                node[part] = nxt
        if last:
            _forget(origins, path)
            node[part] = value
            for leaf, _ in _leaves(path, value):
                origins[leaf] = origin
            return
        node = node[part]


def _forget(origins: dict[str, str], path: str) -> None:
    for key in [k for k in origins if k == path or k.startswith((path + ".", path + "["))]:
        del origins[key]


def _leaves(path: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(f"{path}.{k}", v)]
    if isinstance(value, list) and value:
        return [leaf for i, v in enumerate(value) for leaf in _leaves(f"{path}[{i}]", v)]
    return [(path, value)]


def _origin_of(key_path: str, origins: Mapping[str, str]) -> str | None:
    """The origin of ``key_path`` or, failing that, of the nearest key under or above it."""
    if key_path in origins:
        return origins[key_path]
    under = [o for k, o in origins.items() if k.startswith((key_path + ".", key_path + "["))]
    if under:
        return under[0]
    parent = re.sub(r"(\.[^.\[]+|\[\d+\])$", "", key_path)
    return _origin_of(parent, origins) if parent and parent != key_path else None


def _default_value(name: str) -> Any:
    value = getattr(_DEFAULTS, name)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _text(value: Any) -> str:
    return value if value == REDACTED else json.dumps(value, default=str)
