"""What a stage adds to a run's audit: aggregate tables its map tasks write, and report sections over them.

Both are plain values (SQL text and names), so a stage declares them without importing ``datapipe.audit``,
which runs them:

- an :class:`Aggregate` is one GROUP BY over the documents a map task wrote (kept and rejected). Every
  map task writes the rows of every aggregate of its run beside its outputs; the end of the run merges
  them into the table ``agg_<name>`` of ``stats.duckdb`` (``merge`` says how a value column adds up:
  ``sum`` by default). So the report and ``datapipe stats`` read a few thousand rows, never the
  documents (``audit/aggregates.py``);
- a :class:`ReportSection` is a heading and one SELECT over those tables (and the run's other small
  tables), rendered by ``datapipe report`` as a table or a bar chart (``audit/report.py``).

``Stage.aggregates(columns)`` and ``Stage.report_sections(columns)`` return them, ``columns`` being
those a task's documents have (for an aggregate) or those of the run's ``documents`` (for a section):
a stage whose columns are missing returns none, or SQL that reads NULL in their place.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Aggregate:
    """``agg_<name>``: ``sql`` is a SELECT over ``documents`` (one task's, or the whole run's) giving
    ``columns`` (name, DuckDB type), grouped by every column not in ``merge`` (empty: no rows, for
    documents without the stage's signals); a task's rows and the
    run's merged rows have the same columns. ``merge``: value column -> the aggregate that combines
    the tasks' rows (``sum``, ``min``, ``max``, or any expression over the columns, such as
    ``arg_min(least_id, least)``); a column not named here is a key. ``order``: the merged table's
    ORDER BY; ``limit``: keep only its first rows (for lists without a bound, such as removed lines)."""

    name: str
    sql: str
    columns: tuple[tuple[str, str], ...]
    merge: dict[str, str] = field(default_factory=dict)
    order: str = ""
    limit: int | None = None

    @property
    def keys(self) -> list[str]:
        return [c for c, _ in self.columns if c not in self.merge]

    @property
    def table(self) -> str:
        return f"agg_{self.name}"


# How a section is drawn: a table of its rows; or a stacked bar chart (first column the label, the
# numeric columns the series) above the same table.
SECTION_KINDS = ("table", "bars")


@dataclass(frozen=True)
class ReportSection:
    """One part of ``datapipe report``: a heading, then ``sql``'s rows (a SELECT over ``stats.duckdb``'s
    tables: the ``agg_`` tables, ``stages``, ``shards``, ...). ``columns``: the table's header (default:
    the query's column names). ``heading``: 2 for a section, 3 for a part of the one above (an empty
    title draws no heading). ``texts``: columns holding document ids, each followed in the table by the
    beginning of that document's text. ``note``: a sentence under the heading. A section whose query
    returns no row is left out."""

    title: str
    sql: str
    kind: str = "table"
    columns: tuple[str, ...] = ()
    heading: int = 2
    texts: tuple[str, ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        if self.kind not in SECTION_KINDS:
            raise ValueError(f"report section {self.title!r}: kind {self.kind!r} is not one of {SECTION_KINDS}")


def quoted(name: str) -> str:
    """A column name as a SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """A string as a SQL literal."""
    return "'" + text.replace("'", "''") + "'"


def column(columns: set[str], name: str, ctype: str = "VARCHAR") -> str:
    """``name`` cast to ``ctype`` where ``columns`` has it, else NULL of that type: an aggregate's SQL
    reads the same in a task whose documents lack a signal (rejected before its stage)."""
    return f"CAST({quoted(name)} AS {ctype})" if name in columns else f"NULL::{ctype}"
