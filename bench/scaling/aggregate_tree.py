"""The end of a run's statistics at crawl proportions: merging every map task's aggregate file in the
driver (before) against the merge tree of tasks (``engine/aggregate_tree.py``, after), real code on
synthetic files shaped like a real run's.

    python -m bench.scaling.aggregate_tree [--files 37253] [--variants 512] [--lines 1000] [--template RUN] \\
        [--part all|tree|view] [--json bench/results/aggregate_tree.json]

1. **The files**: a small real run (zh/en Wikipedia through langid, boilerplate, minhash, length; or
   ``--template``, a finished run folder) gives a real map task's aggregate file (its largest). From it
   ``--variants`` files are made, each with its counts drawn anew (x1-3) and each list with a ``limit``
   (removed lines) given ``--lines`` rows drawn from the template's, their keys tagged with a suffix
   drawn from a Zipf law over 1M (the distinct lines grow with the run: the lists' bound is tested);
   ``--files`` map task files (10 TB: 37,253 map tasks) are hard links to them, in
   ``aggregates/<source>/<shard>.map0.parquet``.
2. **Before**: the driver's merge as it was (``engine/finish.py`` ``_write_aggregates`` at main
   eb58421: one pyarrow dataset over every file, ``create_tables`` in the driver's DuckDB of 256 MB),
   in a fresh process: its CPU (all threads) and the process's peak RSS during the merge (the peak
   counter reset after the imports; ``held_mib``: the RSS then).
3. **After**: the driver's part, ``level_tasks`` for every level and ``final_inputs`` over markers
   (held in memory, as the runner caches them), then the merge of the last level's files into the
   tables (a fresh process: CPU and peak RSS); the tasks, every one of the tree run through
   ``tasks.aggregates.merge_aggregates`` in one process (CPU per task: total, largest), and the
   largest of each level again in a fresh process for its peak RSS.
4. **The same tables**: the ``agg_`` tables of both, compared; every table without a ``limit`` must be
   equal, a limited list (its first rows of many more) is reported as equal or not.

5. **The stored ``documents`` view** (``--part view``): a run folder of ``--view-shards`` map tasks over
   8 sources, each a kept file and a rejected file per stage for 3 stages (37,253: ~150k files, tiny
   Parquet files hard-linked), its view written by ``stored_views`` with every path listed (before:
   ``folder_globs`` left out) and with folder patterns (after): the SQL's size, the CPU of writing
   it and of binding it (what every query of plain DuckDB pays first).

    python -m bench.scaling.aggregate_tree --part view --json bench/results/aggregate_tree.json

CPU seconds are process CPU (the machine is shared: wall times are noisy and not used).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench._support.paths import ROOT, SHARED

VOCABULARY = 1_000_000  # distinct suffixes a limited list's key is tagged with (Zipf, s = 1.2)


def template_run(tmp: Path) -> Path:
    """A small real run: every core aggregate and three stages' own have rows."""
    import yaml

    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    data = tmp / "data"
    data.mkdir(parents=True)
    for name, path in (("zh", "zh_wikipedia.jsonl"), ("en", "en_wikipedia.jsonl")):
        with open(SHARED / "corpus" / path, encoding="utf-8") as f:
            lines = [line for _, line in zip(range(300), f)]
        (data / f"{name}.jsonl").write_text("".join(lines + lines[:30]), encoding="utf-8")
    pipeline = tmp / "pipeline.yaml"
    pipeline.write_text(
        yaml.safe_dump(
            {
                "name": "aggregate_tree_bench",
                "sources": [
                    {"name": "wiki_zh", "kind": "web", "paths": [str(data / "zh.jsonl")]},
                    {"name": "wiki_en", "kind": "web", "paths": [str(data / "en.jsonl")]},
                ],
                "stages": [
                    {"langid": {"keep": ["zh", "en"]}},
                    {"boilerplate": {"min_docs": 3}},
                    {"minhash": {}},
                    {"length": {"min_chars": 300}},
                ],
                "tokenize": {"tokenizer": str(ROOT / "tokenizer" / "demo.json"), "seq_len": 256},
            }
        )
    )
    out = tmp / "template"
    run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda _: None, in_process=True)
    return out


