"""Read-only, confined SQL over a run's audit database, for `datapipe sql`, explain, stats and report.

Every command that opens a run's ``stats.duckdb`` goes through :func:`connect`. The
connection itself cannot write a file or read one outside the run, whatever SQL it is
given (EXPLAIN ANALYZE, CTEs, comments, COPY, ATTACH, INSTALL, read_csv, ...):

- the database is opened read-only;
- ``enable_external_access=false`` stops COPY, ATTACH, extension install/load, readers of
  other files and replacement scans;
- DuckDB still lets a connection touch its own database paths (``COPY ... TO
  'stats.duckdb' (USE_TMP_FILE false)`` overwrote the database in DuckDB 2.0), so the local
  file system is switched off altogether once the database is open (``disabled_filesystems``);
  pages of the database are read through the handle opened before that;
- no temporary directory, so nothing spills to disk (a query larger than memory fails);
- a memory limit and at most 4 threads (``limits.py``; ``run_query`` and ``query_result``
  add a guard thread for the memory DuckDB does not count and for a time limit);
- no progress bar (DuckDB draws it on stdout, inside CSV or JSON output);
- ``lock_configuration=true`` so none of this can be SET back.

Nor are the documents' rows: ``documents`` (and the views on it) is a temporary view over pyarrow
datasets of the run's kept and rejected Parquet files, created on each connection from the index
the database holds (``audit/documents.py``). Their text is in ``kept_docs`` and ``rejected_docs``,
pyarrow datasets over the same files, opened here in Python and registered with the connection,
so DuckDB itself needs no file access for any of them. The database also stores ``documents`` and its
views for plain DuckDB (over ``read_parquet``, ``audit/documents.py`` ``stored_views``): the temporary
views of the same names hide them here, and naming them outright (``stats.main.documents``) is refused
like any other file read.

On top of that, ``datapipe sql`` accepts one SELECT (or EXPLAIN of a SELECT) per call: a
clear message for the common mistakes, not the protection itself.
"""

from __future__ import annotations

import contextlib
import csv
import json
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa

from datapipe.audit import limits
from datapipe.errors import EXIT_INTERRUPTED, EXIT_USAGE, DatapipeError
from datapipe.storage.atomic import TMP_MARK

DB_NAME = "stats.duckdb"
_CONFINING = threading.Lock()
TEXT_VIEWS = {"kept_docs": "docs", "rejected_docs": "rejected"}
_STATUS = {"kept_docs": "kept", "rejected_docs": "rejected"}


class AuditError(DatapipeError, RuntimeError):
    """Not a run folder (or a damaged one), or SQL that is not one read-only query."""

    exit_code = EXIT_USAGE


class QueryInterrupted(AuditError):
    """Ctrl-C (SIGINT) stopped the query (``limits.QueryGuard``): exit 130, as any interrupted command."""

    exit_code = EXIT_INTERRUPTED


