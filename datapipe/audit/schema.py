"""The audit database ``stats.duckdb``, declared once: its tables (name, Arrow schema, sort order), the
aggregates every run has, and the names of its views.

``engine/finish.py`` writes one table per :data:`TABLES` entry from rows it collects from the markers;
``audit/documents.py`` and ``audit/sql.py`` read the index tables by these names; the ``agg_`` tables
are declared by :func:`core_aggregates` here and by the run's stages (``Stage.aggregates``) and
merged from the map tasks' aggregate files (``audit/aggregates.py``). ``docs/audit.md`` describes
them for users.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from datapipe.stages.report_section import Aggregate, column
from datapipe.tokens.shard_format import MANIFEST_SCHEMA


@dataclass(frozen=True)
class Table:
    """One table of ``stats.duckdb``: written from rows in ``schema``, sorted by ``order``."""

    name: str
    schema: pa.Schema
    order: str
    doc: str


def _schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema(list(fields))


RUN = Table(
    "run",
    _schema(("root", pa.string()), ("fingerprint", pa.string()), ("stages", pa.string())),
    "",
    "where the run was written, its fingerprint, its stages (JSON)",
)
STAGES = Table(
    "stages",
    _schema(
        ("position", pa.int64()),
        ("stage", pa.string()),
        ("docs_in", pa.int64()),
        ("skipped", pa.int64()),
        ("dropped", pa.int64()),
        ("changed", pa.int64()),
    ),
    "position",
    "one row per stage: documents in, passed untouched (kind not in its kinds), dropped, changed",
)
STAGE_REASONS = Table(
    "stage_reasons",
    _schema(
        ("position", pa.int32()),
        ("stage", pa.string()),
        ("docs_in", pa.int64()),
        ("reason", pa.string()),
        ("dropped", pa.int64()),
    ),
    "position, reason",
    "documents each stage dropped, per reason",
)
STAGE_EDITS = Table(
    "stage_edits",
    _schema(
        ("position", pa.int64()),
        ("stage", pa.string()),
        ("signal", pa.string()),
        ("what", pa.string()),
        ("total", pa.int64()),
    ),
    "position, signal",
    "what stages that change documents did to those they passed on (Stage.edit_counts)",
)
SHARD_FILES = Table("shard_files", MANIFEST_SCHEMA, "path", "the packed token shards (the manifest)")
DOCUMENT_FILES = Table(
    "document_files",
    _schema(
        ("path", pa.string()),
        ("status", pa.string()),
        ("layout", pa.int32()),
        ("rows", pa.int64()),
        ("min_id", pa.string()),
        ("max_id", pa.string()),
    ),
    "path",
    "every kept and rejected Parquet file (relative to the run folder), its rows and id range",
)
DOCUMENT_LAYOUTS = Table(
    "document_layouts",
    _schema(("layout", pa.int32()), ("schema", pa.binary())),
    "layout",
    "each column layout of those files, as a serialized Arrow schema",
)
DOCUMENT_COLUMNS = Table(
    "document_columns",
    _schema(("position", pa.int32()), ("name", pa.string()), ("type", pa.string())),
    "position",
    "the columns of documents, in order, with their DuckDB types",
)
AUDIT_VIEWS = Table(
    "audit_views",
    _schema(("position", pa.int32()), ("name", pa.string()), ("sql", pa.string())),
    "position",
    "the views on documents and on the aggregates (mixture, contamination, the stages' own)",
)
COPIES_FILES = Table(
    "copies_files",
    _schema(
        ("path", pa.string()),
        ("stage", pa.string()),
        ("rows", pa.int64()),
        ("min_dup_of", pa.string()),
        ("max_dup_of", pa.string()),
    ),
    "path",
    "the copies index files (copies/): the copies a dedup stage dropped, by survivor",
)
AGGREGATE_FILES = Table(
    "aggregate_files",
    _schema(("path", pa.string()), ("rows", pa.int64())),
    "path",
    "the map tasks' aggregate files (aggregates/), merged into the agg_ tables",
)
TABLES: tuple[Table, ...] = (
    RUN,
    STAGES,
    STAGE_REASONS,
    STAGE_EDITS,
    SHARD_FILES,
    DOCUMENT_FILES,
    DOCUMENT_LAYOUTS,
    DOCUMENT_COLUMNS,
    AUDIT_VIEWS,
    COPIES_FILES,
    AGGREGATE_FILES,
)
BY_NAME = {t.name: t for t in TABLES}
# The tables that describe ``documents`` by its files (a database of an older datapipe held it as a table).
INDEX_TABLES = (DOCUMENT_FILES.name, DOCUMENT_LAYOUTS.name, DOCUMENT_COLUMNS.name, AUDIT_VIEWS.name, COPIES_FILES.name)

# The documented columns of ``documents``, in order, with their type when a run has no such signal.
CORE_COLUMNS: list[tuple[str, str]] = [
    ("id", "VARCHAR"),
    ("source", "VARCHAR"),
    ("kind", "VARCHAR"),
    ("lang", "VARCHAR"),
    ("license", "VARCHAR"),
    ("status", "VARCHAR"),
    ("stage", "VARCHAR"),
    ("reason", "VARCHAR"),
    ("detail", "VARCHAR"),
    ("n_chars", "BIGINT"),
    ("n_tokens", "BIGINT"),
]
NOT_IN_DOCUMENTS = {"text"}  # the text stays in docs/ and rejected/; the table is for counting

# Length histograms: log-spaced bins, this many per decade (bin b holds [10^(b/4), 10^((b+1)/4))).
LENGTH_BINS_PER_DECADE = 4


def core_aggregates(columns: set[str]) -> list[Aggregate]:
    """The aggregates of every run: documents, characters and tokens by source x kind x lang x script x
    license class x status x stage x reason x split (the report's cards, funnel by language, the
    mixture, ``datapipe stats``); the length histograms."""
    c = lambda name, ctype="VARCHAR": column(columns, name, ctype)  # noqa: E731
    tokens, dup, repeat = c("n_tokens", "BIGINT"), c("dup_count", "BIGINT"), c("mixture_repeat", "BIGINT")
    keys = ("source", "kind", "lang", "script", "license_class", "status", "stage", "reason", "split")
    documents = Aggregate(
        "documents",
        f"""SELECT {", ".join(f"{c(k)} AS {k}" for k in keys)}, count(*)::BIGINT AS documents,
               coalesce(sum({c("n_chars", "BIGINT")}), 0)::BIGINT AS chars, coalesce(sum({tokens}), 0)::BIGINT AS tokens,
               coalesce(sum({tokens} * coalesce({dup}, 1)), 0)::BIGINT AS rehydrated_tokens,
               coalesce(sum({tokens} * coalesce({repeat}, 1)), 0)::BIGINT AS repeated_tokens
            FROM documents GROUP BY ALL""",
        (
            *((k, "VARCHAR") for k in keys),
            ("documents", "BIGINT"),
            ("chars", "BIGINT"),
            ("tokens", "BIGINT"),
            ("rehydrated_tokens", "BIGINT"),
            ("repeated_tokens", "BIGINT"),
        ),
        merge={v: "sum" for v in ("documents", "chars", "tokens", "rehydrated_tokens", "repeated_tokens")},
        order="status, source, lang, kind, stage, reason",
    )
    per = LENGTH_BINS_PER_DECADE
    parts = [
        f"""SELECT {c("status")} AS status, {c("source")} AS source, {c("lang")} AS lang, '{measure}' AS measure,
                   floor(log10(greatest({value}, 1)) * {per})::INTEGER AS bin, count(*)::BIGINT AS documents
            FROM documents WHERE {value} IS NOT NULL GROUP BY ALL"""
        for measure, value in (("chars", c("n_chars", "BIGINT")), ("tokens", tokens))
    ]
    lengths = Aggregate(
        "lengths",
        " UNION ALL ".join(parts),
        (
            ("status", "VARCHAR"),
            ("source", "VARCHAR"),
            ("lang", "VARCHAR"),
            ("measure", "VARCHAR"),
            ("bin", "INTEGER"),
            ("documents", "BIGINT"),
        ),
        merge={"documents": "sum"},
        order="measure, status, source, lang, bin",
    )
    return [documents, lengths]


def write_table(con: Any, table: Table, rows: pa.Table | list[dict[str, Any]]) -> None:
    """Create ``table`` in ``con`` from ``rows`` (an Arrow table or dicts in its schema), sorted by its order."""
    data = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows, schema=table.schema)
    name = f"__rows_{table.name}"
    con.register(name, data.cast(table.schema))
    try:
        order = f" ORDER BY {table.order}" if table.order else ""
        con.execute(f"CREATE TABLE {table.name} AS SELECT * FROM {name}{order}")
    finally:
        con.unregister(name)
