"""The end of a run: its counts, the audit database ``stats.duckdb``, and the conservation check.

``collect_counts`` sums the funnel and per-source totals from the tasks' markers;
``build_stats`` writes the database: one row per input document, the funnel, the shards, the
mixture; ``check_conservation`` checks inputs = kept + rejected on the database itself.

The database is built from the run's Parquet outputs, into a temporary file that is
renamed into place. Tables (not views over files) so the database stays valid when the
run folder is moved or copied; views only derive from those tables and are the audit layer's
(``datapipe.audit.views``: those of every run and those the run's stages declare). Reading it
(``datapipe sql``, explain, stats, report) is ``datapipe.audit``'s too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.audit.views import create_all
from datapipe.engine.errors import PipelineError
from datapipe.engine.plan import RunSpec, build_stage
from datapipe.run_folder.layout import PACK_PHASE, RunFolder, map_phase
from datapipe.storage.atomic import atomic_path, temp_path_for
from datapipe.tokens.shard_format import MANIFEST_SCHEMA

# The documented columns of `documents`, in order, with their type when a run has no such signal.
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


def write_manifest(folder: RunFolder, spec: RunSpec) -> pa.Table:
    from datapipe.engine.pack_plan import pack_ranges

    rows: list[dict[str, Any]] = []
    for rng in (pack_ranges(folder, spec) or []) if spec.tokenizer is not None else []:
        marker = folder.read_marker(PACK_PHASE, rng.key)
        if marker:
            rows.extend(marker["shards"])
    table = pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA)
    if spec.tokenizer is not None:
        with atomic_path(folder.manifest) as tmp:
            pq.write_table(table, tmp)
    return table


# DuckDB's memory cap while building the audit database: beyond it, the scan and the sort by id
# spill to a scratch folder in the run folder, so building statistics takes the same memory for a
# million documents or a billion (the driver must not grow with the corpus).
STATS_MEMORY_MB = 2048


def build_stats(folder: RunFolder, spec: RunSpec, counts: dict[str, Any], memory_mb: int = STATS_MEMORY_MB) -> None:
    import duckdb

    manifest = write_manifest(folder, spec)
    kept = sorted(str(p) for p in folder.docs_dir.glob("**/*.parquet"))
    rejected = sorted(str(p) for p in folder.rejected_dir.glob("**/*.parquet"))
    tmp = temp_path_for(folder.stats_db)
    scratch = folder.work / "stats-scratch"
    try:
        con = duckdb.connect(str(tmp))
        scratch.mkdir(parents=True, exist_ok=True)
        con.execute(f"SET memory_limit='{int(memory_mb)}MB'")
        con.execute("SET temp_directory=?", [str(scratch)])
        columns = _union_columns(con, kept) | _union_columns(con, rejected)
        ordered = CORE_COLUMNS + sorted(
            (c, t) for c, t in columns.items() if c not in dict(CORE_COLUMNS) and c not in NOT_IN_DOCUMENTS and t != "BLOB"
        )
        parts = []
        if kept:
            parts.append(_select(con, kept, ordered, status="kept"))
        if rejected:
            parts.append(_select(con, rejected, ordered, status="rejected"))
        if not parts:
            parts.append("SELECT " + ", ".join(f"NULL::{t} AS {c}" for c, t in ordered) + " WHERE false")
        con.execute(f"CREATE TABLE documents AS {' UNION ALL BY NAME '.join(parts)} ORDER BY id")
        funnel = [
            {"position": s["position"], "stage": s["stage"], "docs_in": s["in"], "reason": reason, "dropped": n}
            for s in counts["stages"]
            for reason, n in sorted(s["rejected"].items())
        ]
        funnel_table = pa.Table.from_pylist(
            funnel,
            schema=pa.schema(
                [
                    ("position", pa.int32()),
                    ("stage", pa.string()),
                    ("docs_in", pa.int64()),
                    ("reason", pa.string()),
                    ("dropped", pa.int64()),
                ]
            ),
        )
        # skipped: documents that reached the stage and passed untouched because their kind is not in
        # its kinds (langid skips code), so docs_out of one stage is docs_in of the next.
        stages_table = pa.Table.from_pylist(
            [
                {
                    "position": s["position"],
                    "stage": s["stage"],
                    "docs_in": s["in"],
                    "skipped": s.get("skipped", 0),
                    "dropped": sum(s["rejected"].values()),
                    "changed": s.get("changed"),
                }
                for s in counts["stages"]
            ],
            schema=pa.schema(
                [
                    ("position", pa.int64()),
                    ("stage", pa.string()),
                    ("docs_in", pa.int64()),
                    ("skipped", pa.int64()),
                    ("dropped", pa.int64()),
                    ("changed", pa.int64()),
                ]
            ),
        )
        # What stages that change documents did to the documents they passed on (Stage.edit_counts):
        # one row per counting column, e.g. pii / pii_email / emails replaced / 1,234.
        edits_table = pa.Table.from_pylist(
            [{"position": s["position"], "stage": s["stage"], **e} for s in counts["stages"] for e in s.get("edits", [])],
            schema=pa.schema(
                [
                    ("position", pa.int64()),
                    ("stage", pa.string()),
                    ("signal", pa.string()),
                    ("what", pa.string()),
                    ("total", pa.int64()),
                ]
            ),
        )
        con.register("funnel_rows", funnel_table)
        con.register("stage_rows", stages_table)
        con.register("manifest_rows", manifest)
        con.register("edit_rows", edits_table)
        con.execute("CREATE TABLE stage_reasons AS SELECT * FROM funnel_rows ORDER BY position, reason")
        con.execute("CREATE TABLE stages AS SELECT * FROM stage_rows ORDER BY position")
        con.execute("CREATE TABLE stage_edits AS SELECT * FROM edit_rows ORDER BY position, signal")
        con.execute("CREATE TABLE shard_files AS SELECT * FROM manifest_rows ORDER BY path")
        con.execute(
            "CREATE TABLE run AS SELECT ? AS root, ? AS fingerprint, ? AS stages",
            [spec.root, spec.fingerprint, json.dumps(spec.stages)],
        )
        create_all(con, {r[0] for r in con.execute("DESCRIBE documents").fetchall()}, spec.stage_types)
        con.close()
        tmp.replace(folder.stats_db)
    finally:
        tmp.unlink(missing_ok=True)
        Path(str(tmp) + ".wal").unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _union_columns(con: Any, files: list[str]) -> dict[str, str]:
    if not files:
        return {}
    rows = con.execute("DESCRIBE SELECT * FROM read_parquet(?, union_by_name=true)", [files]).fetchall()
    return {name: ctype for name, ctype, *_ in rows}


def _select(con: Any, files: list[str], ordered: list[tuple[str, str]], status: str) -> str:
    present = _union_columns(con, files)
    exprs = []
    for name, ctype in ordered:
        if name == "status":
            exprs.append(f"'{status}' AS status")
        elif name in present:
            exprs.append(f'"{name}"')
        else:
            exprs.append(f'NULL::{ctype} AS "{name}"')
    listing = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"
    return f"SELECT {', '.join(exprs)} FROM read_parquet({listing}, union_by_name=true)"


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
    for segment in spec.segments:
        for shard in spec.shards:
            m = folder.read_marker(map_phase(segment.index), shard.key)
            if m is None:
                raise PipelineError(f"marker missing for map{segment.index} {shard.key}: the run is incomplete")
            if segment.index == 0:
                stages[0]["in"] += m["docs_in"]
                sources[shard.source.name]["documents"] += m["docs_in"]
            for pos, n in m["stage_in"].items():
                _stage_row(stages, pos)["in"] += n
            for pos, n in m.get("stage_skipped", {}).items():
                _stage_row(stages, pos)["skipped"] += n
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
    }


def check_conservation(folder: RunFolder, counts: dict[str, Any]) -> None:
    """Inputs = kept + rejected, each document exactly once: checked on the outputs themselves."""
    import duckdb

    if counts["documents"] != counts["kept"] + counts["rejected"]:
        raise PipelineError(
            f"conservation violated: {counts['documents']} documents read, but "
            f"{counts['kept']} kept + {counts['rejected']} rejected"
        )
    with duckdb.connect(str(folder.stats_db), read_only=True) as con:
        row = con.execute("SELECT count(*), count(DISTINCT id) FROM documents").fetchone()
    assert row is not None  # an aggregate always returns one row
    n, distinct = row
    if n != counts["documents"] or distinct != n:
        raise PipelineError(
            f"conservation violated in the outputs: {counts['documents']} documents read, "
            f"{n} rows in documents, {distinct} distinct ids"
        )
