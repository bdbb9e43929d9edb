"""What a map task's aggregate file costs (``audit.aggregates.task_aggregates``): before and now.

    python -m bench.perf.task_aggregates --repeats 5 --calls 50 --json bench/results/task_aggregates.json

Runs the demo pipeline (pipelines/demo.yaml, in process, into a temporary folder; or ``--run`` an existing
run folder) and takes the kept and rejected files each of its map tasks wrote (their markers'
``audit_files``). Then, interleaved per repeat, it computes every task's aggregates ``--calls`` times in
this process both ways and divides the process CPU seconds by the calls:

- before: a DuckDB connection opened per task and one query per aggregate, each reading the task's files
  again (the code before this bench, kept below as ``before``);
- now: this tree's ``task_aggregates`` (the worker's connection, every aggregate in one statement).

It checks first that both give the same rows for every task (the order of a task's rows was never fixed
before; it is now), and prints the CPU per task call, the ratio before / now, and the documents per task.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import ROOT
from datapipe.audit import aggregates
from datapipe.stages.report_section import literal


def before(files: Sequence[tuple[Path, str]], stage_types: Iterable[Any]) -> pa.Table | None:
    """``task_aggregates`` as it was: a connection per call, a query per aggregate over a view of the files."""
    import duckdb

    if not files:
        return None
    columns = {"status"}
    for path, _ in files:
        columns.update(pq.read_schema(path).names)
    aggs = aggregates.run_aggregates(stage_types, columns)
    schema = aggregates.file_schema(aggs)
    by_status: dict[str, list[str]] = {}
    for path, status in files:
        by_status.setdefault(status, []).append(literal(str(path)))
    with duckdb.connect(config={"threads": aggregates.TASK_THREADS, "memory_limit": aggregates.TASK_MEMORY}) as con:
        con.execute("SET enable_progress_bar = false")
        parts = [
            f"SELECT *, {literal(status)} AS status FROM read_parquet([{', '.join(paths)}], union_by_name = true)"
            for status, paths in sorted(by_status.items())
        ]
        con.execute(f"CREATE TEMP VIEW task_documents AS {' UNION ALL BY NAME '.join(parts)}")
        tables = [con.sql(aggregates._select(agg, "task_documents")).to_arrow_table() for agg in aggs]
    return aggregates._as_file(tables, schema)


def tasks_of(run: Path) -> list[list[tuple[Path, str]]]:
    """The (path, status) of the files each map task of ``run`` wrote, from its markers."""
    out = []
    for marker in sorted((run / "_work" / "markers").glob("map*/**/*.json")):
        files = json.loads(marker.read_text())["audit_files"]
        if files:
            out.append([(run / f["path"], f["status"]) for f in files])
    return out


def rows(table: pa.Table | None) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in (table.to_pylist() if table is not None else []))


def demo_run(to: Path) -> Path:
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    run_pipeline(
        load_pipeline(ROOT / "pipelines" / "demo.yaml"), output=to, in_process=True, show_progress=False, log=lambda m: None
    )
    return to


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, help="a finished run folder (default: run the demo into a temporary folder)")
    ap.add_argument("--calls", type=int, default=50, help="calls per task and side in each repeat (default 50)")
    add_args(ap, repeats=5)
    args = ap.parse_args()
    h = Harness("perf/task_aggregates", args, libs=["duckdb"], note="process CPU per map task's aggregates, before vs now")
    with tempfile.TemporaryDirectory(prefix="task-aggregates-") as tmp:
        run = args.run or demo_run(Path(tmp) / "demo")
        tasks = tasks_of(run)
        if not tasks:
            raise SystemExit(f"{run}: no map task wrote documents")
        types = aggregates.stage_types(json.loads((run / "run.json").read_text()))
        for files in tasks:
            if rows(before(files, types)) != rows(aggregates.task_aggregates(files, types)):
                raise SystemExit(f"the aggregate rows differ for the task of {files[0][0]}")
        again = [aggregates.task_aggregates(files, types) for files in tasks]
        stable = all(a is not None and a.equals(aggregates.task_aggregates(f, types)) for a, f in zip(again, tasks))
        docs = [sum(pq.read_metadata(p).num_rows for p, _ in files) for files in tasks]

        def side(fn: Any) -> Any:
            def cpu_ms_per_call() -> float:
                t0 = time.process_time()
                for _ in range(args.calls):
                    for files in tasks:
                        fn(files, types)
                return (time.process_time() - t0) * 1000 / (args.calls * len(tasks))

            return cpu_ms_per_call

        got = h.interleave({"before": side(before), "now": side(aggregates.task_aggregates)}, warmup=True)
        print(f"{len(tasks)} map tasks, {min(docs)}-{max(docs)} documents each, {args.calls} calls per task and side per repeat")
        h.figure("before: CPU per task's aggregates", got["before"], "ms")
        h.figure("now: CPU per task's aggregates", got["now"], "ms")
        h.ratio("before / now (CPU per task)", pair_ratios(got["before"], got["now"]))
        print(f"same rows for every task: yes; the same file on every call now: {'yes' if stable else 'no'}")
        h.finish(tasks=len(tasks), documents_per_task=docs, calls=args.calls, same_rows=True, stable_now=stable)


if __name__ == "__main__":
    main()
