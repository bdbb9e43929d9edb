"""What one crawl-sized MinHash decisions merge task (``merge1d``) costs: its real code on inputs built
at crawl proportions, CPU seconds counted (issue 30).

    python -m bench.scaling.merge_task [--scale bench/results/scale.json] [--files 8,16,32] \\
        [--json bench/results/merge_task.json]

bench/scaling/scale.py's merge1d tasks are tiny (36 ms on average at 16x), so the per-document and
largest / mean figures it gives are its fixed costs. Here:

1. **Rows per document, by kind and round**, measured: a small real run in process (zh/en Wikipedia,
   10% planted copies, exact dedup + MinHash, bench/scaling/shuffle_files.py's corpus) gives the rows of
   MinHash's partition outputs (decisions, states, copies) per round and their ratio to each other;
   bench/scaling/scale.py's 16x run gives the decisions per document at the bench corpus' proportions
   (``--scale``: MinHash's rejected / documents).
2. **The crawl's outputs**: 4,096 partitions of 5B documents, 25 planned rounds, 37,253 shards;
   each partition output holds its round's rows per document x 1.22M documents, its rows the small
   run's rows repeated, their shards drawn uniformly over the crawl's shards, written as a partition
   writes them (sorted by shard, row groups of 32,768 rows).
3. **The task**: ``merge.merge_by_shard`` (what ``merge.merge_outputs`` runs for each kind) over
   ``--files`` such outputs of each kind, for one of a group's 8 ranges of shards, its output split
   by key range as the code writes it. Timed as process CPU; per file of each kind (one output of
   each kind), fitted ``CPU = a + b x files`` over the ``--files`` sizes.
4. **The tasks' sizes**: the crawl's outputs are cut into ``split.shuffle_groups`` (256) groups by
   ``merge.output_bounds`` (by rows, the code now) and by count (1/G of the planned outputs each,
   the code before); each task's CPU is ``a + b x`` its files' share, the straggler is the largest
   / mean task.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from bench._support.harness import environment
from bench._support.paths import ROOT
from bench.scaling.shuffle_files import _texts, write_corpus
from datapipe.engine.tasks import merge
from datapipe.engine.tasks.reduce import write_or_remove
from datapipe.engine.work_files import OUTPUT_KINDS

DOCS = 5_000_000_000
PARTITIONS = 4096
SHARDS = 37_253  # map tasks of 256 MiB over 10 TB (bench/scaling/cost_model.py)
GROUPS = 256  # split.shuffle_groups of the estimate
ROUNDS = 25  # MinHash's planned rounds (stages/minhash.py, rounds())


def small_run(work: Path, files: int, per_file: int) -> dict[str, Any]:
    """A real run in process; MinHash's partition outputs: rows by (kind, round), and the tables."""
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    texts = _texts(files * per_file)
    docs = write_corpus(work / "in", files, per_file, texts)
    config = {
        "name": "merge-task",
        "sources": [{"name": "wiki", "kind": "text", "paths": [str(work / "in" / "*.jsonl")]}],
        "stages": [{"dedup": {"exact": True, "partitions": files}}, {"minhash": {"threshold": 0.7, "partitions": files}}],
        "split": {"target_bytes": 1 << 30, "min_tasks_per_cpu": 0, "group_small_files": False, "shuffle_groups": 0},
    }
    (work / "p.yaml").write_text(yaml.safe_dump(config))
    out = work / "out"
    run_pipeline(load_pipeline(work / "p.yaml"), output=out, show_progress=False, log=lambda _: None, in_process=True)
    parts = out / "_work" / "reduce1-parts"
    rows: dict[str, dict[int, int]] = {k: {} for k in OUTPUT_KINDS}
    tables: dict[str, list[pa.Table]] = {k: [] for k in OUTPUT_KINDS}
    for f in sorted(parts.glob("*.parquet")):
        # <partition> and r<round>-<partition> (decisions), state-r<round>-..., copies-r<round>-...
        *head, _partition = f.stem.split("-")
        kind = head[0] if head and head[0] in ("state", "copies") else "decisions"
        r = int(head[-1][1:]) if head and head[-1].startswith("r") else 0
        t = pq.read_table(f)
        rows[kind][r] = rows[kind].get(r, 0) + t.num_rows
        tables[kind].append(t)
    return {"docs": docs, "rows": rows, "tables": {k: pa.concat_tables(v) for k, v in tables.items() if v}}