def _guard_error(guard: limits.QueryGuard, why: str | None = None) -> AuditError:
    """The one-line error of a query the guard stopped (``why``: as it says, else why it tripped)."""
    cls = QueryInterrupted if (why or guard.tripped) == "interrupt" else AuditError
    return cls(guard.message(why))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_run_json(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise AuditError(f"no run.json in {run_dir}: is it the run folder of a finished `datapipe run`?")
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AuditError(
            f"{path} is unreadable ({_first_line(exc)}); run the same `datapipe run` command again to rewrite it"
        ) from None
    if not isinstance(run, dict):
        raise AuditError(f"{path} is not a run description (a JSON object)")
    return run


def connect(
    run_dir: Path,
    text_views: bool | Iterable[str] = False,
    memory_limit: str | int | None = None,
    only_id: str | None = None,
    copies_of: str | None = None,
    verify: bool = False,
    aggregates_only: bool = False,
    index_only: bool = False,
) -> Any:
    """A read-only DuckDB connection to RUN/stats.duckdb that can reach no file (see the module doc).

    ``text_views``: True registers ``kept_docs`` and ``rejected_docs`` (the documents with their
    text), a collection of names only those; each costs a read of its Parquet footers.
    ``memory_limit``: bytes or a size such as ``2GB``; default $DATAPIPE_SQL_MEMORY_LIMIT or
    a quarter of the machine's memory (``limits.memory_limit``).
    ``only_id``: ``documents`` holds only the files whose recorded id range holds this id (explain).
    ``copies_of``: registers the copies index files whose range holds this id (``documents.attach_copies``).
    ``verify``: every kept, rejected and copies file of the run is checked first against the sha256
    its task recorded (``verify_documents``). Without it, each page read is checked against its
    own checksum as it is decoded (``documents.checked_format``).
    ``aggregates_only``: the caller reads the run's small tables and aggregates only (report, stats):
    ``documents`` is not attached, so opening costs the same for ten files or a million; a database
    without aggregates (an older datapipe's) gets ``documents`` all the same, for the scan that stands in.
    ``index_only``: no ``documents`` view (nor the views on it): the database's own tables only, for a
    reader that reads the files itself from ``document_files`` (``datapipe view``).
    """
    import duckdb

    from datapipe.audit import documents

    try:
        memory = limits.memory_limit(memory_limit)
    except limits.LimitError as exc:
        raise AuditError(str(exc)) from None
    root = Path(run_dir)
    db = root / DB_NAME
    if not db.is_file():
        raise AuditError(f"no {DB_NAME} in {run_dir}: is it the run folder of a finished `datapipe run`?")
    # One connection of this process at a time is opened and confined: connections to one file share a
    # database instance, whose settings one sets and locks while the other would find them half set.
    with _CONFINING:
        try:
            con = duckdb.connect(
                str(db),
                read_only=True,
                config={
                    "enable_external_access": False,
                    "temp_directory": "",
                    "autoinstall_known_extensions": False,
                    "autoload_known_extensions": False,
                    "allow_community_extensions": False,
                    "allow_unsigned_extensions": False,
                    "allow_persistent_secrets": False,
                },
            )
        except duckdb.Error as exc:
            raise AuditError(
                f"{db} is not a readable DuckDB database ({_first_line(exc)}); run the same "
                f"`datapipe run` command again to rebuild it"
            ) from None
        try:
            wanted = set(TEXT_VIEWS) if text_views is True else set(text_views or ())
            indexed = documents.has_index(con)  # else a database of an older datapipe: documents is a table
            for view, folder in TEXT_VIEWS.items():
                if view in wanted:
                    dataset = documents.text_dataset(con, root, _STATUS[view]) if indexed else _parquet_dataset(root / folder)
                    con.register(view, dataset)
            from datapipe.audit.aggregates import has_tables

            if verify and not indexed:
                raise AuditError(f"--verify: {db} was written by an older datapipe, which did not index the run's files")
            if verify:  # asked for: every documents file, whether or not this reader attaches them
                verify_documents(con, root)
            # documents and its views, over the run's files (audit/documents.py)
            if indexed and not index_only and not (aggregates_only and has_tables(con)):
                documents.attach(con, root, only_id=only_id)
                if copies_of is not None:
                    documents.attach_copies(con, root, copies_of)
            try:
                if _confined_already(con):
                    # DuckDB shares one database instance among a process's connections to a file: another
                    # connection of this process (a page of ``datapipe view`` while another one reads)
                    # has it open and confined, and its settings, which are the instance's, hold for this one.
                    pass
                else:
                    # After opening (the database file is read through the handle opened already).
                    con.execute("SET disabled_filesystems = 'LocalFileSystem'")
                    con.execute(f"SET memory_limit = '{memory}B'")
                    con.execute(f"SET threads = {limits.threads()}")
                    con.execute("SET enable_progress_bar = false")
                    con.execute("SET lock_configuration = true")
            except duckdb.Error as exc:  # fail closed: never hand out a connection that is not confined
                raise AuditError(
                    f"cannot confine the connection to {db} with duckdb {duckdb.__version__} ({_first_line(exc)})"
                ) from None
        except BaseException:
            con.close()
            raise
    return con


def _document_paths(con: Any) -> list[str]:
    """Every kept, rejected and copies file the database indexes (paths relative to the run folder)."""
    from datapipe.audit import documents

    paths = [r[0] for r in con.execute("SELECT path FROM document_files ORDER BY path").fetchall()]
    if documents.has_copies_index(con):
        paths += [r[0] for r in con.execute("SELECT path FROM copies_files ORDER BY path").fetchall()]
    return paths


def _record(root: Path) -> Any:
    """What the run's markers recorded of its files (run_folder/checked.py), or an AuditError."""
    from datapipe.run_folder.checked import recorded_files
    from datapipe.run_folder.layout import RunFolder
    from datapipe.storage.uri import StorageError

    try:
        return recorded_files(RunFolder(root))
    except StorageError as exc:
        raise AuditError(str(exc)) from None


def verify_documents(con: Any, root: Path) -> int:
    """Check every documents file the database indexes against the size and sha256 its task recorded
    (a read of each: the documents once); raise ``DamagedRunFile`` naming the first that differs.
    Returns how many files were checked."""
    recorded = _record(root)
    if not recorded.available:
        raise AuditError(
            f"--verify: {root}/_work/markers, where the run's tasks recorded their files' sha256, is gone "
            f"(deleted to save space?): there is nothing to check the documents against"
        )
    paths = _document_paths(con)
    for rel in paths:
        recorded.check(rel)
    return len(paths)


def _damaged_documents(con: Any, run_dir: Path, text: str) -> DatapipeError | None:
    """For a query that failed decoding the run's Parquet (``documents.DAMAGED_PARQUET``): the error naming the
    damaged documents file, found by checking the indexed files against their recorded sha256 (a read
    of each, on this failure only); None when the error is not of that kind or no file differs."""
    from datapipe.audit import documents

    if not documents.DAMAGED_PARQUET.search(text):
        return None
    from datapipe.run_folder.checked import DamagedRunFile

    try:
        recorded = _record(Path(run_dir))
        found = recorded.first_damaged(_document_paths(con)) if recorded.available else None
    except Exception:  # noqa: BLE001 - looking for the file must not hide the query's own error
        found = None
    if found is None:
        return None
    return DamagedRunFile(f"a documents file of the run could not be decoded ({text}): {run_dir}/{found[0]}: {found[1]}")


def _confined_already(con: Any) -> bool:
    """Whether ``con``'s database instance was confined by an earlier ``connect`` that is still open:
    its configuration is locked, which ``connect`` does last, after switching the local file system off
    (a setting DuckDB does not read back), and external access is off (every connection's own
    configuration says so, and DuckDB shares an instance only among connections of one configuration)."""
    # fetchall, not fetchone: DuckDB 2 keeps a result fetched only in part open, and refuses the
    # connection's next relation (con.sql) until it is finished
    locked, external = con.execute(
        "SELECT current_setting('lock_configuration'), current_setting('enable_external_access')"
    ).fetchall()[0]
    return bool(locked) and not bool(external)


def _parquet_dataset(folder: Path) -> Any:
    """A pyarrow dataset over a folder's Parquet files with the union of their columns.

    Sources write different signal columns, so the schemas are unified (as DuckDB's
    ``union_by_name`` would); a folder without files gives an empty table with the base
    columns, so the view exists in every run. Temporary files of a killed writer are skipped.
    """
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from datapipe.schema import BASE_SCHEMA
    from datapipe.storage import uri as storage

    fs = None
    uri = storage.remote_of(folder)
    if uri is not None:  # a run folder in object storage: the text is read from the store, in place
        try:
            fs, _ = storage.resolve(uri)
            files = [
                storage.resolve(f.uri)[1]
                for f in storage.list_files(uri)
                if f.uri.endswith(".parquet") and TMP_MARK not in f.uri.rsplit("/", 1)[-1]
            ]
        except storage.StorageError as exc:
            raise AuditError(str(exc)) from None
    else:
        files = sorted(str(p) for p in folder.glob("**/*.parquet") if TMP_MARK not in p.name and p.is_file())
    if not files:
        return BASE_SCHEMA.empty_table()
    try:
        schema = pa.unify_schemas([pq.read_schema(f, filesystem=fs) for f in files], promote_options="permissive")
        return ds.dataset(files, schema=schema, format="parquet", filesystem=fs)
    except (OSError, pa.ArrowException) as exc:
        raise AuditError(f"cannot read the Parquet files in {folder}: {_first_line(exc)}") from None


def _damaged(run_dir: Path, exc: BaseException) -> AuditError:
    return AuditError(
        f"{Path(run_dir) / DB_NAME} is damaged ({_first_line(exc)}); run the same `datapipe run` command again to rebuild it"
    )


@contextlib.contextmanager
def reading(
    run_dir: Path,
    text_views: bool | Iterable[str] = False,
    memory_limit: str | int | None = None,
    only_id: str | None = None,
    copies_of: str | None = None,
    verify: bool = False,
    aggregates_only: bool = False,
    index_only: bool = False,
) -> Iterator[Any]:
    """``connect`` as a context manager that turns DuckDB errors into one-line AuditErrors."""
    import duckdb

    con = connect(
        run_dir,
        text_views=text_views,
        memory_limit=memory_limit,
        only_id=only_id,
        copies_of=copies_of,
        aggregates_only=aggregates_only,
        index_only=index_only,
        verify=verify,
    )
    try:
        yield con
    except duckdb.OutOfMemoryException:
        raise AuditError(limits.memory_message(limits.memory_limit(memory_limit))) from None
    except (duckdb.IOException, duckdb.InternalException) as exc:  # missing or corrupt blocks
        raise _damaged(run_dir, exc) from None
    except duckdb.Error as exc:
        raise _damaged_documents(con, run_dir, _first_line(exc)) or AuditError(
            f"reading {Path(run_dir) / DB_NAME}: {_first_line(exc)}"
        ) from None
    finally:
        con.close()


def check_query(con: Any, query: str) -> None:
    """Refuse anything but one SELECT or EXPLAIN [ANALYZE] of a SELECT (a second layer; see the module doc)."""
    import duckdb

    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise AuditError(f"SQL error: {_first_line(exc)}") from None
    if not statements:
        raise AuditError("empty query")
    if len(statements) > 1:
        raise AuditError("give one query at a time")
    kind = statements[0].type.name
    if kind == "EXPLAIN":
        inner = _explained(query)
        try:
            inner_kinds = [s.type.name for s in con.extract_statements(inner)] if inner is not None else []
        except duckdb.Error:
            inner_kinds = []
        kind = "EXPLAIN " + (inner_kinds[0] if len(inner_kinds) == 1 else "of something else")
        if inner_kinds == ["SELECT"]:
            return
    elif kind == "SELECT":
        return
    raise AuditError(
        f"datapipe sql is read-only: {kind} statements are refused; only SELECT queries (and EXPLAIN of one) are allowed"
    )


def _explained(query: str) -> str | None:
    """The statement an EXPLAIN [ANALYZE] [(options)] wraps, with comments skipped; None if unclear."""
    import duckdb

    tokens = [(pos, kind) for pos, kind in duckdb.tokenize(query) if kind != duckdb.token_type.comment]
    words = [(pos, query[pos:].split(None, 1)[0].upper() if kind == duckdb.token_type.keyword else None) for pos, kind in tokens]
    i = 0
    if i < len(words) and (w := words[i][1]) is not None and w.startswith("EXPLAIN"):
        i += 1
    else:
        return None
    while i < len(words) and (w := words[i][1]) is not None and w.startswith("ANALYZE"):
        i += 1
    if i < len(words) and query[words[i][0]] == "(":  # EXPLAIN (FORMAT json) ...: skip the options
        depth = 0
        while i < len(words):
            ch = query[words[i][0]]
            depth += ch == "("
            depth -= ch == ")"
            i += 1
            if depth == 0:
                break
    return query[words[i][0] :] if i < len(words) else None


BATCH_ROWS = 2048
# A table is laid out by rich with every row in memory, at about 15 to 35 bytes and 4 us of CPU
# per character of its cells (and more per cell): `datapipe sql --format table` shows at most
# TABLE_MAX_ROWS rows unless --max-rows says otherwise, and stops at TABLE_MAX_CHARS characters.
TABLE_MAX_ROWS = 200
TABLE_MAX_CHARS = 1_000_000


def _query_error(exc: BaseException, guard: limits.QueryGuard, run_dir: Path) -> DatapipeError:
    """The one-line error for a failed query: a DuckDB error, or the same as an Arrow error from a batch stream."""
    import duckdb

    text = _first_line(exc)
    if guard.tripped:  # the guard interrupted it
        return _guard_error(guard)
    if isinstance(exc, duckdb.OutOfMemoryException) or text.startswith("Out of Memory Error"):
        return _guard_error(guard, "memory")
    if isinstance(exc, duckdb.InterruptException) or text.startswith("INTERRUPT Error"):
        return AuditError("the query was interrupted")
    if isinstance(exc, duckdb.PermissionException) or text.startswith("Permission Error"):
        return AuditError(f"refused: datapipe sql reads only this run's tables ({text})")
    if (damaged := _damaged_documents(guard.con, run_dir, text)) is not None:
        return damaged
    if isinstance(exc, (duckdb.IOException, duckdb.InternalException)) or text.startswith(("IO Error", "INTERNAL Error")):
        return _damaged(run_dir, exc)  # missing or corrupt blocks
    return AuditError(f"SQL error: {text}")


class QueryResult:
    """The batches of a running query, fetched from DuckDB one at a time (see ``query_result``)."""

    def __init__(self, reader: pa.RecordBatchReader, guard: limits.QueryGuard, run_dir: Path) -> None:
        self.schema = reader.schema
        self._reader, self._guard, self._run_dir = reader, guard, run_dir

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while True:
            try:
                batch = self._reader.read_next_batch()
            except StopIteration:
                break
            except (OSError, pa.ArrowException) as exc:  # DuckDB's error, through Arrow's stream interface
                raise _query_error(exc, self._guard, self._run_dir) from None
            if self._guard.tripped:  # past a limit while Python worked, where DuckDB's interrupt is not seen
                raise _guard_error(self._guard)
            yield batch
        if self._guard.tripped:
            raise _guard_error(self._guard)


@contextlib.contextmanager
def query_result(
    run_dir: Path,
    query: str,
    memory_limit: str | int | None = None,
    timeout: float | str | None = None,
    batch_rows: int = BATCH_ROWS,
    verify: bool = False,
) -> Iterator[QueryResult]:
    """One read-only query whose rows stream in batches, under a memory and a time limit
    (``limits.py``); every problem is an AuditError with a one-line message."""
    import duckdb

    try:
        limit, seconds = limits.memory_limit(memory_limit), limits.timeout(timeout)
    except limits.LimitError as exc:
        raise AuditError(str(exc)) from None
    # Only the text views the query names: a run can have thousands of Parquet files.
    views = [v for v in TEXT_VIEWS if v in query.lower()]
    with reading(run_dir, text_views=views, memory_limit=limit, verify=verify) as con:
        check_query(con, query)
        with limits.QueryGuard(con, limit, seconds) as guard:
            try:
                try:
                    reader = con.sql(query).to_arrow_reader(batch_rows)  # runs blocking operators (sort, aggregate)
                except duckdb.Error as exc:
                    raise _query_error(exc, guard, run_dir) from None
                yield QueryResult(reader, guard, run_dir)
            except KeyboardInterrupt:  # Ctrl-C seen by Python first, when the query handed back control
                raise QueryInterrupted(limits.INTERRUPTED_MESSAGE) from None


def run_query(run_dir: Path, query: str, memory_limit: str | int | None = None, timeout: float | str | None = None) -> pa.Table:
    """The result of one read-only query; every problem is an AuditError with a one-line message."""
    with query_result(run_dir, query, memory_limit=memory_limit, timeout=timeout) as result:
        return pa.Table.from_batches(list(result), schema=result.schema)


def write_result(result: pa.Table | QueryResult, fmt: str, out: TextIO, max_rows: int | None = None) -> int | None:
    """Write rows as they are: JSON Lines, CSV with LF line ends, or a table whose cells show data verbatim.

    Rows are written as their batches come (a table is drawn once its rows are in), at most
    ``max_rows`` of them (None: all); a table also stops at TABLE_MAX_CHARS characters of
    cells. Returns the number of rows written when rows were left out, else None.
    """
    columns = result.schema.names
    rows = _rows(result.to_batches() if isinstance(result, pa.Table) else result)
    view = None
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")  # LF, as CSV tools on Linux expect (not csv's CRLF)
        writer.writerow(columns)
    elif fmt != "json":
        from datapipe.audit.textout import data_table, make_console

        view = data_table(columns)
    n, chars, cut = 0, 0, False
    for row in rows:
        if (max_rows is not None and n >= max_rows) or chars > TABLE_MAX_CHARS:
            cut = True
            break
        if fmt == "json":
            out.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        elif fmt == "csv":
            writer.writerow([row[c] for c in columns])
        else:
            assert view is not None  # made above for the table format
            cells = ["NULL" if row[c] is None else row[c] for c in columns]
            chars += sum(len(str(v)) for v in cells)
            view.add_row(*cells)
        n += 1
    if view is not None:
        make_console(out).print(view)
        plural = "s" if n != 1 else ""
        if not cut:
            out.write(f"({n} row{plural})\n")
        elif chars > TABLE_MAX_CHARS:
            out.write(
                f"(first {n} row{plural}, {chars} characters: a table shows at most {TABLE_MAX_CHARS}; "
                f"--format csv or json to stream them all)\n"
            )
        else:
            out.write(
                f"(first {n} row{plural}: there are more; --max-rows to show more, --format csv or json to stream them all)\n"
            )
    return n if cut else None


def _rows(batches: Iterable[pa.RecordBatch]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        yield from batch.to_pylist()