def declared(template: Path) -> tuple[list[Any], list[Any]]:
    """The template run's stage types and aggregates (as its end of run declared them)."""
    import duckdb

    from datapipe.audit import aggregates

    types = aggregates.stage_types(json.loads((template / "run.json").read_text()))
    with duckdb.connect(str(template / "stats.duckdb"), read_only=True) as con:
        columns = {r[0] for r in con.execute("select name from document_columns").fetchall()}
    return types, aggregates.run_aggregates(types, columns)


def make_files(template: Path, root: Path, files: int, variants: int, lines: int, seed: int = 0) -> list[str]:
    """``files`` map task aggregate files under ``root`` (paths relative to it), ``variants`` distinct."""
    import pyarrow.compute as pc

    from datapipe.audit.aggregates import AGGREGATE_COLUMN

    _, aggs = declared(template)
    biggest = max((template / "aggregates").rglob("*.parquet"), key=lambda p: pq.read_metadata(p).num_rows)
    base = pq.read_table(biggest)
    rng = np.random.default_rng(seed)
    limited = {a.name: a for a in aggs if a.limit is not None}
    sums = {c for a in aggs for c, how in a.merge.items() if how == "sum"}
    keys = {c for a in limited.values() for c, t in a.columns if c not in a.merge and t == "VARCHAR"}
    made = root / "variants"
    made.mkdir(parents=True)
    for v in range(variants):
        # each limited list: ``lines`` rows drawn from the template's, their keys tagged (Zipf over VOCABULARY)
        parts = [base.filter(pc.invert(pc.is_in(base[AGGREGATE_COLUMN], pa.array(list(limited)))))]
        for name in limited:
            rows = base.filter(pc.equal(base[AGGREGATE_COLUMN], name))
            if rows.num_rows:
                parts.append(rows.take(pa.array(rng.integers(0, rows.num_rows, lines))))
        table = pa.concat_tables(parts)
        names = table[AGGREGATE_COLUMN].to_pylist()
        columns = []
        for field in table.schema:
            col = table[field.name]
            if field.name in sums and pa.types.is_integer(field.type):
                values = np.array(col.fill_null(0).to_pylist(), dtype=np.int64) * rng.integers(1, 4, len(names))
                col = pa.array([x if ok else None for x, ok in zip(values.tolist(), col.is_valid().to_pylist())], field.type)
            elif field.name in keys:
                tags = np.minimum(rng.zipf(1.2, len(names)), VOCABULARY)
                col = pa.array(
                    [f"{s} #{t}" if s is not None and n in limited else s for s, n, t in zip(col.to_pylist(), names, tags)],
                    field.type,
                )
            columns.append(col)
        pq.write_table(pa.table(columns, schema=table.schema), made / f"{v:05d}.parquet", compression="zstd")
    out = []
    for i in range(files):
        rel = f"aggregates/src{i % 8}/{i:06d}.map0.parquet"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.link(made / f"{i % variants:05d}.parquet", root / rel)
        out.append(rel)
    return out


def _status_mib(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak since ``_reset_peak``) of this process, from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> float:
    """Start counting the peak RSS now (Linux: clear_refs 5 resets VmHWM): the measured step's peak is
    its own, not that of the imports and set-up before it. Returns the RSS held now."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mib("VmRSS")


def child_before(template: Path, root: Path, paths: list[str]) -> dict[str, Any]:
    """The driver's merge of every file, as ``_write_aggregates`` did it before the tree."""
    import duckdb
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    from datapipe.audit import aggregates

    _, aggs = declared(template)
    held = _reset_peak()
    cpu = time.process_time()
    con = duckdb.connect()
    con.execute("SET memory_limit='256MB'")  # engine/finish.py STATS_MEMORY_MB
    dataset = ds.FileSystemDataset.from_paths(
        [str(root / p) for p in paths],
        schema=aggregates.file_schema(aggs),
        format=ds.ParquetFileFormat(),
        filesystem=pafs.LocalFileSystem(),
    )
    con.register("__aggregate_rows", dataset)
    aggregates.create_tables(con, "__aggregate_rows", aggs)
    cpu, peak = time.process_time() - cpu, _status_mib("VmHWM")
    tables = {a.table: con.execute(f"select * from {a.table}").fetchall() for a in aggs}
    return {"cpu_s": round(cpu, 3), "peak_rss_mib": round(peak), "held_mib": round(held), "tables": _digest(tables)}