def crawl_output(template: pa.Table, rows: int, rng: np.random.Generator, tag: int) -> pa.Table:
    """``rows`` rows like ``template``'s (repeated), shards uniform over the crawl's, ids made distinct."""
    idx = np.arange(rows) % template.num_rows
    t = template.take(pa.array(idx))
    t = t.set_column(t.schema.get_field_index("shard"), "shard", pa.array(rng.integers(0, SHARDS, rows).astype(np.int32)))
    if "id" in t.column_names:
        ids = [f"{s}~{tag}.{i}" for i, s in enumerate(t["id"].to_pylist())]
        t = t.set_column(t.schema.get_field_index("id"), "id", pa.array(ids, pa.string()))
    return t


def time_task(files: dict[str, list[Path]], rng_index: int, out: Path) -> dict[str, float]:
    """One range task of one group: merge_by_shard per kind, as merge_outputs runs it. CPU s, rows."""
    shards = range(-(-rng_index * SHARDS // 8), -(-(rng_index + 1) * SHARDS // 8))
    cpu, rows_out, rows_in = 0.0, 0, 0
    for kind, paths in files.items():
        sources = [pq.ParquetFile(p) for p in paths]
        rows_in += sum(s.metadata.num_rows for s in sources)
        t = time.process_time()
        rows_out += merge.merge_by_shard(
            sources, lambda k, kind=kind: out / f"{kind}-{k}.parquet", shards, merge.key_files(len(shards))
        )
        cpu += time.process_time() - t
    for f in out.glob("*.parquet"):
        f.unlink()
    return {"cpu_s": cpu, "rows_out": rows_out, "rows_in_files": rows_in}


def task_sizes(mt: dict[str, Any], groups: int, by_rows: bool = True) -> dict[str, Any]:
    """The crawl's decisions merge tasks at ``split.shuffle_groups: groups``: the outputs (in reading
    order: round, then partition; rows where the measured run's rounds wrote them) cut by rows
    (``merge.output_bounds``, the code) or by count (1/G of the planned outputs, before), 8 ranges a
    group; each task's CPU = the fitted part per task + per row x its rows; the straggler is the
    largest / mean task."""
    rows_per_output = sum(mt["rows_per_output"].values())
    share = {int(r): v for r, v in mt["decisions_by_round"].items()}
    weights = [share.get(r, 0.0) * rows_per_output for r in range(ROUNDS) for _ in range(PARTITIONS)]
    if by_rows:
        bounds = merge.output_bounds([w + merge.FILE_ROWS * 3 * (w > 0) for w in weights], groups)
    else:
        bounds = [len(weights) * g // groups for g in range(groups + 1)]
    files = [sum(1 for w in weights[lo:hi] if w > 0) for lo, hi in zip(bounds[:-1], bounds[1:])]
    rows = [sum(weights[lo:hi]) / 8 for lo, hi in zip(bounds[:-1], bounds[1:])]  # per range task
    fit = mt["fit"]
    cpu = [fit["task_s"] + fit["per_row_us"] * 1e-6 * r for r in rows]
    mean = float(np.mean(cpu))
    return {
        "groups": groups,
        "files_per_group_max": max(files),
        "groups_with_rows": sum(1 for f in files if f),
        "rows_per_task_max": max(rows),
        "rows_per_task_mean": float(np.mean(rows)),
        "task_cpu_s_mean": mean,
        "task_cpu_s_max": max(cpu),
        "straggler": max(cpu) / mean,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=Path, default=ROOT / "bench/results/scale.json")
    ap.add_argument("--files", default="8,16,32", help="partition outputs of each kind a measured task reads")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    scale = json.loads(a.scale.read_text())["extra"]["scales"][-1]
    minhash = next(s for s in scale["stage_counts"] if s["stage"] == "minhash")
    decisions_per_doc = sum(minhash["rejected"].values()) / scale["docs"]
    rng = np.random.default_rng(30)
    with tempfile.TemporaryDirectory(prefix="merge-task-") as tmp:
        work = Path(tmp)
        run = small_run(work / "run", 4, 250)
        dec = sum(run["rows"]["decisions"].values())
        ratio = {k: sum(run["rows"][k].values()) / dec for k in OUTPUT_KINDS}
        share = {r: n / dec for r, n in run["rows"]["decisions"].items()}  # decisions by round
        per_doc = {k: decisions_per_doc * ratio[k] for k in OUTPUT_KINDS}
        docs_per_partition = DOCS / PARTITIONS
        per_output = {k: docs_per_partition * per_doc[k] for k in OUTPUT_KINDS}  # rows of one output, its round
        print(
            f"decisions per document {decisions_per_doc:.4f} (scale.json, {scale['scale']}x); by kind / decisions: "
            f"{ratio}; decisions by round {share}; rows per crawl output of the busy round {per_output}",
            flush=True,
        )
        # Crawl-sized outputs of the round holding the rows, as a partition writes them.
        sizes = [int(s) for s in a.files.split(",")]
        made: dict[str, list[Path]] = {k: [] for k in OUTPUT_KINDS}
        for k in OUTPUT_KINDS:
            for i in range(max(sizes)):
                path = work / "in" / f"{k}-{i}.parquet"
                path.parent.mkdir(exist_ok=True)
                n = int(rng.binomial(int(docs_per_partition), per_doc[k]))
                write_or_remove(path, crawl_output(run["tables"][k], n, rng, i), sort_by_shard=True)
                made[k].append(path)
        out = work / "out"
        out.mkdir()
        measured = []
        for rep in range(a.repeats):
            for n in sizes:
                for j in (0, 3, 7):
                    got = time_task({k: v[:n] for k, v in made.items()}, j, out)
                    measured.append({"files": n, "range": j, "repeat": rep, **got})
                    print(json.dumps(measured[-1]), flush=True)
        peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # CPU = a + b x files (each file: one output of each kind), least squares over every measurement.
    x = np.array([m["files"] for m in measured], float)
    y = np.array([m["cpu_s"] for m in measured])
    b, a0 = np.polyfit(x, y, 1)
    a0 = max(0.0, float(a0))
    rows_per_file = sum(per_output.values())
    per_row_us = b / rows_per_file * 1e6
    fit = {"task_s": a0, "per_file_s": b, "per_row_us": per_row_us}
    designs = {}
    for groups in (64, GROUPS):
        for by_rows in (True, False):
            name = f"{'by_rows' if by_rows else 'by_outputs'}@{groups}"
            designs[name] = task_sizes({"fit": fit, "rows_per_output": per_output, "decisions_by_round": share}, groups, by_rows)
            print(name, json.dumps(designs[name]), flush=True)
    result = {
        "bench": "merge_task",
        "env": environment(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "crawl": {"docs": DOCS, "partitions": PARTITIONS, "shards": SHARDS, "groups": GROUPS, "rounds": ROUNDS, "ranges": 8},
        "decisions_per_doc": decisions_per_doc,
        "rows_per_doc": per_doc,
        "decisions_by_round": share,
        "rows_per_output": per_output,
        "measured": measured,
        "fit": fit,
        "peak_rss_mib": peak_rss_mib,
        "designs": designs,
        "keys_per_file": merge.KEYS_PER_FILE,
    }
    print(f"fit: {a0:.3f} s + {b:.3f} s per file of each kind ({per_row_us:.2f} us per row); peak RSS {peak_rss_mib:.0f} MiB")
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
