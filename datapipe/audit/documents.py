"""``documents`` as a view over the run's own Parquet files, not a sorted copy of every row.

The map tasks that write the kept (``docs/``) and rejected (``rejected/``) files record each file in
their completion marker: its path in the run folder, status, rows, smallest and largest ``id`` and
its columns (``ParquetSink.audit_entry``). At the end of a run the driver turns those records into
three small tables of ``stats.duckdb`` (``engine/finish.py``), one row per file, per column layout
or per column, whatever the size of the corpus:

- ``document_files``: path (relative to the run folder), status, layout, rows, min_id, max_id;
- ``document_layouts``: one Arrow schema per set of columns files share (a source's kept files,
  one stage's rejects), read from one file's footer;
- ``document_columns``: the columns of ``documents`` in order, with their DuckDB types;
- ``audit_views``: the SQL of the views built on ``documents`` (mixture, contamination, the
  stages' own), in the order they are created;
- ``copies_files``: path, stage, rows, min_dup_of, max_dup_of of each copies index file (``copies/``:
  the copies a dedup stage dropped, in the task of their survivor, ``engine/tasks/copies.py``).

Every connection that reads the database (``audit.sql.connect``) then registers one pyarrow dataset
per layout over the files' paths, resolved against the run folder as it is now (so a moved or
copied run folder works, and a run folder in object storage is read in place), and creates
``documents`` and the views on it as temporary views. DuckDB itself still reaches no file (see
``audit/sql.py``): the Parquet files are read by pyarrow, which needs no footer at registration
(each layout's schema is in the database). `explain ID` registers only the files whose recorded id
range holds the id (``only_id``), and lists a kept document's copies from the copies files whose
``dup_of`` range holds it (``attach_copies``). Rows come in file order: a query that needs an order
says ORDER BY.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

INDEX_TABLES = ("document_files", "document_layouts", "document_columns", "audit_views", "copies_files")
# The datasets of one connection, one per layout: internal names, behind the ``documents`` view.
_SOURCE = "__documents_{}"
# ``attach_copies``' dataset: the copies index files whose dup_of range holds one id.
COPIES_VIEW = "__copies"


def checked_format() -> Any:
    """Parquet as the audit reads it: each page's checksum verified as it is decoded (the run's files
    carry one per page, ``engine/tasks/sinks.py``), so a damaged page fails the query instead of
    answering it with other bytes."""
    import pyarrow.dataset as ds

    return ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True))


def has_index(con: Any) -> bool:
    """Whether the database describes ``documents`` by its files (a run folder written before that
    holds ``documents`` as a table)."""
    names = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE table_name = 'document_files'").fetchall()}
    return "document_files" in names


def select_sql(columns: list[tuple[str, str]], present: set[str], source: str, status: str) -> str:
    """One layout's rows as ``documents`` columns: its own cast to the union's type, the others NULL."""
    exprs = []
    for name, ctype in columns:
        quoted = '"' + name.replace('"', '""') + '"'
        if name == "status":
            exprs.append(f"'{status}' AS status")
        elif name in present:
            exprs.append(f"CAST({quoted} AS {ctype}) AS {quoted}")
        else:
            exprs.append(f"NULL::{ctype} AS {quoted}")
    return f"SELECT {', '.join(exprs)} FROM {source}"


def empty_sql(columns: list[tuple[str, str]]) -> str:
    return "SELECT " + ", ".join(f'NULL::{t} AS "{c}"' for c, t in columns) + " WHERE false"


def attach(con: Any, root: Path, only_id: str | None = None) -> int:
    """Create ``documents`` and the views on it in ``con`` (temporary: the database stays read-only).
    ``only_id``: only the files whose id range holds it (`explain`). Returns how many files it registered."""
    import pyarrow.dataset as ds

    columns = [(n, t) for n, t in con.execute("SELECT name, type FROM document_columns ORDER BY position").fetchall()]
    layouts = {
        k: pa.ipc.read_schema(pa.py_buffer(v)) for k, v in con.execute("SELECT layout, schema FROM document_layouts").fetchall()
    }
    query = "SELECT path, status, layout FROM document_files"
    params: list[Any] = []
    if only_id is not None:
        query += " WHERE min_id <= ? AND ? <= max_id"
        params = [only_id, only_id]
    files: dict[tuple[int, str], list[str]] = {}
    for path, status, layout in con.execute(query + " ORDER BY path", params).fetchall():
        files.setdefault((layout, status), []).append(path)
    fs, resolve = locator(root)
    parts = []
    for (layout, status), paths in sorted(files.items()):
        schema = layouts[layout]
        name = _SOURCE.format(f"{layout}_{status}")
        dataset = ds.FileSystemDataset.from_paths(
            [resolve(p) for p in paths], schema=schema, format=checked_format(), filesystem=fs
        )
        con.register(name, dataset)
        parts.append(select_sql(columns, set(schema.names), name, status))
    con.execute(f"CREATE OR REPLACE TEMP VIEW documents AS {' UNION ALL '.join(parts) or empty_sql(columns)}")
    for name, sql in con.execute("SELECT name, sql FROM audit_views ORDER BY position").fetchall():
        con.execute(f'CREATE OR REPLACE TEMP VIEW "{name}" AS {sql}')
    return sum(len(p) for p in files.values())


def has_copies_index(con: Any) -> bool:
    """Whether the database lists the run's copies index files (``copies_files``)."""
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'copies_files'").fetchone()
    return bool(found and found[0])


