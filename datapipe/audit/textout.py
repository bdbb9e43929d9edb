"""Tables of data for the terminal: every cell shown verbatim, nothing cut when piped.

Cells hold corpus text, ids, paths and SQL aliases, so they are never read as rich markup
(``Tuple[float, float]`` lost its brackets, ``[//example.org x]`` raised MarkupError) or
emoji codes (``:x:``): consoles here have markup, emoji and highlighting off, and cells are
``Text`` objects. When the output is not a terminal (a pipe, a file), rich would squeeze
tables to 80 columns and cut numbers to ``1,2…``; there the width is unbounded so every
value is printed in full, and columns fold rather than truncate on a narrow terminal.
Control characters other than newline and tab are shown as ``\\xNN`` escapes: corpus text
holds ANSI and OSC sequences that would otherwise recolour, retitle or scramble the terminal
(rich passes ESC through), and a lone carriage return would hide the start of a line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 1_000_000  # "unbounded": tables take their natural width, lines are not wrapped


def make_console(file: TextIO | None = None, pipe_width: int = PIPE_WIDTH) -> Console:
    """A console that prints text as given; ``pipe_width`` wide when ``file`` (default stdout) is not a
    terminal: unbounded by default, so every value is printed in full (a report meant for a log
    passes a width it fits its tables to instead)."""
    width = None if Console(file=file).is_terminal else pipe_width
    return Console(file=file, width=width, markup=False, emoji=False, highlight=False)


# C0 controls but \t and \n, DEL and C1 controls -> a visible escape.
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]}


def cell(value: Any) -> Text:
    if isinstance(value, Text):
        return value
    return Text(str(value).replace("\r\n", "\n").translate(_CONTROLS))


class DataTable(Table):
    """A rich Table whose cells are always literal text."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*(None if r is None else cell(r) for r in renderables), **kwargs)


def data_table(columns: Iterable[str], title: str | None = None, right: Iterable[str] = ()) -> DataTable:
    """A table with literal headers and cells; ``right`` names the right-aligned (numeric) columns."""
    right = set(right)
    table = DataTable(title=Text(title) if title else None, title_justify="left")
    for name in columns:
        # fold: a value wider than its column wraps onto the next line instead of ending in "…".
        table.add_column(Text(str(name)), justify="right" if name in right else "left", overflow="fold")
    return table