def child_final(template: Path, root: Path, paths: list[str]) -> dict[str, Any]:
    """The driver's merge after the tree: the last level's files, as ``_write_aggregates`` does it now."""
    import duckdb
    import pyarrow.fs as pafs

    from datapipe.audit import aggregates

    _, aggs = declared(template)
    held = _reset_peak()
    cpu = time.process_time()
    con = duckdb.connect()
    con.execute("SET memory_limit='256MB'")
    relation = aggregates.read_once(con, [str(root / p) for p in paths], pafs.LocalFileSystem(), aggregates.file_schema(aggs))
    aggregates.create_tables(con, relation, aggs)
    cpu, peak = time.process_time() - cpu, _status_mib("VmHWM")
    tables = {a.table: con.execute(f"select * from {a.table}").fetchall() for a in aggs}
    return {"cpu_s": round(cpu, 3), "peak_rss_mib": round(peak), "held_mib": round(held), "tables": _digest(tables)}


def child_task(template: Path, root: Path, level: int, first: int, end: int, inputs: list[str]) -> dict[str, Any]:
    """One task of the tree, its real code: CPU and peak RSS of a fresh process."""
    from datapipe.engine.tasks.aggregates import merge_aggregates

    types, _ = declared(template)
    spec = SimpleNamespace(root=str(root), stage_types=types)
    held = _reset_peak()
    cpu = time.process_time()
    marker = merge_aggregates(spec, level, first, end, tuple(inputs))  # type: ignore[arg-type]
    return {
        "cpu_s": round(time.process_time() - cpu, 3),
        "peak_rss_mib": round(_status_mib("VmHWM")),
        "held_mib": round(held),
        "rows": marker["rows"],
    }


def _digest(tables: dict[str, list[tuple]]) -> dict[str, Any]:
    """Each table's rows, sorted, as JSON values (to compare before and after across processes)."""
    return {name: sorted((list(r) for r in rows), key=repr) for name, rows in tables.items()}


def _agreement(agg: Any, before: list[list[Any]], after: list[list[Any]]) -> dict[str, int]:
    """How much a limited list after the tree agrees with the serial merge's: its rows, the same keys
    (lines), the same rows (keys and counts)."""
    keys = [i for i, (c, _) in enumerate(agg.columns) if c not in agg.merge]
    key_set = lambda rows: {repr([r[i] for i in keys]) for r in rows}  # noqa: E731
    return {
        "rows": len(before),
        "same_keys": len(key_set(before) & key_set(after)),
        "same_rows": len({repr(r) for r in before} & {repr(r) for r in after}),
    }


def _child(kind: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run ``child_<kind>`` in a fresh process (its peak RSS is its own)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(args, f)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "bench.scaling.aggregate_tree", "--child", kind, f.name],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
    finally:
        os.unlink(f.name)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def driver_planning(paths: list[str]) -> tuple[float, list[list[Any]], list[str]]:
    """``level_tasks`` for every level and ``final_inputs``, over markers held in memory (the runner's
    cache): the driver's CPU for the tree, and the tasks by level."""
    from datapipe.engine import aggregate_tree

    markers = {f"s{i:06d}": {"aggregates": {"path": p, "rows": 100}} for i, p in enumerate(paths)}
    folder = SimpleNamespace(markers=SimpleNamespace(read_all=lambda phase: markers))
    spec = SimpleNamespace(segments=[SimpleNamespace(index=0)], shards=[SimpleNamespace(key=k) for k in markers])
    cpu = time.process_time()
    levels = [aggregate_tree.level_tasks(folder, spec, lv) for lv in range(1, aggregate_tree.levels(len(paths)) + 1)]  # type: ignore[arg-type]
    final = aggregate_tree.final_inputs(folder, spec)  # type: ignore[arg-type]
    cpu = time.process_time() - cpu
    assert final is not None and all(t is not None for t in levels)
    return cpu, levels, final  # type: ignore[return-value]


