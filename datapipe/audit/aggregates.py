"""The aggregate tables of a run: written by every map task beside its outputs, merged at the end of the run.

A run's aggregates are :func:`datapipe.audit.schema.core_aggregates` and those of its stages
(``Stage.aggregates``), each one GROUP BY over documents (``stages/report_section.py``). Three places
run them, all through this module, so they cannot drift apart:

- a map task, over the kept and rejected files it has just written (``task_aggregates``): one small
  Parquet file per task, ``aggregates/<shard>.<segment>.parquet``, with a column ``aggregate`` naming
  each row's table and the union of the tables' columns; written atomically and named in the task's
  marker like its other outputs (so resume and object stores treat it as they treat them);
- the end of the run, which merges those files into ``agg_<name>`` tables of ``stats.duckdb``
  (``create_tables``): O(tasks x groups), never O(documents). Beyond a bounded number of files they are
  first merged in a tree of tasks (``engine/aggregate_tree.py``), each combining a few files into one
  of the same form (``merge_files``), so the driver reads a few files whatever the number of tasks;
- the report and ``datapipe stats`` on a run folder written before the tasks wrote aggregates:
  the same SQL over the whole ``documents`` view (``scan_tables``; a full scan, and they say so).

So ``agg_<name>`` holds, by construction, what the aggregate's SQL gives over the run's ``documents``:
``tests/audit/test_aggregates.py`` checks it on a real run.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from datapipe.audit.schema import AGGREGATE_FILES, core_aggregates
from datapipe.stages.report_section import Aggregate, literal, quoted

if TYPE_CHECKING:
    from datapipe.stages.base import Stage

AGGREGATE_COLUMN = "aggregate"  # the table a row of a task's aggregate file belongs to
_ARROW = {
    "VARCHAR": pa.string(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
}
# A map task's DuckDB: one thread (the task has its own CPUs; the worker runs one task at a time)
# and a small memory cap (its groups, never its documents).
TASK_THREADS = 1
TASK_MEMORY = "256MB"


def run_aggregates(stage_types: Iterable[type[Stage]], columns: set[str]) -> list[Aggregate]:
    """Every aggregate of a run with these stage types, for documents with these columns; a name
    declared twice with other columns is a ValueError naming the stage."""
    out: dict[str, Aggregate] = {a.name: a for a in core_aggregates(columns)}
    owner = dict.fromkeys(out, "every run")
    for cls in dict.fromkeys(stage_types):
        for agg in cls.aggregates(columns):
            if agg.name in out and out[agg.name].columns != agg.columns:
                raise ValueError(f"stage {cls.name!r} declares the aggregate {agg.name!r}, which {owner[agg.name]} declares too")
            out[agg.name], owner[agg.name] = agg, f"stage {cls.name!r}"
    return list(out.values())


def arrow_type(ctype: str) -> pa.DataType:
    try:
        return _ARROW[ctype.upper()]
    except KeyError:
        raise ValueError(f"aggregate column type {ctype!r} is not one of {sorted(_ARROW)}") from None


def table_schema(agg: Aggregate) -> pa.Schema:
    return pa.schema([(name, arrow_type(ctype)) for name, ctype in agg.columns])


def file_schema(aggregates: Sequence[Aggregate]) -> pa.Schema:
    """The columns of a task's aggregate file: ``aggregate``, then every table's columns by name (a
    name two tables share must have one type in both)."""
    fields: dict[str, pa.DataType] = {}
    for agg in aggregates:
        for name, ctype in agg.columns:
            t = arrow_type(ctype)
            if fields.setdefault(name, t) != t:
                raise ValueError(f"aggregate {agg.name!r}: column {name!r} is {ctype}, another aggregate's is {fields[name]}")
    return pa.schema([(AGGREGATE_COLUMN, pa.string()), *fields.items()])


def _select(agg: Aggregate, relation: str) -> str:
    """``agg``'s rows over ``relation`` (its SQL reads ``documents``), tagged with its name."""
    names = ", ".join(quoted(c) for c, _ in agg.columns)
    return f"SELECT {literal(agg.name)} AS {AGGREGATE_COLUMN}, {names} FROM (WITH documents AS (FROM {relation}) {_body(agg)})"


