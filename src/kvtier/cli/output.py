"""What the CLI prints: tables and lines, as rich output when ``rich`` is installed, plain text otherwise.

Commands describe their output as :class:`TextTable` values and strings and hand them to
:func:`emit`. With ``rich`` (extra ``cli``) tables get borders and colours on a terminal; without it
they are aligned plain text with the same titles, columns and cells, so every command works on the
core install. Text is never read as rich markup: a title such as ``load[t]`` prints as written.

Everything is rendered to a string first and written with one ``sys.stdout.write``: a reader that
leaves early (``kvtier replay | head -1``) surfaces as ``BrokenPipeError``, which
:func:`kvtier.cli.main.main` turns into exit code 0 (rich would otherwise exit 1 on its own).
"""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["TextTable", "emit", "have_rich", "render"]

#: Output width when stdout is not a terminal (pipes, files, tests): wide enough for every table.
PIPE_WIDTH = 120


@dataclass
class TextTable:
    """One table: ``title``, column names, rows of cells (already formatted as text).

    ``right`` names the columns aligned right (numbers); ``show_header=False`` for key/value tables.
    """

    title: str
    columns: Sequence[str]
    rows: list[Sequence[str]] = field(default_factory=list)
    right: frozenset[str] = frozenset()
    show_header: bool = True

    def add_row(self, *cells: object) -> None:
        self.rows.append(["" if c is None else str(c) for c in cells])


def have_rich() -> bool:
    """Whether ``rich`` can be imported (extra ``cli``)."""
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def _plain(item: TextTable) -> str:
    cols = list(item.columns)
    widths = [len(c) if item.show_header else 0 for c in cols]
    for r in item.rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def line(cells: Sequence[str]) -> str:
        out = [
            c.rjust(w) if col in item.right else c.ljust(w)
            for c, w, col in zip(cells, widths, cols, strict=True)
        ]
        return "  ".join(out).rstrip()

    lines = [item.title] if item.title else []
    if item.show_header:
        lines += [line(cols), "  ".join("-" * w for w in widths)]
    lines += [line(r) for r in item.rows]
    return "\n".join(lines) + "\n"


def _rich(items: Sequence[TextTable | str], width: int | None, terminal: bool) -> str:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=terminal, highlight=False, markup=False)
    for item in items:
        if isinstance(item, str):
            console.print(Text(item))
            continue
        if item.title:
            # Its own line, not the table's title: rich wraps a title to the table's width.
            console.print(Text(item.title), overflow="ignore", crop=False)
        table = Table(show_header=item.show_header)
        for col in item.columns:
            table.add_column(Text(col), justify="right" if col in item.right else "left", overflow="fold")
        for r in item.rows:
            table.add_row(*(Text(c) for c in r))
        console.print(table)
    return buf.getvalue()


def render(items: Sequence[TextTable | str], *, plain: bool | None = None) -> str:
    """The text ``emit`` writes: rich when available (``plain=None``), plain text when asked or missing."""
    use_rich = have_rich() if plain is None else not plain
    if use_rich:
        terminal = sys.stdout.isatty()
        width = shutil.get_terminal_size().columns if terminal else PIPE_WIDTH
        return _rich(items, width, terminal)
    return "".join(item + "\n" if isinstance(item, str) else _plain(item) for item in items)


def emit(items: Sequence[TextTable | str], *, plain: bool | None = None) -> None:
    """Write ``items`` to stdout in one piece (see the module docstring for the broken-pipe contract)."""
    sys.stdout.write(render(items, plain=plain))
    sys.stdout.flush()