def view_text(root: Path, shards: int, sources: int, stages: int) -> dict[str, Any]:
    """The stored ``documents`` view of a run folder of ``shards`` map tasks over ``sources`` sources, each
    with a kept file and a rejected file per stage (10 TB: 37,253 x 4 = ~150k files; one tiny Parquet
    file per layout, hard-linked): its SQL's size and the CPU of ``stored_views``, the paths listed
    (before: ``folder_globs`` left out) against the folder patterns (after)."""
    import duckdb

    from datapipe.audit import documents, schema

    kept, rejected = (
        pa.table({"id": ["a"], "text": ["x"], "n_chars": [1]}),
        pa.table({"id": ["b"], "text": ["y"], "reason": ["r"]}),
    )
    for k in range(sources):  # one of each per source: a file takes at most 65,000 links (ext4)
        pq.write_table(kept, root / f"kept{k}.parquet")
        pq.write_table(rejected, root / f"rejected{k}.parquet")
    files = []
    for i in range(shards):
        source = f"src{i % sources}"
        rel = f"docs/{source}/{i:06d}.parquet"
        files.append({"path": rel, "status": "kept", "layout": 0, "rows": 1, "min_id": "a", "max_id": "a"})
        for s in range(stages):
            files.append(
                {
                    "path": f"rejected/{source}/{i:06d}.{s + 2:02d}-stage{s}.parquet",
                    "status": "rejected",
                    "layout": 1 + s,
                    "rows": 1,
                    "min_id": "b",
                    "max_id": "b",
                }
            )
    for f in files:
        (root / f["path"]).parent.mkdir(parents=True, exist_ok=True)
        os.link(root / f"{f['status']}{f['path'].split('/')[1][3:]}.parquet", root / f["path"])
    out: dict[str, Any] = {"files": len(files)}
    for name, globs in (("before", lambda _root, grouped: grouped), ("after", documents.folder_globs)):
        con = duckdb.connect()
        schema.write_table(con, schema.DOCUMENT_FILES, files)
        layouts = [kept.schema] + [rejected.schema] * stages
        schema.write_table(
            con, schema.DOCUMENT_LAYOUTS, [{"layout": i, "schema": s.serialize().to_pybytes()} for i, s in enumerate(layouts)]
        )
        columns = [("id", "VARCHAR"), ("text", "VARCHAR"), ("n_chars", "BIGINT"), ("reason", "VARCHAR"), ("status", "VARCHAR")]
        schema.write_table(
            con, schema.DOCUMENT_COLUMNS, [{"position": i, "name": n, "type": t} for i, (n, t) in enumerate(columns)]
        )
        schema.write_table(con, schema.AUDIT_VIEWS, [])
        real, documents.folder_globs = documents.folder_globs, globs
        try:
            build = time.process_time()
            documents.stored_views(con, root, remote=False)
            build = time.process_time() - build
        finally:
            documents.folder_globs = real
        sql = con.execute("select sql from duckdb_views() where view_name = 'documents' and not internal").fetchone()[0]
        con.execute(f"SET VARIABLE datapipe_run = '{root}'")
        cpu = time.process_time()  # what every query of plain DuckDB on the view pays first: binding it
        con.execute("select * from documents limit 0").fetchall()
        bind = time.process_time() - cpu
        out[name] = {"view_sql_bytes": len(sql.encode()), "stored_views_cpu_s": round(build, 3), "bind_cpu_s": round(bind, 3)}
        con.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=37_253, help="map task aggregate files (10 TB: 37,253)")
    parser.add_argument("--variants", type=int, default=512, help="distinct files among them")
    parser.add_argument("--lines", type=int, default=1000, help="rows of each limited list (removed lines) per file")
    parser.add_argument("--template", type=Path, help="a finished run folder (default: a small real run, made here)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--part", choices=("all", "tree", "view"), default="all", help="the merge tree, the stored view, or both")
    parser.add_argument("--view-shards", type=int, default=37_253, help="map tasks of the stored view's run folder")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, path = args.child
        a = json.loads(Path(path).read_text())
        fn = {"before": child_before, "final": child_final, "task": child_task}[kind]
        a["template"], a["root"] = Path(a["template"]), Path(a["root"])
        print(json.dumps(fn(**a)))
        return

    result: dict[str, Any] = json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    if args.part in ("all", "view"):
        with tempfile.TemporaryDirectory(prefix="aggview-bench-") as tmp_name:
            view = view_text(Path(tmp_name), args.view_shards, sources=8, stages=3)
        print(f"stored documents view: {json.dumps(view)}", flush=True)
        result["documents_view"] = view
    if args.part in ("all", "tree"):
        result.update(merge_tree(args))
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


