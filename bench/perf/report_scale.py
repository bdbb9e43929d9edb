"""`datapipe report` and `datapipe stats` on a large synthetic run folder: reading the aggregates the map
tasks wrote (this checkout) against scanning `documents` (another checkout, e.g. main), interleaved.

    python -m bench.perf.report_scale --baseline /work/main --documents 4000000 --files 800 [--repeats 3 --json F]

The run folder has the real layout: `docs/<source>/<task>.parquet` (kept) and
`rejected/<source>/<task>.01-length.parquet` per task, each with id, source, kind, lang, text (a short
one: the commands never read it), n_chars, n_tokens (and stage, reason, detail for rejects); each task's
aggregate file written by this checkout's own task code (``audit.aggregates.task_aggregates``); and two
``stats.duckdb``: this checkout's (index, agg_ tables, views) and the baseline's (the same index, no
agg_ tables, ``mixture`` over ``documents`` as the baseline defines it). Each measurement is a fresh
process running one command with one checkout's code, reporting wall and CPU seconds and peak RSS.
The machine's cores are shared: compare the CPU ratios; wall times are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import ROOT

SOURCES = ("web_zh", "web_en", "code")
LANGS = ("zh", "en", "ja", "ko", "fr", "de", "ru", "es")
REASONS = ("too_short", "too_long", "low_language_score")
MIXTURE_OF = r"""
import sys
from datapipe.audit.views import mixture_view_sql
try:
    print(mixture_view_sql(set(sys.argv[1].split(","))))
except TypeError:
    print(mixture_view_sql())
