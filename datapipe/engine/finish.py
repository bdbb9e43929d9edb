"""The end of a run: its counts, the audit database ``stats.duckdb``, and the conservation check.

``collect_counts`` sums the funnel and per-source totals from the tasks' markers;
``build_stats`` writes the database, one table per ``audit.schema.TABLES`` entry (the funnel, the
shards, the index of the kept and rejected files that ``documents`` is a view over, that of the
copies files), the ``agg_`` tables merged from the map tasks' aggregate files (``audit/aggregates.py``;
beyond a few, merged first by a tree of tasks: ``engine/aggregate_tree.py``) and the views;
``check_conservation`` checks inputs = kept + rejected against the rows those files hold.

Nothing here reads a document: the rows stay in the Parquet files the map tasks wrote, and the
markers (read once per phase, cached) say which files there are, with their rows, id ranges and
columns; a run whose tasks of an older datapipe wrote no aggregates has them from one scan. The
database is written to a temporary file renamed into place; it names the files relative to the run
folder, so it stays valid when the run folder is moved or copied. Reading it (``documents`` and the
views on it, ``datapipe sql``, explain, stats, report) is ``datapipe.audit``'s (``audit/documents.py``,
``audit/views.py``, ``audit/aggregates.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.audit import aggregates, schema
from datapipe.audit.documents import attach, locator, stored_views
from datapipe.audit.schema import CORE_COLUMNS, NOT_IN_DOCUMENTS
from datapipe.audit.views import create_table_views, document_views
from datapipe.engine import aggregate_tree
from datapipe.engine.errors import PipelineError
from datapipe.engine.plan import RunSpec, build_stage
from datapipe.engine.work_files import map_phase
from datapipe.run_folder.layout import DOCS_DIR, PACK_PHASE, REJECTED_DIR, RunFolder
from datapipe.storage.atomic import temp_path_for
from datapipe.tokens.shard_format import MANIFEST_SCHEMA
from datapipe.tokens.shard_writer import write_manifest as write_manifest_files


def write_manifest(folder: RunFolder, spec: RunSpec) -> pa.Table:
    from datapipe.engine.pack_plan import pack_ranges

    rows: list[dict[str, Any]] = []
    packed = folder.markers.read_all(PACK_PHASE, full=True) if spec.tokenizer is not None else {}
    for rng in (pack_ranges(folder, spec) or []) if spec.tokenizer is not None else []:
        marker = packed.get(rng.key)
        if marker:
            rows.extend(marker["shards"])
    table = pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA)
    if spec.tokenizer is not None:
        write_manifest_files(table, folder.manifest)
    return table


# DuckDB's memory cap in the driver while it writes the audit database: it holds the run's small
# tables only (one row per stage, file, shard), never the documents, so it stays far below this.
STATS_MEMORY_MB = 256


def build_stats(folder: RunFolder, spec: RunSpec, counts: dict[str, Any], memory_mb: int = STATS_MEMORY_MB) -> None:
    """Write ``stats.duckdb``: one table per ``audit.schema.TABLES`` entry, from the markers (already
    read for the counts) and one Parquet footer per column layout; the ``agg_`` tables merged from at
    most ``aggregate_tree.FAN_IN`` aggregate files (the merge tree's last level); the views. O(tasks),
    whatever the size of the corpus."""
    import duckdb

    rows = _table_rows(folder, spec, counts)
    agg_files = rows.pop("aggregate_files")
    tmp = temp_path_for(folder.stats_db)
    try:
        con = duckdb.connect(str(tmp))
        con.execute(f"SET memory_limit='{int(memory_mb)}MB'")
        layouts = _layouts(folder, rows["document_files"])
        rows["document_layouts"] = [{"layout": k, "schema": s.serialize().to_pybytes()} for k, s in layouts.items()]
        ordered = document_columns(con, list(layouts.values()))
        rows["document_columns"] = [{"position": i, "name": c, "type": t} for i, (c, t) in enumerate(ordered)]
        for table in schema.TABLES:
            if rows.get(table.name) is not None:  # copies_files: None from an older datapipe's tasks
                schema.write_table(con, table, rows[table.name])
        create_table_views(con)
        views = document_views(con, {c for c, _ in ordered}, spec.stage_types)
        schema.write_table(
            con, schema.AUDIT_VIEWS, [{"position": i, "name": n, "sql": q} for i, (n, q) in enumerate(views.items())]
        )
        _write_aggregates(con, folder, spec, agg_files, {c for c, _ in ordered})
        # Every view binds (a stage's SQL naming a column the run lacks fails here, not in a user's query).
        attach(con, folder.root, only_id="")
        for name in ["documents", *views]:
            con.execute(f'SELECT * FROM "{name}" LIMIT 0').fetchall()
        stored_views(con, folder.root, remote=folder.remote is not None)
        # Written out now, so that a full disk fails here: on close DuckDB would leave what it
        # could not write in the .wal, and the database renamed into place would lack tables.
        con.execute("CHECKPOINT")
        con.close()
        tmp.replace(folder.stats_db)
    finally:
        tmp.unlink(missing_ok=True)
        Path(str(tmp) + ".wal").unlink(missing_ok=True)


def _table_rows(folder: RunFolder, spec: RunSpec, counts: dict[str, Any]) -> dict[str, Any]:
    """The rows of the database's tables that the markers and the counts give, by table name."""
    stages = counts["stages"]
    return {
        "run": [{"root": spec.root, "fingerprint": spec.fingerprint, "stages": json.dumps(spec.stages)}],
        # skipped: documents that reached the stage and passed untouched because their kind is not in
        # its kinds (langid skips code), so docs_out of one stage is docs_in of the next.
        "stages": [
            {
                "position": s["position"],
                "stage": s["stage"],
                "docs_in": s["in"],
                "skipped": s.get("skipped", 0),
                "dropped": sum(s["rejected"].values()),
                "changed": s.get("changed"),
            }
            for s in stages
        ],
        "stage_reasons": [
            {"position": s["position"], "stage": s["stage"], "docs_in": s["in"], "reason": reason, "dropped": n}
            for s in stages
            for reason, n in sorted(s["rejected"].items())
        ],
        # What stages that change documents did to the documents they passed on (Stage.edit_counts):
        # one row per counting column, e.g. pii / pii_email / emails replaced / 1,234.
        "stage_edits": [{"position": s["position"], "stage": s["stage"], **e} for s in stages for e in s.get("edits", [])],
        "shard_files": write_manifest(folder, spec),
        "document_files": document_files(folder, spec),
        "copies_files": copies_files(folder, spec),  # None: a task of an older datapipe wrote none (explain scans)
        "aggregate_files": aggregate_files(folder, spec),
    }


def _write_aggregates(con: Any, folder: RunFolder, spec: RunSpec, files: list[dict[str, Any]] | None, columns: set[str]) -> None:
    """The ``agg_`` tables, merged from the aggregate files of the last level of the merge tree (at most
    ``aggregate_tree.FAN_IN``; the map tasks' own in a run of fewer), ``files`` being the map tasks'
    (listed in ``aggregate_files``); from a scan of ``documents`` where a task of an older datapipe
    wrote none (a run resumed across versions)."""
    inputs = aggregate_tree.final_inputs(folder, spec) if files is not None else None
    if files is None or inputs is None:
        attach(con, folder.root, views=False)  # every file: the scan reads them all
        aggregates.scan_tables(con, spec.stage_types, temp=False)
        schema.write_table(con, schema.AGGREGATE_FILES, [])
        return
    declared = aggregates.run_aggregates(spec.stage_types, columns)
    fs, resolve = locator(folder.root)
    relation = aggregates.read_once(con, [resolve(p) for p in inputs], fs, aggregates.file_schema(declared))
    try:
        aggregates.create_tables(con, relation, declared)
    finally:
        con.execute(f"DROP TABLE {relation}")
    schema.write_table(con, schema.AGGREGATE_FILES, files)


def document_files(folder: RunFolder, spec: RunSpec) -> list[dict[str, Any]]:
    """Every kept and rejected file of the run, as its map marker records it (``audit_files``; the
    markers were read, and cached, for the counts). A marker written before markers recorded them
    has its files described from their footers."""
    out: list[dict[str, Any]] = []
    for segment in spec.segments:
        markers = folder.markers.read_all(map_phase(segment.index), full=True)
        for shard in spec.shards:
            marker = markers.get(shard.key)
            if marker is None:
                raise PipelineError(f"marker missing for map{segment.index} {shard.key}: the run is incomplete")
            if "audit_files" in marker:
                out += marker["audit_files"]
                continue
            for entry in marker.get("files") or []:
                rel = entry["path"]
                status = "kept" if rel.startswith(f"{DOCS_DIR}/") else "rejected" if rel.startswith(f"{REJECTED_DIR}/") else None
                if status is not None and rel.endswith(".parquet"):
                    out.append(_described(folder, rel, status))
    return sorted(out, key=lambda f: f["path"])


def copies_files(folder: RunFolder, spec: RunSpec) -> list[dict[str, Any]] | None:
    """Every copies index file of the run, as the map markers of the segments that apply a global stage
    record them (``copies_files``); None where a marker has no such record (a task of a datapipe
    before the index): the index would miss its copies."""
    out: list[dict[str, Any]] = []
    for segment in spec.segments:
        if segment.apply_global is None:
            continue
        markers = folder.markers.read_all(map_phase(segment.index), full=True)
        for shard in spec.shards:
            marker = markers.get(shard.key) or {}
            if "copies_files" not in marker:
                return None
            out += marker["copies_files"]
    return sorted(out, key=lambda f: f["path"])


def aggregate_files(folder: RunFolder, spec: RunSpec) -> list[dict[str, Any]] | None:
    """Every map task's aggregate file (``aggregates``: path and rows, or null for a task that wrote no
    document); None where a marker has no such record (a task of a datapipe before aggregates)."""
    out: list[dict[str, Any]] = []
    for segment in spec.segments:
        markers = folder.markers.read_all(map_phase(segment.index))
        for shard in spec.shards:
            marker = markers.get(shard.key) or {}
            if "aggregates" not in marker:
                return None
            if marker["aggregates"] is not None:
                out.append(marker["aggregates"])
    return sorted(out, key=lambda f: f["path"])


def _described(folder: RunFolder, rel: str, status: str) -> dict[str, Any]:
    """A file's ``audit_files`` entry from its footer (rows, columns, the id range from row-group statistics)."""
    fs, resolve = locator(folder.root)
    meta = pq.ParquetFile(resolve(rel), filesystem=fs).metadata
    schema = meta.schema.to_arrow_schema()
    lo: str | None = None
    hi: str | None = None
    if "id" in schema.names:
        index = schema.names.index("id")
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(index).statistics
            if stats is None or not stats.has_min_max:  # no statistics: the file is read for every id
                lo, hi = "", "\U0010ffff"
                break
            lo = stats.min if lo is None else min(lo, stats.min)
            hi = stats.max if hi is None else max(hi, stats.max)
    columns = [[f.name, str(f.type)] for f in schema]
    return {"path": rel, "status": status, "rows": meta.num_rows, "min_id": lo, "max_id": hi, "columns": columns}


def _layouts(folder: RunFolder, files: list[dict[str, Any]]) -> dict[int, pa.Schema]:
    """Number the files' column layouts (sets every file gives ``layout``); each one's Arrow schema
    from the footer of its first file: one footer per layout, not per file."""
    fs, resolve = locator(folder.root)
    numbers: dict[str, int] = {}
    schemas: dict[int, pa.Schema] = {}
    # The cached markers share one list per layout (run_folder/markers.py ``_share``): each list's text
    # is made once, not once per file (~55 us for ~100 columns).
    by_list: dict[int, int] = {}
    for f in files:
        number = by_list.get(id(f["columns"]))
        if number is None:
            key = repr(f["columns"])  # [[name, type], ...]: its text, made in C
            if key not in numbers:
                numbers[key] = len(numbers)
                schemas[numbers[key]] = pq.read_schema(resolve(f["path"]), filesystem=fs).remove_metadata()
            number = by_list[id(f["columns"])] = numbers[key]
        f["layout"] = number
    return schemas


def document_columns(con: Any, schemas: list[pa.Schema]) -> list[tuple[str, str]]:
    """The columns of ``documents`` with their DuckDB types: the documented ones first, then every
    other column of any layout, sorted; a column's type is DuckDB's union of the layouts' types."""
    types: dict[str, str] = {}
    if schemas:
        for i, schema in enumerate(schemas):
            con.register(f"layout_{i}", schema.empty_table())
        union = " UNION ALL BY NAME ".join(f"SELECT * FROM layout_{i}" for i in range(len(schemas)))
        types = {name: ctype for name, ctype, *_ in con.execute(f"DESCRIBE {union}").fetchall()}
        for i in range(len(schemas)):
            con.unregister(f"layout_{i}")
    core = dict(CORE_COLUMNS)
    return CORE_COLUMNS + sorted((c, t) for c, t in types.items() if c not in core and c not in NOT_IN_DOCUMENTS and t != "BLOB")


# --- counts and conservation ---------------------------------------------------


def _stage_row(stages: dict[int, dict[str, Any]], pos: str | int) -> dict[str, Any]:
    """The funnel row of a stage position; the one past the last stage is the tokenizer's
    (it appears only when the tokenizer rejected documents)."""
    return stages.setdefault(int(pos), {"stage": "tokenize", "in": 0, "skipped": 0, "rejected": {}})


def collect_counts(folder: RunFolder, spec: RunSpec) -> dict[str, Any]:
    """Per-stage funnel and per-source totals, from the completion markers."""
    # "in": documents reaching the stage; "skipped": of those, passed untouched (kind not in its kinds).
    stages: dict[int, dict[str, Any]] = {0: {"stage": "read", "in": 0, "skipped": 0, "rejected": {}}}
    for pos in range(1, len(spec.stages) + 1):
        stages[pos] = {"stage": spec.stage_name(pos), "in": 0, "skipped": 0, "rejected": {}}
    sources = {s: {"documents": 0, "kept": 0, "tokens": 0} for s in spec.sources}
    edits: dict[int, dict[str, int]] = {}  # position -> counting column -> sum (Stage.edit_counts)
    changed: dict[int, int] = {}  # position -> documents it changed
    encoders: dict[str, int] = {}  # encoding library -> map tasks that encoded with it (tokenize only)
    for segment in spec.segments:
        markers = folder.markers.read_all(map_phase(segment.index), full=True)  # read back: the driver keeps counts only
        for shard in spec.shards:
            m = markers.get(shard.key)
            if m is None:
                raise PipelineError(f"marker missing for map{segment.index} {shard.key}: the run is incomplete")
            if segment.index == 0:
                stages[0]["in"] += m["docs_in"]
                sources[shard.source.name]["documents"] += m["docs_in"]
            for pos, n in m["stage_in"].items():
                _stage_row(stages, pos)["in"] += n
            for pos, n in m.get("stage_skipped", {}).items():
                _stage_row(stages, pos)["skipped"] += n
            for pos, n in m.get("stage_recorded", {}).items():  # run --from: signals read, not computed
                row = _stage_row(stages, pos)
                row["recorded"] = row.get("recorded", 0) + n
            for pos, reasons in m["rejected"].items():
                bucket = _stage_row(stages, pos)["rejected"]
                for reason, n in reasons.items():
                    bucket[reason] = bucket.get(reason, 0) + n
            for pos, sums in m.get("stage_edits", {}).items():  # markers of older datapipes have none
                totals = edits.setdefault(int(pos), {})
                for column, n in sums.items():
                    totals[column] = totals.get(column, 0) + n
            for pos, n in m.get("stage_changed", {}).items():
                changed[int(pos)] = changed.get(int(pos), 0) + n
            if segment.final:
                sources[shard.source.name]["kept"] += m["kept"]
                sources[shard.source.name]["tokens"] += m["tokens"]
                if "encoder" in m:
                    encoders[m["encoder"]] = encoders.get(m["encoder"], 0) + 1
    for pos in range(1, len(spec.stages) + 1):
        if pos in edits or pos in changed:
            what = build_stage(spec, pos).edits()
            stages[pos]["changed"] = changed.get(pos, 0)
            sums = edits.get(pos, {})
            stages[pos]["edits"] = [
                {"signal": c, "what": what.get(c, c), "total": sums[c]}
                for c in sorted(sums, key=lambda c: (list(what).index(c) if c in what else len(what), c))
            ]
    # The position after the last stage is tokenizing: in the funnel only if the tokenizer raised on
    # documents (record_error), so ordinary runs show the stages they configured.
    tokenize = len(spec.stages) + 1
    if tokenize in stages and not stages[tokenize]["rejected"]:
        del stages[tokenize]
    total_in = stages[0]["in"]
    total_rejected = sum(sum(s["rejected"].values()) for s in stages.values())
    total_kept = sum(s["kept"] for s in sources.values())
    return {
        "documents": total_in,
        "kept": total_kept,
        "rejected": total_rejected,
        "stages": [{"position": p, **s} for p, s in sorted(stages.items())],
        "sources": sources,
        **({"encoders": dict(sorted(encoders.items()))} if encoders else {}),
    }


def check_conservation(folder: RunFolder, counts: dict[str, Any]) -> None:
    """Inputs = kept + rejected: the markers' counts against each other, then against the rows of the
    kept and rejected files the database lists (each task counted its files' rows as it wrote them).
    O(files): no document is read."""
    import duckdb

    if counts["documents"] != counts["kept"] + counts["rejected"]:
        raise PipelineError(
            f"conservation violated: {counts['documents']} documents read, but "
            f"{counts['kept']} kept + {counts['rejected']} rejected"
        )
    with duckdb.connect(str(folder.stats_db), read_only=True) as con:
        con.execute("SET python_enable_replacements = false")  # a missing table is an error, not a Python name
        row = con.execute(
            "SELECT coalesce(sum(rows) FILTER (status = 'kept'), 0), coalesce(sum(rows) FILTER (status = 'rejected'), 0), "
            "count(DISTINCT path) = count(*) FROM document_files"
        ).fetchall()[0]  # an aggregate: one row (fetchall: DuckDB 2 holds a result fetched only in part)
    kept, rejected, unique = row
    if (kept, rejected) != (counts["kept"], counts["rejected"]) or not unique:
        raise PipelineError(
            f"conservation violated in the outputs: {counts['documents']} documents read ({counts['kept']} kept, "
            f"{counts['rejected']} rejected), but the kept files hold {kept} rows and the rejected files {rejected}"
        )