def _body(agg: Aggregate) -> str:
    """``agg``'s SELECT over ``documents`` (no rows, its columns typed, when it has no SQL)."""
    return agg.sql or "SELECT " + ", ".join(f"NULL::{t} AS {quoted(c)}" for c, t in agg.columns) + " WHERE false"


def task_aggregates(files: Sequence[tuple[Path, str]], stage_types: Iterable[type[Stage]]) -> pa.Table | None:
    """The aggregate rows of one map task's documents: ``files`` are the (path, status) of the kept
    and rejected files it wrote. None when it wrote none. Each aggregate's rows are sorted by their
    columns, so the same documents always give the same file."""
    import pyarrow.parquet as pq

    if not files:
        return None
    columns = {"status"}  # the files' own columns, and the status the view below gives each row
    for path, _ in files:
        columns.update(pq.read_schema(path).names)
    aggregates = run_aggregates(stage_types, columns)
    by_status: dict[str, list[str]] = {}
    for path, status in files:
        by_status.setdefault(status, []).append(literal(str(path)))
    # Only the columns the aggregates name are read (DuckDB prunes the rest, the text among them).
    documents = " UNION ALL BY NAME ".join(
        f"SELECT *, {literal(status)} AS status FROM read_parquet([{', '.join(paths)}], union_by_name = true)"
        for status, paths in sorted(by_status.items())
    )
    con = _task_connection()
    try:
        # One statement: the files' metadata read and their documents scanned once for every aggregate.
        con.execute(f"CREATE TEMP TABLE {_TASK_ROWS} AS {_all_selects(aggregates, documents)}")
        rows = con.sql(f"FROM {_TASK_ROWS} ORDER BY ALL").to_arrow_table()
        con.execute(f"DROP TABLE {_TASK_ROWS}")
    except BaseException:
        _close_task_connection()  # whatever the failed statement left behind goes with its connection
        raise
    return _as_file(_split(rows, aggregates), file_schema(aggregates))


# A map task's aggregates run on a connection its worker process opens once (opening one costs more
# than the queries of a small task), one per thread; a task leaves nothing in it (its rows' temporary
# table is dropped; a failed task closes it), and a forked child opens its own.
_TASK_ROWS = "__task_aggregate_rows"
_INDEX = "__aggregate_index"
_LOCAL = threading.local()
_INHERITED: list[Any] = []  # connections a forked child got from its parent: never used nor closed in it


def _task_connection() -> Any:
    import duckdb

    held = getattr(_LOCAL, "held", None)
    if held is not None and held[0] == os.getpid():
        return held[1]
    if held is not None:
        _INHERITED.append(held[1])
    # No cache of files' contents: a retried task rewrites its files under the same names.
    config: dict[str, str | bool | int] = {"threads": TASK_THREADS, "memory_limit": TASK_MEMORY}
    con = duckdb.connect(config={**config, "enable_external_file_cache": False})
    con.execute("SET enable_progress_bar = false")
    _LOCAL.held = (os.getpid(), con)
    return con


def _close_task_connection() -> None:
    held, _LOCAL.held = getattr(_LOCAL, "held", None), None
    if held is not None and held[0] == os.getpid():
        held[1].close()


def _slot(index: int, name: str) -> str:
    """Column ``name`` of the ``index``-th aggregate in the rows of all of them (no two aggregates share one)."""
    return f"{index}:{name}"


def _all_selects(aggregates: Sequence[Aggregate], documents: str) -> str:
    """Every aggregate's rows over ``documents`` (a SELECT) in one query: ``documents`` read once, each
    aggregate's columns its own (typed by its SQL, as a query of its own would give them)."""
    selects = []
    for i, agg in enumerate(aggregates):
        names = ", ".join(f"{quoted(c)} AS {quoted(_slot(i, c))}" for c, _ in agg.columns)
        selects.append(f"(SELECT {i} AS {_INDEX}, {names} FROM (WITH documents AS (FROM task_documents) {_body(agg)}))")
    return f"WITH task_documents AS MATERIALIZED ({documents}) {' UNION ALL BY NAME '.join(selects)}"


