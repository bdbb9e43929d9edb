"""One run folder as the viewer reads it: run.json, whether the run is still going, and the index of
its document files, loaded once from ``stats.duckdb`` and kept in memory.

Every page reads the documents through this index (``document_files``: one row per kept or rejected
Parquet file with its rows and id range), so a page opens the few files it needs, never the corpus.
Parquet footers are cached (parsed once per file); file handles are not (a run has thousands of files).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.audit import documents as audit_documents
from datapipe.audit.sql import DB_NAME, AuditError, read_run_json, reading
from datapipe.run_folder.layout import LOCK_RECORD
from datapipe.storage import uri as storage

_KEPT = re.compile(r"^docs/(?P<source>[^/]+)/(?P<key>.+)\.parquet$")
_REJECTED = re.compile(r"^rejected/(?P<source>[^/]+)/(?P<key>.+)\.(?P<position>\d+)-(?P<stage>[^/]+)\.parquet$")
FOOTERS_CACHED = 4096  # parsed Parquet footers kept (a few KB to a few hundred KB each)
NUMERIC = (
    "TINYINT",
    "SMALLINT",
    "INTEGER",
    "BIGINT",
    "HUGEINT",
    "UTINYINT",
    "USMALLINT",
    "UINTEGER",
    "UBIGINT",
    "FLOAT",
    "DOUBLE",
)


@dataclass(frozen=True)
class DocFile:
    """A kept or rejected Parquet file of the run, as ``document_files`` records it."""

    ordinal: int  # its place in the index (path order: the order of the ``documents`` view)
    path: str  # relative to the run folder
    status: str  # kept | rejected
    rows: int
    min_id: str | None
    max_id: str | None
    source: str
    task: str  # the map task's shard key (the same in every run split the same way)
    stage: str | None  # the stage that rejected its rows (rejected files are per stage)
    position: int | None
    columns: frozenset[str]

    def holds(self, doc_id: str) -> bool:
        return self.min_id is not None and self.max_id is not None and self.min_id <= doc_id <= self.max_id


@dataclass(frozen=True)
class CopiesFile:
    path: str
    stage: str
    rows: int
    min_dup_of: str
    max_dup_of: str


@dataclass
class Index:
    """The database's small tables: what every page starts from (one row per file, stage, reason, shard)."""

    files: list[DocFile]
    columns: list[tuple[str, str]]  # the columns of ``documents`` with their DuckDB types
    layouts: dict[int, pa.Schema]
    copies: list[CopiesFile] | None  # None: a run without the copies index
    stages: list[dict[str, Any]]  # position, stage, docs_in, skipped, dropped, changed
    reasons: list[dict[str, Any]]  # position, stage, reason, dropped
    edits: list[dict[str, Any]]  # position, stage, signal, what, total
    shards: list[dict[str, Any]]  # the manifest (shard_files)
    tables: set[str]  # every table of the database (aggregates look for theirs)
    layout_of: dict[str, int] = field(default_factory=dict)  # path -> layout

    @property
    def column_names(self) -> list[str]:
        return [c for c, _ in self.columns]

    def numeric_columns(self) -> list[str]:
        return [c for c, t in self.columns if t.split("(")[0] in NUMERIC or t.startswith("DECIMAL")]

    def schema_of(self, f: DocFile) -> pa.Schema:
        return self.layouts[self.layout_of[f.path]]


@dataclass(frozen=True)
class RunState:
    complete: bool
    label: str  # "complete", "in progress", "stopped before it finished"
    detail: str