def merge_tree(args: argparse.Namespace) -> dict[str, Any]:
    """Part 1-4 of the docstring: before and after, at ``args.files`` map tasks."""
    from datapipe.engine import aggregate_tree
    from datapipe.engine.tasks.aggregates import merge_aggregates

    with tempfile.TemporaryDirectory(prefix="aggtree-bench-") as tmp_name:
        tmp = Path(tmp_name)
        template = args.template or template_run(tmp / "small")
        root = tmp / "run"
        started = time.perf_counter()
        paths = make_files(template, root, args.files, args.variants, args.lines)
        print(f"{args.files:,} files ({args.variants} distinct) in {time.perf_counter() - started:.0f} s", flush=True)
        common = {"template": str(template), "root": str(root)}

        before = _child("before", {**common, "paths": paths})
        print(
            f"before: driver merges {args.files:,} files: {before['cpu_s']:.1f} s CPU, peak RSS {before['peak_rss_mib']} MiB",
            flush=True,
        )

        plan_cpu, levels, final = driver_planning(paths)
        types, _ = declared(template)
        spec = SimpleNamespace(root=str(root), stage_types=types)
        per_level = []
        for level, tasks in enumerate(levels, start=1):
            cpus = []
            for t in tasks:
                cpu = time.process_time()
                merge_aggregates(spec, level, t.span.start, t.span.stop, t.inputs)  # type: ignore[arg-type]
                cpus.append(time.process_time() - cpu)
            largest = max(tasks, key=lambda t: len(t.inputs))
            fresh = _child(
                "task",
                {**common, "level": level, "first": largest.span.start, "end": largest.span.stop, "inputs": list(largest.inputs)},
            )
            per_level.append(
                {
                    "level": level,
                    "tasks": len(tasks),
                    "max_inputs": max(len(t.inputs) for t in tasks),
                    "cpu_total_s": round(sum(cpus), 2),
                    "cpu_max_s": round(max(cpus), 3),
                    "largest_task_peak_rss_mib": fresh["peak_rss_mib"],
                    "largest_task_held_mib": fresh["held_mib"],
                    "largest_task_cpu_s": fresh["cpu_s"],
                }
            )
            print(f"after: level {level}: {json.dumps(per_level[-1])}", flush=True)
        after = _child("final", {**common, "paths": final})
        print(
            f"after: driver plans {len(levels)} levels in {plan_cpu:.3f} s CPU and merges {len(final)} files: "
            f"{after['cpu_s']:.2f} s CPU, peak RSS {after['peak_rss_mib']} MiB",
            flush=True,
        )
        limited = {a.table for a in declared(template)[1] if a.limit is not None}
        differ = sorted(n for n in before["tables"] if before["tables"][n] != after["tables"][n])
        assert not set(differ) - limited, f"tables differ: {differ}"
        by_table = {a.table: a for a in declared(template)[1]}
        agreement = {n: _agreement(by_table[n], before["tables"][n], after["tables"][n]) for n in sorted(limited)}
        print(f"limited lists, tree against serial: {json.dumps(agreement)}", flush=True)
        result = {
            "files": args.files,
            "variants": args.variants,
            "lines_per_file": args.lines,
            "fan_in": aggregate_tree.FAN_IN,
            "before": {k: v for k, v in before.items() if k != "tables"},
            "after": {
                "driver_planning_cpu_s": round(plan_cpu, 3),
                "driver_final_files": len(final),
                "driver_final": {k: v for k, v in after.items() if k != "tables"},
                "levels": per_level,
            },
            "tables_equal": sorted(set(before["tables"]) - set(differ)),
            "limited_lists_differ": differ,
            "limited_lists_agreement": agreement,
            "driver_cpu_ratio": round(before["cpu_s"] / (after["cpu_s"] + plan_cpu), 1),
        }
        return result


if __name__ == "__main__":
    main()