"""
TIMED = r"""
import resource, sys, time, json, io, contextlib
from click.testing import CliRunner
from datapipe.cli import main
import duckdb, pyarrow.dataset, datapipe.audit.report, datapipe.audit.mixture  # imports are not the work timed
t, cpu = time.perf_counter(), time.process_time()
result = CliRunner().invoke(main, sys.argv[1:])
wall, cpu = time.perf_counter() - t, time.process_time() - cpu
assert result.exit_code == 0, result.output
print(json.dumps({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
"""


def task_files(root: Path, task: int, rows: int, rng: np.random.Generator) -> list[tuple[Path, str]]:
    """One map task's kept and rejected files (about 1 in 5 documents rejected)."""
    source = SOURCES[task % len(SOURCES)]
    ids = np.array([f"{source}/in-{task:05d}.jsonl#L{i}" for i in range(rows)], dtype=object)
    lang = np.array(LANGS, dtype=object)[rng.integers(0, len(LANGS), rows)]
    n_chars = np.round(10 ** rng.uniform(1.5, 5, rows)).astype(np.int64)
    rejected = rng.random(rows) < 0.2
    text = pa.array(["lorem ipsum dolor sit amet " * 3] * rows, pa.string())
    base = {
        "id": pa.array(ids, pa.string()),
        "source": pa.array([source] * rows, pa.string()),
        "kind": pa.array(["code" if source == "code" else "web"] * rows, pa.string()),
        "lang": pa.array(lang, pa.string()),
        "text": text,
        "n_chars": pa.array(n_chars, pa.int64()),
    }
    table = pa.table(base)
    out = []
    kept = table.filter(pa.array(~rejected))
    kept = kept.append_column("n_tokens", pa.array(kept["n_chars"].to_numpy() // 3, pa.int64()))
    kept = kept.append_column("split", pa.array(np.where(rng.random(kept.num_rows) < 0.01, "val", "train"), pa.string()))
    path = root / "docs" / source / f"{task:05d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(kept, path, compression="zstd")
    out.append((path, "kept"))
    rej = table.filter(pa.array(rejected))
    rej = rej.append_column("stage", pa.array(["length"] * rej.num_rows, pa.string()))
    rej = rej.append_column("reason", pa.array(np.array(REASONS, dtype=object)[rng.integers(0, 3, rej.num_rows)], pa.string()))
    rej = rej.append_column("detail", pa.nulls(rej.num_rows, pa.string()))
    path = root / "rejected" / source / f"{task:05d}.01-length.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rej, path, compression="zstd")
    out.append((path, "rejected"))
    return out


def build(root: Path, documents: int, files: int, baseline: Path) -> dict[str, float]:
    """The run folder and its two databases; returns how long building took."""
    import duckdb

    from datapipe.audit import aggregates, schema
    from datapipe.audit.documents import stored_views
    from datapipe.audit.views import create_table_views, document_views

    started = time.perf_counter()
    rng = np.random.default_rng(0)
    tasks = files // 2
    rows = documents // tasks
    written: list[tuple[Path, str]] = []
    agg_files = []
    task_s = 0.0
    for task in range(tasks):
        mine = task_files(root, task, rows, rng)
        written += mine
        t = time.process_time()
        table = aggregates.task_aggregates(mine, [])
        task_s += time.process_time() - t
        assert table is not None
        path = root / "aggregates" / f"{task:05d}.map0.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="zstd")
        agg_files.append({"path": path.relative_to(root).as_posix(), "rows": table.num_rows})
    layouts: dict[str, int] = {}
    schemas = []
    file_rows = []
    for path, status in written:
        meta = pq.ParquetFile(path).metadata
        arrow = meta.schema.to_arrow_schema().remove_metadata()
        key = repr([(f.name, str(f.type)) for f in arrow])
        if key not in layouts:
            layouts[key] = len(layouts)
            schemas.append(arrow)
        ids = pq.read_table(path, columns=["id"])["id"]
        file_rows.append(
            {
                "path": path.relative_to(root).as_posix(),
                "status": status,
                "layout": layouts[key],
                "rows": meta.num_rows,
                "min_id": min(ids.to_pylist()),
                "max_id": max(ids.to_pylist()),
            }
        )
    core = dict(schema.CORE_COLUMNS)
    extra = sorted({(f.name, "VARCHAR") for s in schemas for f in s if f.name not in core and f.name != "text"})
    columns = schema.CORE_COLUMNS + extra
    (root / "run.json").write_text(
        json.dumps({"name": "synthetic", "config": {"sources": [{"name": s} for s in SOURCES], "stages": [{"length": {}}]}}),
        encoding="utf-8",
    )
    for which in ("ours", "baseline"):
        db = root / f"stats.{which}.duckdb"
        db.unlink(missing_ok=True)
        with duckdb.connect(str(db)) as con:
            schema.write_table(con, schema.RUN, [{"root": str(root), "fingerprint": "synthetic", "stages": "[]"}])
            schema.write_table(con, schema.STAGES, [])
            schema.write_table(con, schema.STAGE_REASONS, [])
            schema.write_table(con, schema.STAGE_EDITS, [])
            schema.write_table(con, schema.SHARD_FILES, [])
            schema.write_table(con, schema.DOCUMENT_FILES, file_rows)
            schema.write_table(
                con, schema.DOCUMENT_LAYOUTS, [{"layout": i, "schema": s.serialize().to_pybytes()} for i, s in enumerate(schemas)]
            )
            schema.write_table(
                con, schema.DOCUMENT_COLUMNS, [{"position": i, "name": c, "type": t} for i, (c, t) in enumerate(columns)]
            )
            create_table_views(con)
            views = document_views(con, {c for c, _ in columns})
            if which == "baseline":  # the baseline's own mixture, over documents
                views["mixture"] = subprocess.run(
                    [sys.executable, "-c", MIXTURE_OF, ",".join(c for c, _ in columns)],
                    env={**os.environ, "PYTHONPATH": str(baseline)},
                    cwd=baseline,  # python -c puts the working directory first on sys.path
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            schema.write_table(
                con, schema.AUDIT_VIEWS, [{"position": i, "name": n, "sql": q} for i, (n, q) in enumerate(views.items())]
            )
            if which == "ours":
                import pyarrow.dataset as ds

                declared = aggregates.run_aggregates([], {c for c, _ in columns})
                dataset = ds.dataset(
                    [str(root / f["path"]) for f in agg_files], schema=aggregates.file_schema(declared), format="parquet"
                )
                con.register("__rows", dataset)
                aggregates.create_tables(con, "__rows", declared)
                con.unregister("__rows")
                schema.write_table(con, schema.AGGREGATE_FILES, agg_files)
                stored_views(con, root, remote=False)
    return {"build_s": round(time.perf_counter() - started, 1), "task_aggregates_cpu_s_per_task": round(task_s / tasks, 4)}


def measure(root: Path, which: str, pythonpath: Path, args: list[str]) -> dict[str, float]:
    shutil.copyfile(root / f"stats.{which}.duckdb", root / "stats.duckdb")
    done = subprocess.run(
        ["nice", "-n", "10", sys.executable, "-c", TIMED, *args],
        env={**os.environ, "PYTHONPATH": str(pythonpath)},
        cwd=pythonpath,  # python -c puts the working directory first on sys.path
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{which} {args[0]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout whose report and stats scan documents")
    parser.add_argument("--documents", type=int, default=4_000_000)
    parser.add_argument("--files", type=int, default=800, help="kept + rejected files (two per task)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/report_scale"))
    add_args(parser, repeats=3)
    a = parser.parse_args()
    h = Harness(
        "perf/report_scale",
        a,
        libs=["duckdb", "pyarrow"],
        note=f"{a.documents:,} documents in {a.files} files; baseline {a.baseline}; CPU s of each command after its imports",
    )
    root = a.work / f"run-{a.documents}-{a.files}"
    if not (root / "stats.ours.duckdb").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        built = build(root, a.documents, a.files, a.baseline.resolve())
        print("built", built, flush=True)
        h.figure("a task's aggregates (CPU s, 10,000 documents)", built["task_aggregates_cpu_s_per_task"], "s")
    commands = {"report": ["report", str(root), "--html", str(a.work / "r.html")], "stats": ["stats", str(root)]}
    for name, args in commands.items():
        got = h.interleave(
            {
                f"{name} scanning documents (baseline)": lambda args=args: measure(root, "baseline", a.baseline.resolve(), args),
                f"{name} from aggregates (this checkout)": lambda args=args: measure(root, "ours", ROOT, args),
            }
        )
        base, ours = got[f"{name} scanning documents (baseline)"], got[f"{name} from aggregates (this checkout)"]
        for side, runs in ((f"{name} baseline", base), (f"{name} ours", ours)):
            h.figure(f"{side} CPU s", [r["cpu_s"] for r in runs], "s")
            h.figure(f"{side} wall s (shared cores)", [r["wall_s"] for r in runs], "s", show=False)
            h.figure(f"{side} peak RSS", [r["peak_rss_mib"] for r in runs], "MiB", show=False)
        h.ratio(f"{name}: CPU s scanning / from aggregates", pair_ratios([r["cpu_s"] for r in base], [r["cpu_s"] for r in ours]))
    h.finish(documents=a.documents, files=a.files)


if __name__ == "__main__":
    main()
