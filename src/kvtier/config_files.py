"""Reading a config file (JSON or YAML) into a mapping, with errors that point at the spot.

A syntax error names the file, line and column (``kv.yaml:3:9: invalid YAML: mapping values are
not allowed here``), so the user can jump to it; :func:`kvtier.config.load_config` and
:mod:`kvtier.config_layers` both read files through :func:`read_config_file`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError

__all__ = ["parse_config_text", "read_config_file"]


def read_config_file(path: Path) -> Any:
    """The parsed content of ``path`` (``.yaml``/``.yml`` as YAML, anything else as JSON); empty -> ``{}``.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8, or has a syntax error (with line:column).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("", f"{path}: cannot read config file ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        # Not an OSError: without this a binary file escaped as a bare ValueError with a traceback.
        raise ConfigError(
            "", f"{path}: config file is not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from exc
    return parse_config_text(text, str(path), yaml_syntax=path.suffix.lower() in (".yaml", ".yml"))


def parse_config_text(text: str, where: str, *, yaml_syntax: bool) -> Any:
    """Parse ``text`` as YAML or JSON; ``where`` (a file name) starts every error message."""
    if yaml_syntax:
        data = _parse_yaml(text, where)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("", f"{where}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from exc
    return {} if data is None else data


def _parse_yaml(text: str, where: str) -> Any:
    try:
        import yaml
    except ImportError as exc:
        raise ConfigError(
            "", f"{where}: YAML needs PyYAML: pip install 'kvtier[cli]' (or use a .json file)"
        ) from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0] or "parse error"
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else where
        raise ConfigError("", f"{at}: invalid YAML: {problem}") from exc
