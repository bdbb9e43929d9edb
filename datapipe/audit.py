"""Read-only SQL over a run's audit database, for `datapipe sql` and for notebooks."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TextIO

import pyarrow as pa

ALLOWED = {"SELECT", "EXPLAIN"}


class AuditError(RuntimeError):
    pass


def connect(run_dir: Path):
    """A read-only DuckDB connection to RUN/stats.duckdb, with views over the documents' text."""
    import duckdb

    db = Path(run_dir) / "stats.duckdb"
    if not db.is_file():
        raise AuditError(f"no stats.duckdb in {run_dir}: is it the run folder of a finished `datapipe run`?")
    con = duckdb.connect(str(db), read_only=True)
    for view, folder in (("kept_docs", "docs"), ("rejected_docs", "rejected")):
        pattern = (Path(run_dir).resolve() / folder / "**" / "*.parquet").as_posix().replace("'", "''")
        if any((Path(run_dir) / folder).glob("**/*.parquet")):
            con.execute(f"CREATE TEMP VIEW {view} AS SELECT * FROM read_parquet('{pattern}', union_by_name=true)")
    return con


def run_query(run_dir: Path, query: str) -> pa.Table:
    import duckdb

    con = connect(run_dir)
    try:
        try:
            statements = con.extract_statements(query)
        except duckdb.Error as exc:
            raise AuditError(f"SQL error: {exc}") from None
        if not statements:
            raise AuditError("empty query")
        for st in statements:
            kind = st.type.name
            if kind not in ALLOWED:
                raise AuditError(f"datapipe sql is read-only: {kind} statements are refused; "
                                 f"only SELECT (and EXPLAIN) queries are allowed")
        if len(statements) > 1:
            raise AuditError("give one query at a time")
        try:
            return con.sql(query).to_arrow_table()
        except duckdb.Error as exc:
            raise AuditError(f"SQL error: {exc}") from None
    finally:
        con.close()


def write_result(table: pa.Table, fmt: str, out: TextIO) -> None:
    rows = table.to_pylist()
    if fmt == "json":
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    elif fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(table.column_names)
        writer.writerows([row[c] for c in table.column_names] for row in rows)
    else:
        from rich.console import Console
        from rich.table import Table

        view = Table(*table.column_names, show_lines=False)
        for row in rows:
            view.add_row(*("NULL" if row[c] is None else str(row[c]) for c in table.column_names))
        Console(file=out, width=200 if not out.isatty() else None).print(view)
        out.write(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''})\n")