def attach_copies(con: Any, root: Path, survivor: str) -> int | None:
    """Register ``COPIES_VIEW`` (dup_of, id, reason, detail): the rows of the copies index files whose
    recorded ``dup_of`` range holds ``survivor``, i.e. those of its own task, so listing the copies of
    a kept document reads a few files however large the run. Returns how many files it registered;
    None: the run has no index (a database of an older datapipe), and the copies are found by
    ``dup_of`` in ``documents``."""
    import pyarrow.dataset as ds

    from datapipe.schema import COPIES_SCHEMA

    if not has_copies_index(con):
        return None
    paths = [
        r[0]
        for r in con.execute(
            "SELECT path FROM copies_files WHERE min_dup_of <= ? AND ? <= max_dup_of ORDER BY path", [survivor, survivor]
        ).fetchall()
    ]
    fs, resolve = locator(root)
    dataset = ds.FileSystemDataset.from_paths(
        [resolve(p) for p in paths], schema=COPIES_SCHEMA, format=checked_format(), filesystem=fs
    )
    con.register(COPIES_VIEW, dataset)
    return len(paths)


def text_dataset(con: Any, root: Path, status: str) -> Any:
    """The kept or rejected files with their text, as one pyarrow dataset with the union of their
    layouts' columns (``kept_docs``, ``rejected_docs``): from the index, no footer read."""
    import pyarrow.dataset as ds

    from datapipe.schema import BASE_SCHEMA

    rows = con.execute(
        "SELECT f.path, l.schema FROM document_files f JOIN document_layouts l USING (layout) WHERE f.status = ? ORDER BY f.path",
        [status],
    ).fetchall()
    if not rows:
        return BASE_SCHEMA.empty_table()
    schemas = {bytes(blob): pa.ipc.read_schema(pa.py_buffer(blob)) for _, blob in rows}
    schema = pa.unify_schemas(list(schemas.values()), promote_options="permissive")
    fs, resolve = locator(root)
    paths = [resolve(p) for p, _ in rows]
    return ds.FileSystemDataset.from_paths(paths, schema=schema, format=checked_format(), filesystem=fs)


def locator(root: Path) -> tuple[Any, Any]:
    """(pyarrow file system, relative path -> its path there) for the run folder ``root``: local, or
    the object store a mirror stands for (the documents are read from the store in place)."""
    import pyarrow.fs as pafs

    from datapipe.storage import uri as storage

    uri = storage.remote_of(root)
    if uri is None:
        base = Path(root).resolve()
        return pafs.LocalFileSystem(), lambda rel: str(base / rel)
    fs, _ = storage.resolve(uri)
    return fs, lambda rel: storage.resolve(storage.child(uri, rel))[1]
