"""Reading a config file (JSON or YAML) into a mapping, with errors that point at the spot.

A syntax error names the file, line and column (``kv.yaml:3:9: invalid YAML: mapping values are
not allowed here``), so the user can jump to it; :func:`kvtier.config.load_config` and
:mod:`kvtier.config.layers` both read files through :func:`read_config_file` (and JSON strings
through :func:`loads_json`).

A config nested deeper than :data:`MAX_CONFIG_DEPTH` levels is refused in one line: without the
cap a 100k-deep ``[[[...]]]`` escaped as a ``RecursionError`` (exit 1, not the exit 2 of bad
input), and even a few hundred levels would break later recursive copies of the config. So is
one that YAML aliases expand past :data:`MAX_CONFIG_NODES` values (an alias "bomb": a few lines
that stand for 10^9 nodes) or that refers to itself; the check visits each distinct node once,
so a bomb costs as little to refuse as its text to parse. The file itself is read through
:func:`kvtier.files.read_bounded` (a regular file of bounded size: never a FIFO or ``/dev/zero``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError
from kvtier.extras import install_hint
from kvtier.files import read_bounded

__all__ = [
    "MAX_CONFIG_DEPTH",
    "MAX_CONFIG_NODES",
    "check_depth",
    "loads_json",
    "parse_config_text",
    "read_config_file",
    "read_object_file",
]

#: Deepest nesting of objects/lists a config may have (real ones use about 4).
MAX_CONFIG_DEPTH = 32
#: Most values (aliases expanded) a config may stand for (real ones have a few hundred).
MAX_CONFIG_NODES = 100_000


def read_config_file(path: Path, *, what: str = "config file") -> Any:
    """The parsed content of ``path`` (``.yaml``/``.yml`` as YAML, anything else as JSON); empty -> ``{}``.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8, or has a syntax error (with line:column);
            ``what`` names the kind of file in the message.
    """
    raw = read_bounded(path, "", what=what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Not an OSError: without this a binary file escaped as a bare ValueError with a traceback.
        raise ConfigError("", f"{path}: {what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    return parse_config_text(text, str(path), yaml_syntax=path.suffix.lower() in (".yaml", ".yml"))


def read_object_file(path: str | Path, option: str, *, what: str, expected: str) -> Mapping[str, Any]:
    """The object in the file an option names (``--menu``, ``--model-config``), read as a config
    file is (:func:`read_config_file`: bounded, UTF-8, JSON or YAML by suffix, depth-checked).

    Raises:
        ConfigError: keyed by ``option``: the file's problem, or ``expected`` (what the object
            should be) when it holds something else.
    """
    p = Path(path)
    try:
        data = read_config_file(p, what=what)
    except ConfigError as exc:
        raise ConfigError(option, exc.detail) from None
    if not isinstance(data, Mapping):
        raise ConfigError(option, f"{p}: expected {expected}")
    return data


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


def check_depth(
    data: Any, where: str, limit: int = MAX_CONFIG_DEPTH, max_nodes: int = MAX_CONFIG_NODES
) -> None:
    """Refuse ``data`` nested deeper than ``limit`` objects/lists, standing for more than
    ``max_nodes`` values once shared (aliased) parts are counted every time they appear, or
    containing itself. Iterative (no recursion), and each distinct object/list is visited once:
    its depth and expanded size are remembered, so an alias bomb is refused without walking it."""
    shape: dict[int, tuple[int, int]] = {}  # id of a finished container -> (depth, expanded size)
    open_: set[int] = set()  # containers entered, not finished: the current path
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, finished = stack.pop()
        kids = _children(node)
        if kids is None:
            continue
        key = id(node)
        if finished:
            open_.discard(key)
            depth, size = 1, 1
            for c in kids:
                if _children(c) is None:
                    size += 1
                    continue
                d, s = shape[id(c)]
                depth, size = max(depth, d + 1), size + s
            if depth > limit:
                raise ConfigError("", f"{where}: nested deeper than {limit} levels")
            if size > max_nodes:
                raise ConfigError(
                    "", f"{where}: stands for more than {max_nodes} values (YAML aliases expanded)"
                )
            shape[key] = (depth, size)
            continue
        if key in shape:
            continue
        if key in open_:
            raise ConfigError("", f"{where}: contains itself (a YAML alias inside its own anchor)")
        if len(open_) >= limit:
            raise ConfigError("", f"{where}: nested deeper than {limit} levels")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in kids if _children(c) is not None and id(c) not in shape)


def _children(node: Any) -> list[Any] | None:
    if isinstance(node, dict):
        return list(node.values())
    if isinstance(node, list):
        return node
    return None


def _parse_yaml(text: str, where: str) -> Any:
    try:
        import yaml
    except ImportError as exc:
        raise ConfigError(
            "", f"{where}: YAML needs PyYAML: {install_hint('yaml')} (or use a .json file)"
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