def _split(rows: pa.Table, aggregates: Sequence[Aggregate]) -> list[pa.Table]:
    """The rows of ``_all_selects`` as one table per aggregate, named as ``_select`` names them."""
    import pyarrow.compute as pc

    out = []
    for i, agg in enumerate(aggregates):
        mine = rows.filter(pc.equal(rows[_INDEX], i))
        names = [AGGREGATE_COLUMN, *(c for c, _ in agg.columns)]
        data = [pa.array([agg.name] * mine.num_rows, pa.string()), *(mine[_slot(i, c)] for c, _ in agg.columns)]
        out.append(pa.table(data, names=names))
    return out


def _as_file(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """The aggregates' rows in one table of ``schema`` (each table's missing columns null)."""
    out = []
    for t in tables:
        if t.num_rows:
            out.append(
                pa.table(
                    [t[f.name].cast(f.type) if f.name in t.column_names else pa.nulls(t.num_rows, f.type) for f in schema],
                    schema=schema,
                )
            )
    return pa.concat_tables(out) if out else schema.empty_table()


# A partial merge (``merge_files``) keeps of an aggregate with a ``limit`` (a list of the most frequent
# removed lines, the largest duplicate groups) this many times its limit, first by its order, so its
# memory stays bounded however many distinct rows the files below it hold (every line removed from any
# document). The list is then exact wherever no partial merge had more rows than that (a run with up to
# 10,000 distinct removed lines, say), and beyond it made of the rows that lead some part of the run: a
# row cut from every part it is in is missing, and a row cut from some has its count from the others.
PARTIAL_KEEP = 10


def merge_sql(agg: Aggregate, relation: str, partial: bool = False) -> str:
    """``agg``'s table from the rows of many tasks (or one scan) in ``relation``: grouped by its keys,
    each value combined by its ``merge``. ``partial``: rows of one aggregate file again (its ``aggregate``
    column first), of a part of the run's files (``merge_files``), bounded by ``PARTIAL_KEEP``."""
    exprs = [f"{literal(agg.name)} AS {AGGREGATE_COLUMN}"] if partial else []
    for name, ctype in agg.columns:
        how = agg.merge.get(name)
        if how is None:
            exprs.append(quoted(name))
        else:
            call = f"{how}({quoted(name)})" if how.isidentifier() else how
            exprs.append(f"CAST({call} AS {ctype}) AS {quoted(name)}")
    sql = f"SELECT {', '.join(exprs)} FROM {relation} WHERE {AGGREGATE_COLUMN} = {literal(agg.name)} GROUP BY ALL"
    if partial and agg.limit is None:
        return sql  # every group: the order is the final table's
    if agg.order:
        sql += f" ORDER BY {agg.order}"
    if agg.limit is not None:
        sql += f" LIMIT {int(agg.limit) * (PARTIAL_KEEP if partial else 1)}"
    return sql


def merge_files(paths: Sequence[str], filesystem: Any, aggregates: Sequence[Aggregate]) -> pa.Table:
    """The rows of the aggregate files at ``paths`` (on the pyarrow ``filesystem``) merged into the rows of
    one aggregate file: each aggregate grouped by its keys and its values combined by its ``merge``, as
    ``create_tables`` combines them, so merging the result with other files' gives its tables. In a
    connection of its own, one thread and ``TASK_MEMORY`` (a task of the merge tree). Rows of an
    aggregate not in ``aggregates`` are a ValueError: a merge never drops a table."""
    import duckdb

    schema = file_schema(aggregates)
    if not paths:
        return schema.empty_table()
    with duckdb.connect(config={"threads": TASK_THREADS, "memory_limit": TASK_MEMORY}) as con:
        con.execute("SET enable_progress_bar = false")
        relation = read_once(con, paths, filesystem, schema)
        found = {r[0] for r in con.execute(f"SELECT DISTINCT {AGGREGATE_COLUMN} FROM {relation}").fetchall()}
        if unknown := found - {a.name for a in aggregates} - {None}:
            raise ValueError(
                f"aggregate files hold rows of {sorted(unknown)}, which no stage of this run declares "
                f"(declared: {sorted(a.name for a in aggregates)})"
            )
        tables = [con.sql(merge_sql(agg, relation, partial=True)).to_arrow_table() for agg in aggregates]
    return _as_file(tables, schema)


def read_once(con: Any, paths: Sequence[str], filesystem: Any, schema: pa.Schema) -> str:
    """The rows of the aggregate files at ``paths`` as a temporary table of ``con`` (its name): read once,
    then merged per aggregate (a query per aggregate over the files read every file again for each)."""
    import pyarrow.dataset as ds

    dataset = ds.FileSystemDataset.from_paths(list(paths), schema=schema, format=ds.ParquetFileFormat(), filesystem=filesystem)
    con.register("__aggregate_files", dataset)
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE __aggregate_rows AS SELECT * FROM __aggregate_files")
    finally:
        con.unregister("__aggregate_files")
    return "__aggregate_rows"


def create_tables(con: Any, relation: str, aggregates: Sequence[Aggregate], temp: bool = False) -> None:
    """One table ``agg_<name>`` per aggregate, merged from the rows in ``relation``."""
    kind = "TEMP TABLE" if temp else "TABLE"
    for agg in aggregates:
        con.execute(f"CREATE OR REPLACE {kind} {agg.table} AS {merge_sql(agg, relation)}")


def has_tables(con: Any) -> bool:
    """Whether the database holds the run's aggregate tables (a database of an older datapipe does not)."""
    row = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [AGGREGATE_FILES.name]).fetchall()
    return bool(row[0][0])


