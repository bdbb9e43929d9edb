"""How many files, and how many bytes of them, `datapipe explain RUN ID` reads: bounded, or growing with the run?

    python -m bench.scaling.explain_files RUN [RUN ...] [--ids 5] [--survivors 3] [--json bench/results/explain_files.json]

For each run folder (bench/scaling/scale.py --keep leaves one per scale), ``--ids`` document ids spread over
the run (the first row of kept files spread evenly over ``docs/``) and ``--survivors`` kept documents
that have copies (spread over them in id order) are explained, each by
``datapipe explain RUN ID`` under ``strace -f -e trace=openat,read,pread64,readv,preadv,close``. Counted per
id: the files under the run folder it opened (``stats.duckdb`` apart from the documents' Parquet
files) and the bytes it read from them (the read calls on those files' descriptors), against the
run's own number of document files and their bytes. `explain` registers only the files whose recorded
id range holds the id (audit/documents.py), and lists a kept document's copies from the copies index
files (``copies/``) whose recorded ``dup_of`` range holds it, so the count should not grow with the run.
Counted apart: the files read for the row, the reject files with a ``dup_of`` column (a run from
before the copies index scanned them for the copies) and the copies index files.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CALL = re.compile(r"^(\d+)\s+(openat|read|pread64|readv|preadv|close)\((.*)\)\s+=\s+(-?\d+)")
PATH = re.compile(r'^[^,]+, "([^"]+)"')


def sample_ids(run: Path, n: int) -> list[str]:
    """The first id of ``n`` kept files spread evenly over the run's docs/ (sorted by path)."""
    import pyarrow.parquet as pq

    files = sorted((run / "docs").rglob("*.parquet"))
    if not files:
        raise SystemExit(f"{run}: no docs/*.parquet")
    picks = sorted({round(i * (len(files) - 1) / max(1, n - 1)) for i in range(n)})
    return [pq.read_table(files[i], columns=["id"]).column("id")[0].as_py() for i in picks]


def sample_survivors(run: Path, n: int) -> list[str]:
    """``n`` kept documents some dropped copy names as its survivor (``dup_of``), spread over them by id."""
    from datapipe.audit.sql import run_query

    ids = run_query(
        run,
        "select distinct d.dup_of as id from documents d join documents k on k.id = d.dup_of "
        "where d.dup_of is not null and k.status = 'kept' order by 1",
    )["id"].to_pylist()
    if not ids or n <= 0:
        return []
    return [ids[i] for i in sorted({round(i * (len(ids) - 1) / max(1, n - 1)) for i in range(n)})]


def trace_explain(run: Path, doc_id: str, work: Path) -> dict[str, Any]:
    trace = work / "explain.trace"
    cmd = ["strace", "-f", "-qq", "-e", "trace=openat,read,pread64,readv,preadv,close", "-o", str(trace)]
    cmd += [sys.executable, "-m", "datapipe.cli", "explain", str(run), doc_id]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"explain {doc_id} failed:\n{done.stderr[-2000:]}")
    prefix = str(run.resolve()) + "/"
    fds: dict[int, str] = {}  # one process: its threads share the descriptor table
    opened: set[str] = set()
    opens = 0
    read: dict[str, int] = {}
    for line in trace.read_text(errors="replace").splitlines():
        m = CALL.match(line)
        if not m:
            continue
        call, args, ret = m.group(2), m.group(3), int(m.group(4))
        if call == "openat":
            p = PATH.match(args)
            if p and ret >= 0 and p.group(1).startswith(prefix) and not p.group(1).endswith("/"):
                rel = p.group(1)[len(prefix) :]
                if "O_DIRECTORY" in args:
                    continue
                fds[ret] = rel
                opened.add(rel)
                opens += 1
            elif ret >= 0:
                fds.pop(ret, None)
            continue
        fd = int(args.split(",", 1)[0])
        if call == "close":
            fds.pop(fd, None)
        elif fd in fds and ret > 0:
            read[fds[fd]] = read.get(fds[fd], 0) + ret
    trace.unlink()
    docs = {f for f in opened if f.endswith(".parquet")}
    # The document's own row: the files whose id range holds it; the copies of a kept document
    # (explain's `dup_of = id` listing): the copies index files of the survivor's task (copies/), or
    # in a run without them every reject file that has a dup_of column.
    copies = {f for f in docs if f.startswith("copies/")}
    dup_files = {f for f in docs - copies if re.search(r"-(dedup|minhash|semantic)\.parquet$", f)}
    return {
        "dup_files_opened": len(dup_files),
        "copies_files_opened": len(copies),
        "row_files_opened": len(docs - dup_files - copies),
        "id": doc_id,
        "files_opened": len(opened),
        "opens": opens,
        "parquet_files_opened": len(docs),
        "bytes_read": sum(read.values()),
        "parquet_bytes_read": sum(v for k, v in read.items() if k.endswith(".parquet")),
        "other_files": sorted(opened - docs),
    }


def measure(run: Path, n: int, survivors: int) -> dict[str, Any]:
    files = [p for d in ("docs", "rejected") for p in (run / d).rglob("*.parquet")]
    with tempfile.TemporaryDirectory(prefix="explain-files-") as tmp:
        picked = sample_ids(run, n) + sample_survivors(run, survivors)
        per_id = [trace_explain(run, i, Path(tmp)) for i in dict.fromkeys(picked)]
    out = {
        "run": str(run),
        "documents": json.loads((run / "run.json").read_text())["counts"]["documents"],
        "document_files": len(files),
        "document_bytes": sum(p.stat().st_size for p in files),
        "ids": per_id,
    }
    out["dup_files"] = sum(1 for p in files if re.search(r"-(dedup|minhash|semantic)\.parquet$", p.name))
    out["copies_files"] = sum(1 for _ in (run / "copies").rglob("*.parquet"))
    for key in (
        "files_opened",
        "parquet_files_opened",
        "row_files_opened",
        "dup_files_opened",
        "copies_files_opened",
        "bytes_read",
        "parquet_bytes_read",
    ):
        vals = [r[key] for r in per_id]
        out[key] = {"median": statistics.median(vals), "max": max(vals), "min": min(vals)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="run folders (e.g. bench/scaling/scale.py --keep's dp-out of each scale)")
    ap.add_argument("--ids", type=int, default=5, help="ids explained per run (default 5)")
    ap.add_argument("--survivors", type=int, default=3, help="kept documents with copies explained per run too (default 3)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    results = [measure(r, a.ids, a.survivors) for r in a.runs]
    print(
        "| run | documents | document files (with dup_of) | copies index files | files opened per explain (parquet: "
        "row lookup, reject files with dup_of, copies index) | bytes read (parquet) |"
    )
    print("|---|---|---|---|---|---|")
    for r in results:
        f, b, pb = r["files_opened"], r["bytes_read"], r["parquet_bytes_read"]
        row, dup, cop = r["row_files_opened"], r["dup_files_opened"], r["copies_files_opened"]
        print(
            f"| {r['run']} | {r['documents']:,} | {r['document_files']:,} ({r['dup_files']}) | {r['copies_files']:,} | "
            f"{f['min']}-{f['max']} ({row['min']}-{row['max']}, {dup['min']}-{dup['max']}, {cop['min']}-{cop['max']}) | "
            f"{b['min']:,}-{b['max']:,} ({pb['min']:,}-{pb['max']:,}) |"
        )
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
