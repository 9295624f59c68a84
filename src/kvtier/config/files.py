"""Reading a config file (JSON or YAML) into a mapping, with errors that point at the spot.

A syntax error names the file, line and column (``kv.yaml:3:9: invalid YAML: mapping values are
not allowed here``), so the user can jump to it; :func:`kvtier.config.load_config` and
:mod:`kvtier.config.layers` both read files through :func:`read_config_file` (and JSON strings
through :func:`loads_json`).

A config nested deeper than :data:`MAX_CONFIG_DEPTH` levels is refused in one line: without the
cap a 100k-deep ``[[[...]]]`` escaped as a ``RecursionError`` (exit 1, not the exit 2 of bad
input), and even a few hundred levels would break later recursive copies of the config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError

__all__ = ["MAX_CONFIG_DEPTH", "check_depth", "loads_json", "parse_config_text", "read_config_file"]

#: Deepest nesting of objects/lists a config may have (real ones use about 4).
MAX_CONFIG_DEPTH = 32


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
    data = _parse_yaml(text, where) if yaml_syntax else loads_json(text, where)
    check_depth(data, where)
    return {} if data is None else data


def loads_json(text: str, where: str, *, file: bool = True) -> Any:
    """``json.loads(text)``; a syntax error or a nesting too deep for the parser is a one-line
    :class:`ConfigError` starting with ``where`` (a file name; ``file=False``: a JSON string)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if not file:
            raise ConfigError("", f"{where} is invalid: {exc}") from exc
        raise ConfigError("", f"{where}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from exc
    except RecursionError:
        raise ConfigError("", f"{where}: nested deeper than {MAX_CONFIG_DEPTH} levels") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise ConfigError("", f"{where}: invalid JSON: {exc}") from None


def check_depth(data: Any, where: str, limit: int = MAX_CONFIG_DEPTH) -> None:
    """Refuse ``data`` nested deeper than ``limit`` objects/lists (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            raise ConfigError("", f"{where}: nested deeper than {limit} levels")
        stack.extend((c, depth + 1) for c in children)


def _parse_yaml(text: str, where: str) -> Any:
    try:
        import yaml
    except ImportError as exc:
        raise ConfigError(
            "", f"{where}: YAML needs PyYAML: pip install 'kvtier[cli]' (or use a .json file)"
        ) from exc
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise ConfigError("", f"{where}: nested deeper than {MAX_CONFIG_DEPTH} levels") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0] or "parse error"
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else where
        raise ConfigError("", f"{at}: invalid YAML: {problem}") from exc
