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

import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from datapipe.audit.schema import COPIES_FILES, DOCUMENT_FILES
from datapipe.stages.report_section import literal

# The datasets of one connection, one per layout: internal names, behind the ``documents`` view.
_SOURCE = "__documents_{}"
# ``attach_copies``' dataset: the copies index files whose dup_of range holds one id.
COPIES_VIEW = "__copies"


# What pyarrow says of a Parquet page or file it cannot decode: a page failing its checksum, a
# corrupt compressed block, a footer or page header that does not parse.
DAMAGED_PARQUET = re.compile(
    r"CRC checksum verification failed|could not verify page integrity|Corrupt (?:Lz4|snappy|zstd|brotli|gzip)|"
    r"(?:ZSTD|zstd|LZ4|lz4|Snappy|snappy|Brotli|brotli|Gzip|gzip|zlib) decompress|[Dd]ecompression failed|"
    r"deserialize thrift|Unexpected end of stream|Parquet magic bytes not found"
)


def checked_format() -> Any:
    """Parquet as the audit reads it: each page's checksum verified as it is decoded (the run's files
    carry one per page, ``engine/tasks/sinks.py``), so a damaged page fails the query instead of
    answering it with other bytes."""
    import pyarrow.dataset as ds

    return ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True))


def has_index(con: Any) -> bool:
    """Whether the database describes ``documents`` by its files (a run folder written before that
    holds ``documents`` as a table)."""
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [DOCUMENT_FILES.name]).fetchall()
    return bool(found[0][0])


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


def attach(con: Any, root: Path, only_id: str | None = None, views: bool = True) -> int:
    """Create ``documents`` and the views on it in ``con`` (temporary: the database stays read-only).
    ``only_id``: only the files whose id range holds it (`explain`); ``views``: False for ``documents``
    alone. Returns how many files it registered."""
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
    for name, sql in [] if not views else con.execute("SELECT name, sql FROM audit_views ORDER BY position").fetchall():
        con.execute(f'CREATE OR REPLACE TEMP VIEW "{name}" AS {sql}')
    return sum(len(p) for p in files.values())


def column_names(con: Any) -> set[str]:
    """The columns of ``documents``, from the index (no file is read; ``documents`` need not be attached)."""
    if has_index(con):
        return {r[0] for r in con.execute("SELECT name FROM document_columns").fetchall()}
    return {r[0] for r in con.execute("DESCRIBE documents").fetchall()}


def has_copies_index(con: Any) -> bool:
    """Whether the database lists the run's copies index files (``copies_files``)."""
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [COPIES_FILES.name]).fetchall()
    return bool(found[0][0])


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


# --- the database as plain DuckDB opens it ----------------------------------------------------

# ``documents`` and the views over it are also stored in the database itself, so that DuckDB's own
# CLI or Python (``duckdb.connect("RUN/stats.duckdb", read_only=True)``) answers them: the files are
# named relative to the run folder, found from the database's own path. DuckDB resolves a relative
# path against the working directory, not the database, but its default ``temp_directory`` is the
# database's absolute path plus ``.tmp``: the run folder is that, less ``/stats.duckdb.tmp``. So the
# views answer from any directory and after the run folder is moved or copied. Where that does not
# hold (a temp_directory set by hand, a database attached from object storage) ``SET VARIABLE
# datapipe_run = 'PATH OR URI'`` names the folder; else one error says what to do. datapipe's own
# connections never read these: they create temporary views of the same names (``attach``), which
# DuckDB looks up first.
ROOT_VARIABLE = "datapipe_run"
_DB_TEMP = "/stats.duckdb.tmp"
NO_ROOT = (
    "stats.duckdb cannot tell where its run folder is: open the run with datapipe.audit.connect(RUN) in Python "
    "(or `datapipe sql RUN QUERY`), or SET VARIABLE " + ROOT_VARIABLE + " = '/path/to/RUN' first"
)
IN_STORE = (
    "this run's documents are in object storage: open the run with datapipe.audit.connect('URI') in Python "
    "(or `datapipe sql URI QUERY`), or load DuckDB's httpfs and SET VARIABLE " + ROOT_VARIABLE + " = 'URI' first"
)


def root_sql(message: str = NO_ROOT) -> str:
    """The run folder, as a SQL expression DuckDB folds when it binds a view (see above)."""
    var = f"getvariable({literal(ROOT_VARIABLE)})"
    tmp = "current_setting('temp_directory')"
    return (
        f"CASE WHEN {var} IS NOT NULL THEN rtrim({var}, '/') "
        f"WHEN suffix({tmp}, {literal(_DB_TEMP)}) THEN left({tmp}, -{len(_DB_TEMP)}) "
        f"ELSE error({literal(message)}) END"
    )


