"""The driver's end of a run (counts, stats.duckdb, conservation check), and `explain` of one id, timed
on a finished run folder: this checkout's code against another's (e.g. main's), interleaved.

    python -m bench.perf.end_of_run RUN PIPELINE.yaml --baseline /work/main [--repeat 2]

Each measurement is a fresh process running only ``collect_counts``, ``build_stats`` and
``check_conservation`` of that checkout (its stats.duckdb replaces the run's; the last one written
is this checkout's), reporting wall seconds and the process's peak RSS above what it held before
the step (its imports, the plan). Then `explain` of one id (a rejected one from the middle of
the run) with this checkout's code: wall seconds and how many Parquet files it registered, of
how many the run has.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench._support.paths import ROOT

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from datapipe.engine.finish import build_stats, check_conservation, collect_counts
from datapipe.engine.plan import make_spec
from datapipe.pipeline.load import load_pipeline
from datapipe.run_folder.layout import RunFolder
from datapipe.storage.cache import cache_dir
root, pipeline = Path(sys.argv[1]), load_pipeline(Path(sys.argv[2]))
folder = RunFolder(root)
run = json.loads(folder.run_json.read_text())
spec = make_spec(pipeline, folder.root, cache_dir(), run["split"]["target_bytes"])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t, cpu = time.perf_counter(), time.process_time()
counts = collect_counts(folder, spec)
build_stats(folder, spec, counts)
check_conservation(folder, counts)
wall, cpu = time.perf_counter() - t, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "peak_rss_mib": round(peak / 1024),
                  "rss_before_mib": round(before / 1024),
                  "stats_mib": round(folder.stats_db.stat().st_size / 2**20, 1)}))
"""

EXPLAIN = r"""
import io, json, sys, time
from pathlib import Path
import pyarrow.dataset as ds
root, doc_id = Path(sys.argv[1]), sys.argv[2]
counted = []
try:  # this checkout: count the files explain registers
    from datapipe.audit import documents
    original = documents.attach
    documents.attach = lambda con, r, only_id=None: counted.append(original(con, r, only_id=only_id)) or counted[-1]
except ImportError:  # before: documents was a table
    pass
from datapipe.audit.explain import explain
t, cpu = time.perf_counter(), time.process_time()
out = io.StringIO()
explain(root, doc_id, out)
wall, cpu = time.perf_counter() - t, time.process_time() - cpu
assert doc_id in out.getvalue()
files = len(list((root / "docs").rglob("*.parquet")) + list((root / "rejected").rglob("*.parquet")))
print(json.dumps({"explain_s": round(wall, 3), "explain_cpu_s": round(cpu, 3), "files_read": counted[0] if counted else "table",
                  "files": files}))
"""


def some_id(run: Path) -> str:
    """An id from the middle of the middle rejected file (read with pyarrow: any checkout's run)."""
    import pyarrow.parquet as pq

    files = sorted((run / "rejected").rglob("*.parquet"))
    ids = pq.read_table(files[len(files) // 2], columns=["id"])["id"].to_pylist()
    return str(ids[len(ids) // 2])


def child(code: str, pythonpath: str, *args: str) -> dict[str, float]:
    # Run from that checkout: `python -c` puts the working folder first on sys.path.
    env = {**os.environ, "PYTHONPATH": pythonpath}
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=pythonpath, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("pipeline", type=Path)
    ap.add_argument("--baseline", required=True, help="the checkout to compare with (its root)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    ours = str(ROOT)
    doc_id = some_id(args.run)
    for i in range(args.repeat):
        for name, path in (("baseline", args.baseline), ("this", ours)):
            end = child(CHILD, path, str(args.run), str(args.pipeline))
            shown = child(EXPLAIN, path, str(args.run), doc_id)
            print(f"{name:>8} #{i + 1}: end of run {end}; explain {doc_id}: {shown}", flush=True)


if __name__ == "__main__":
    main()