def _rows(con: Any, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


class RunView:
    """Read access to one run folder (a local path, or the local mirror of one in object storage)."""

    def __init__(self, root: Path, name: str | None = None) -> None:
        self.root = Path(root)
        self.uri = storage.remote_of(self.root)  # the object-storage run folder this mirror stands for
        self.location = self.uri or str(self.root.resolve())
        self.name = name or self.location
        self.fs, self._resolve = audit_documents.locator(self.root)
        self._lock = threading.Lock()
        self._index: Index | None = None
        self._index_key: tuple[int, int] | None = None
        self._footers: OrderedDict[str, pq.FileMetaData] = OrderedDict()
        self._leaves: dict[int, dict[str, int]] = {}
        self._run: tuple[float, dict[str, Any]] | None = None

    # --- run.json and state -------------------------------------------------------------------

    def run_json(self) -> dict[str, Any]:
        """run.json, read again when it changed (a run in progress rewrites it)."""
        path = self.root / "run.json"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            mtime = -1.0
        if self._run is None or self._run[0] != mtime:
            self._run = (mtime, read_run_json(self.root))
        return self._run[1]

    def state(self) -> RunState:
        """Complete, in progress (a driver holds the folder: its lock record is fresh), or stopped."""
        run = self.run_json()
        status = str(run.get("status") or "unknown")
        holder = self._lock_holder()
        if holder is not None:
            what = "being run again" if status == "complete" else "in progress"
            return RunState(False, what, f"a driver holds the run folder ({holder}); pages show what is written so far")
        if status == "complete":
            return RunState(True, "complete", f"finished {run.get('finished', '')}")
        return RunState(
            False,
            "stopped before it finished",
            f"run.json says {status!r} and no driver holds the folder: the same `datapipe run` command resumes it",
        )

    def _lock_holder(self) -> str | None:
        """Who holds the run folder, when a live driver does (read only: the lock itself is never tried)."""
        from datapipe.run_folder.lock import describe, holder_alive, read_record

        if self.uri is not None:
            found = storage.info(storage.child(self.uri, LOCK_RECORD))
            if found is None:
                return None
            age = time.time() - found.mtime
            return f"heartbeat {age:.0f} s ago" if age < 120 else None
        record = self.root / LOCK_RECORD
        holder = read_record(record)
        if holder is None:
            return None
        alive, _ = holder_alive(holder, False, record)
        return describe(holder) if alive else None

    @property
    def has_database(self) -> bool:
        return (self.root / DB_NAME).is_file()

    # --- the index -------------------------------------------------------------------------------

    def index(self) -> Index:
        """The index of the run's files, from ``stats.duckdb`` (read again when the database changed)."""
        db = self.root / DB_NAME
        try:
            st = db.stat()
        except OSError:
            raise AuditError(f"no {DB_NAME} in {self.location} yet: a run writes its audit database when it ends") from None
        key = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if self._index is None or self._index_key != key:
                self._index, self._index_key = self._load_index(), key
                self._footers.clear()
                self._leaves.clear()
            return self._index

    def _load_index(self) -> Index:
        with reading(self.root, index_only=True, memory_limit=256 * 10**6) as con:
            tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
            if "document_files" not in tables:
                raise AuditError(
                    f"{self.location}/{DB_NAME} was written by an older datapipe (documents as a table, no file "
                    f"index): `datapipe sql` reads it; run the pipeline again for the viewer"
                )
            layouts = {
                k: pa.ipc.read_schema(pa.py_buffer(v)).remove_metadata()
                for k, v in con.execute("SELECT layout, schema FROM document_layouts").fetchall()
            }
            columns = [(n, t) for n, t in con.execute("SELECT name, type FROM document_columns ORDER BY position").fetchall()]
            files, layout_of = [], {}
            rows = con.execute("SELECT path, status, layout, rows, min_id, max_id FROM document_files ORDER BY path").fetchall()
            for i, (path, status, layout, n, lo, hi) in enumerate(rows):
                m = (_KEPT if status == "kept" else _REJECTED).match(path)
                parts = m.groupdict() if m else {"source": path.split("/")[1] if path.count("/") >= 2 else "", "key": path}
                position = parts.get("position")
                files.append(
                    DocFile(
                        i,
                        path,
                        status,
                        int(n),
                        lo,
                        hi,
                        parts["source"],
                        parts["key"],
                        parts.get("stage"),
                        int(position) if position is not None else None,
                        frozenset(layouts[layout].names),
                    )
                )
                layout_of[path] = layout
            copies = None
            if "copies_files" in tables:
                copies = [
                    CopiesFile(*r)
                    for r in con.execute("SELECT path, stage, rows, min_dup_of, max_dup_of FROM copies_files").fetchall()
                ]
            return Index(
                files=files,
                columns=columns,
                layouts=layouts,
                copies=copies,
                stages=_rows(con, "SELECT * FROM stages ORDER BY position"),
                reasons=_rows(con, "SELECT * FROM stage_reasons ORDER BY position, dropped DESC, reason"),
                edits=_rows(con, "SELECT * FROM stage_edits ORDER BY position, signal") if "stage_edits" in tables else [],
                shards=_rows(con, "SELECT * FROM shard_files ORDER BY path") if "shard_files" in tables else [],
                tables=tables,
                layout_of=layout_of,
            )

    # --- reading files ---------------------------------------------------------------------------

    def resolve(self, rel: str) -> str:
        """Where a file of the run folder is on ``self.fs``."""
        return self._resolve(rel)

    @contextlib.contextmanager
    def parquet(self, f: DocFile | str) -> Iterator[pq.ParquetFile]:
        """The file opened with its footer parsed once per run (cached): a page that reads one row
        group of a file it read before costs no footer parse. Each page read is checked against its
        own checksum as it is decoded: a damaged file is an ``AuditError`` naming it (the page says
        so) instead of other text shown as the document's."""
        path = f.path if isinstance(f, DocFile) else f
        with self._lock:
            meta = self._footers.get(path)
            if meta is not None:
                self._footers.move_to_end(path)
        try:
            pf = pq.ParquetFile(self.fs.open_input_file(self._resolve(path)), metadata=meta, page_checksum_verification=True)
            if meta is None:
                with self._lock:
                    self._footers[path] = pf.metadata
                    while len(self._footers) > FOOTERS_CACHED:
                        self._footers.popitem(last=False)
            with pf:
                yield pf
        except (OSError, pa.ArrowException) as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if not audit_documents.DAMAGED_PARQUET.search(text):
                raise
            raise AuditError(
                f"{self.location}/{path} is damaged ({text}): it is not the file its task wrote; run the same "
                "`datapipe run` command again to redo it"
            ) from None

    def leaves(self, f: DocFile, meta: pq.FileMetaData) -> dict[str, int]:
        """Top-level columns of plain type -> their index among the file's Parquet leaf columns (what row-group
        statistics are indexed by: a list column before them has leaves of its own), once per layout."""
        layout = self.index().layout_of[f.path]
        found = self._leaves.get(layout)
        if found is None:
            schema = meta.schema
            found = {schema.column(i).path: i for i in range(len(schema)) if "." not in schema.column(i).path}
            self._leaves[layout] = found
        return found

    def files_holding(self, doc_id: str) -> list[DocFile]:
        """The files whose recorded id range holds ``doc_id`` (a few, whatever the size of the run)."""
        return [f for f in self.index().files if f.holds(doc_id)]

    def copies_files_holding(self, survivor: str) -> list[CopiesFile] | None:
        copies = self.index().copies
        if copies is None:
            return None
        return [c for c in copies if c.min_dup_of <= survivor <= c.max_dup_of]