def stored_views(con: Any, root: Path, remote: bool) -> None:
    """``documents`` (and the views in ``audit_views``) as views of the database itself, over the files
    by their paths relative to the run folder. ``root``: the run folder now, for DuckDB to bind the views
    (one Parquet footer per column layout); ``remote``: the files are in object storage, out of this
    process's reach: ``documents`` then fails with one message naming the supported way."""
    columns = [(n, t) for n, t in con.execute("SELECT name, type FROM document_columns ORDER BY position").fetchall()]
    if remote:
        nulls = ", ".join(f'NULL::{t} AS "{c}"' for c, t in columns)
        con.execute(f"CREATE OR REPLACE VIEW documents AS SELECT {nulls} FROM range(1) WHERE error({literal(IN_STORE)}) IS NULL")
    else:
        layouts = {
            k: pa.ipc.read_schema(pa.py_buffer(v)).names
            for k, v in con.execute("SELECT layout, schema FROM document_layouts").fetchall()
        }
        files: dict[tuple[int, str], list[str]] = {}
        for path, status, layout in con.execute("SELECT path, status, layout FROM document_files ORDER BY path").fetchall():
            files.setdefault((layout, status), []).append(path)
        base = root_sql()
        parts = [
            select_sql(
                columns,
                set(layouts[layout]),
                f"read_parquet(list_transform([{', '.join(map(literal, globs))}], lambda p: ({base}) || '/' || p))",
                status,
            )
            for (layout, status), globs in sorted(folder_globs(Path(root), files).items())
        ]
        con.execute(f"SET VARIABLE {ROOT_VARIABLE} = {literal(str(Path(root).resolve()))}")
        try:
            con.execute(f"CREATE OR REPLACE VIEW documents AS {' UNION ALL '.join(parts) or empty_sql(columns)}")
        finally:
            con.execute(f"RESET VARIABLE {ROOT_VARIABLE}")
    for name, sql in con.execute("SELECT name, sql FROM audit_views ORDER BY position").fetchall():
        con.execute(f'CREATE OR REPLACE VIEW "{name}" AS {sql}')


# A run's files by folder and name ending: a source's kept files (``docs/<source>/*.parquet``), one
# stage's rejects of a source (``rejected/<source>/*.03-minhash.parquet``).
_ENDING = re.compile(r"(\.\d+-[^/.]+)?\.parquet$")
_GLOB_CHARS = re.compile(r"[*?\[\]{}\\]")


def folder_globs(root: Path, files: dict[Any, list[str]]) -> dict[Any, list[str]]:
    """``files`` (per group, paths relative to ``root``) as glob patterns where one names exactly a
    group's files: ``docs/<source>/*.parquet`` for a source's kept files, so the stored ``documents``
    view is O(sources x stages x layouts) text, not a list of every path (megabytes at a crawl's files). A
    pattern is used only when the files it matches in the run folder now (one listing per folder)
    are exactly the files of one group; otherwise that group's files are listed as they are."""
    import fnmatch

    pattern_of: dict[str, str] = {}
    groups_of: dict[str, set[Any]] = {}
    listed: dict[str, int] = {}
    for group, paths in files.items():
        for path in paths:
            folder, _, name = path.rpartition("/")
            ending = _ENDING.search(name)
            if ending is None or not folder or _GLOB_CHARS.search(path):
                continue
            pattern = f"{folder}/*{ending.group(0)}"
            pattern_of[path] = pattern
            groups_of.setdefault(pattern, set()).add(group)
            listed[pattern] = listed.get(pattern, 0) + 1
    on_disk: dict[str, list[str]] = {}  # folder -> names of its Parquet files now
    exact: set[str] = set()
    for pattern, groups in groups_of.items():
        folder, _, name_glob = pattern.rpartition("/")
        if folder not in on_disk:
            try:
                on_disk[folder] = [e.name for e in os.scandir(root / folder) if e.name.endswith(".parquet")]
            except OSError:
                on_disk[folder] = []
        if len(groups) == 1 and len(fnmatch.filter(on_disk[folder], name_glob)) == listed[pattern]:
            exact.add(pattern)
    out: dict[Any, list[str]] = {}
    for group, paths in files.items():
        entries: dict[str, None] = {}
        for path in paths:
            glob = pattern_of.get(path)
            entries[glob if glob is not None and glob in exact else path] = None
        out[group] = list(entries)
    return out


def text_beginnings(con: Any, root: Path, ids: list[str], chars: int = 160) -> dict[str, str]:
    """The first ``chars`` characters of the text of each document in ``ids``, read from the files whose
    recorded id range holds one of them (a few, whatever the size of the run); ``con``: a connection
    to the run's database."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    wanted = sorted(set(ids))
    if not wanted or not has_index(con):
        return {}
    rows = con.execute(
        "SELECT DISTINCT f.path, l.schema FROM document_files f JOIN document_layouts l USING (layout), "
        "unnest($ids) AS t(id) WHERE f.min_id <= t.id AND t.id <= f.max_id ORDER BY f.path",
        {"ids": wanted},
    ).fetchall()
    fs, resolve = locator(root)
    out: dict[str, str] = {}
    for path, blob in rows:
        if "text" not in pa.ipc.read_schema(pa.py_buffer(blob)).names:
            continue
        dataset = ds.dataset(resolve(path), format="parquet", filesystem=fs)
        found = dataset.to_table(columns=["id", "text"], filter=pc.field("id").isin(wanted))
        for doc_id, text in zip(found["id"].to_pylist(), found["text"].to_pylist()):
            out[doc_id] = (text or "")[:chars]
    return out