def scan_rows(con: Any, aggregates: Sequence[Aggregate]) -> pa.Table:
    """Every aggregate's rows over the whole ``documents`` view of ``con``, as one task would write them."""
    return _as_file([con.sql(_select(agg, "documents")).to_arrow_table() for agg in aggregates], file_schema(aggregates))


def scan_tables(con: Any, stage_types: Iterable[type[Stage]], temp: bool = True) -> None:
    """The aggregate tables computed from ``documents`` itself (a full scan): for a database written
    before the tasks wrote aggregates, or a run with a task that did not."""
    columns = {r[0] for r in con.execute("DESCRIBE documents").fetchall()}
    aggregates = run_aggregates(stage_types, columns)
    con.register("__scanned_aggregates", scan_rows(con, aggregates))
    try:
        create_tables(con, "__scanned_aggregates", aggregates, temp=temp)
    finally:
        con.unregister("__scanned_aggregates")


def stage_types(run: dict[str, Any]) -> list[type[Stage]]:
    """The stage types of a run's pipeline, from run.json (a stage whose plugin is not installed is left out)."""
    from datapipe.stages import STAGES

    out = []
    for entry in (run.get("config") or {}).get("stages") or []:
        kind = entry if isinstance(entry, str) else next(iter(entry), None) if isinstance(entry, dict) else None
        if isinstance(kind, str) and kind in STAGES:
            out.append(STAGES[kind])
    return out


def ensure_tables(con: Any, run: dict[str, Any], warn: Any = None) -> bool:
    """Make sure ``con`` has the run's ``agg_`` tables: a database of a datapipe before the tasks wrote
    them gets them from a full scan of ``documents`` (temporary tables), and ``warn`` is told so.
    Returns whether it scanned."""
    if has_tables(con):
        return False
    if warn is not None:
        warn(SCANNED)
    scan_tables(con, stage_types(run))
    return True


SCANNED = (
    "note: this run folder was written by a datapipe whose tasks did not count their documents "
    "(no aggregate tables in stats.duckdb): reading every document instead, which takes long on a "
    "large run; running the same `datapipe run` again with this datapipe rewrites it"
)
