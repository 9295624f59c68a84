"""A table as plain values (title, columns, rows of text), built by reports and printed by the CLI.

Library code (``kvtier.sim.report``) describes what it shows as :class:`TextTable` values without
knowing how they are printed; :mod:`kvtier.cli.output` renders them (rich or plain text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["TextTable"]


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
