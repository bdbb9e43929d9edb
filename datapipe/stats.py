"""The audit database ``stats.duckdb``: one row per input document, the funnel, the shards.

Built from the run's Parquet outputs at the end of a run, into a temporary file that is
renamed into place. Tables (not views over files) so the database stays valid when the
run folder is moved or copied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from datapipe.atomic import atomic_path, temp_path_for
from datapipe.engine.plan import RunSpec
from datapipe.engine.run_folder import RunFolder

# The documented columns of `documents`, in order, with their type when a run has no such signal.
CORE_COLUMNS: list[tuple[str, str]] = [
    ("id", "VARCHAR"), ("source", "VARCHAR"), ("kind", "VARCHAR"), ("lang", "VARCHAR"), ("license", "VARCHAR"),
    ("status", "VARCHAR"), ("stage", "VARCHAR"), ("reason", "VARCHAR"), ("detail", "VARCHAR"),
    ("n_chars", "BIGINT"), ("n_tokens", "BIGINT"),
]
NOT_IN_DOCUMENTS = {"text"}  # the text stays in docs/ and rejected/; the table is for counting


def write_manifest(folder: RunFolder, spec: RunSpec) -> pa.Table:
    rows: list[dict[str, Any]] = []
    for source in spec.sources:
        marker = folder.read_marker("pack", source)
        if marker:
            rows.extend(marker["shards"])
    schema = pa.schema([("path", pa.string()), ("source", pa.string()), ("split", pa.string()),
                        ("rows", pa.int64()), ("tokens", pa.int64()), ("documents", pa.int64()),
                        ("sha256", pa.string()), ("tokenizer_fingerprint", pa.string()),
                        ("seq_len", pa.int64()), ("row_len", pa.int64())])
    table = pa.Table.from_pylist(rows, schema=schema)
    if spec.tokenizer is not None:
        with atomic_path(folder.shards_dir / "manifest.parquet") as tmp:
            pq.write_table(table, tmp)
    return table


def build_stats(folder: RunFolder, spec: RunSpec, counts: dict[str, Any]) -> None:
    import duckdb

    manifest = write_manifest(folder, spec)
    kept = sorted(str(p) for p in (folder.root / "docs").glob("**/*.parquet"))
    rejected = sorted(str(p) for p in (folder.root / "rejected").glob("**/*.parquet"))
    tmp = temp_path_for(folder.stats_db)
    try:
        con = duckdb.connect(str(tmp))
        columns = _union_columns(con, kept) | _union_columns(con, rejected)
        ordered = CORE_COLUMNS + sorted((c, t) for c, t in columns.items()
                                        if c not in dict(CORE_COLUMNS) and c not in NOT_IN_DOCUMENTS
                                        and t != "BLOB")
        parts = []
        if kept:
            parts.append(_select(con, kept, ordered, status="kept"))
        if rejected:
            parts.append(_select(con, rejected, ordered, status="rejected"))
        if not parts:
            parts.append("SELECT " + ", ".join(f"NULL::{t} AS {c}" for c, t in ordered) + " WHERE false")
        con.execute(f"CREATE TABLE documents AS {' UNION ALL BY NAME '.join(parts)} ORDER BY id")
        funnel = [{"position": s["position"], "stage": s["stage"], "docs_in": s["in"], "reason": reason,
                   "dropped": n} for s in counts["stages"] for reason, n in sorted(s["rejected"].items())]
        funnel_table = pa.Table.from_pylist(funnel, schema=pa.schema(
            [("position", pa.int32()), ("stage", pa.string()), ("docs_in", pa.int64()), ("reason", pa.string()),
             ("dropped", pa.int64())]))
        stages_table = pa.Table.from_pylist(
            [{"position": s["position"], "stage": s["stage"], "docs_in": s["in"],
              "dropped": sum(s["rejected"].values())} for s in counts["stages"]])
        con.register("funnel_rows", funnel_table)
        con.register("stage_rows", stages_table)
        con.register("manifest_rows", manifest)
        con.execute("CREATE TABLE funnel AS SELECT * FROM funnel_rows ORDER BY position, reason")
        con.execute("CREATE TABLE stages AS SELECT * FROM stage_rows ORDER BY position")
        con.execute("CREATE TABLE shards AS SELECT * FROM manifest_rows ORDER BY path")
        con.execute("CREATE TABLE run AS SELECT ? AS root, ? AS fingerprint, ? AS stages",
                    [spec.root, spec.fingerprint, json.dumps(spec.stages)])
        con.close()
        tmp.replace(folder.stats_db)
    finally:
        tmp.unlink(missing_ok=True)
        Path(str(tmp) + ".wal").unlink(missing_ok=True)


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
