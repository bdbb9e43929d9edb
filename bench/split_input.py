"""Does one large JSONL keep every core busy? Map-phase CPU seconds / wall seconds, split vs not.

    PYTHONPATH=. python bench/split_input.py --gb 2 --cpus 2

Writes a JSONL of about --gb GB in a temporary folder (deleted afterwards) from the real corpus
(../shared/data/corpus), each copy of a line perturbed (a copy number put in front of the text, so
no two documents are the same), then runs a light pipeline (langid + length) through the real
engine on a local Ray with --cpus CPUs twice: once as one task (the file as one piece: what
datapipe did before inputs were split) and once with the default ``split:`` settings (the target
shrunk to give 3 tasks per CPU). Utilisation = CPU seconds of the tasks (their markers' ``cpu_seconds``:
process CPU of each task, newline pre-pass included) / wall seconds of those phases (run.json
timings). 1.0 means one busy core; the ideal is --cpus. On a machine shared with other work the
ratio is capped by what the OS gives us: the script prints the load average next to it, and
also the tasks running on average (task wall seconds / phase wall seconds), which does not
depend on the load: it says whether every CPU was given work. The split run goes first (it is
the figure that matters; the one-task run takes --cpus times longer), and ``--json PATH`` writes
what has been measured after each run, with the load averages before and after it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "data" / "corpus"
FILES = ("en_wikipedia.jsonl", "zh_wikipedia.jsonl", "zh_pingcap_docs.jsonl", "zh_oiwiki.jsonl")


def write_corpus(path: Path, target_bytes: int, corpus: Path) -> tuple[int, int]:
    lines = [line for name in FILES for line in (corpus / name).read_bytes().splitlines() if line.strip()]
    written = docs = 0
    copy = 0
    with path.open("wb", buffering=8 << 20) as f:
        while written < target_bytes:
            tag = f"{copy} ".encode()
            for line in lines:
                obj_start = line.find(b'"text": "')
                out = line[:obj_start + 9] + tag + line[obj_start + 9:] if obj_start >= 0 else line
                f.write(out + b"\n")
                written += len(out) + 1
                docs += 1
                if written >= target_bytes:
                    break
            copy += 1
    return written, docs


def run_once(folder: Path, data: Path, split: dict, cpus: int) -> dict[str, float]:
    import yaml

    from datapipe.config import load_pipeline
    from datapipe.engine.runner import run_pipeline

    config = {"name": "bench", "sources": [{"name": "big", "paths": [str(data)]}],
              "stages": [{"langid": {"keep": ["zh", "en"], "min_score": 0.3}}, {"length": {"min_chars": 50}}],
              "split": split}
    out = folder / f"out-{len(list(folder.glob('out-*')))}"
    (folder / "p.yaml").write_text(yaml.safe_dump(config))
    started = time.perf_counter()
    result = run_pipeline(load_pipeline(folder / "p.yaml"), output=out, num_cpus=cpus, show_progress=False,
                          log=lambda m: None)
    total = time.perf_counter() - started
    phases = [p for p in ("lines", "map0") if p in result.run["timings"]]
    wall = sum(result.run["timings"][p] for p in phases)
    markers = [json.loads(m.read_text()) for p in phases for m in (out / "_work" / "markers" / p).glob("**/*.json")]
    cpu = sum(m.get("cpu_seconds", 0.0) for m in markers)
    busy = sum(m.get("seconds", 0.0) for m in markers)  # task wall seconds: tasks running on average = busy / wall
    shutil.rmtree(out)
    return {"tasks": result.run["split"]["map_tasks"], "map_wall": wall, "map_cpu": cpu, "run_wall": total,
            "phase_wall": {p: result.run["timings"][p] for p in phases},
            "concurrency": busy / wall,
            "docs": result.run["counts"]["documents"]}


def _commit() -> str:
    import subprocess

    done = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.0, help="size of the generated JSONL in GB (default 2)")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs Ray may use (default 2)")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--tmp", type=Path, default=None, help="where to write the corpus (default: system temp)")
    ap.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args()
    if not args.corpus.is_dir():
        sys.exit(f"corpus not found: {args.corpus}")
    folder = Path(tempfile.mkdtemp(prefix="datapipe-split-bench-", dir=args.tmp))
    try:
        data = folder / "big.jsonl"
        t = time.perf_counter()
        size, docs = write_corpus(data, int(args.gb * 1e9), args.corpus)
        print(f"corpus: {size / 1e9:.2f} GB, {docs:,} documents, written in {time.perf_counter() - t:.0f} s")
        rows: dict[str, dict] = {}
        report = {"bench": "split_input", "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                  "cores": os.cpu_count(), "argv": sys.argv[1:], "git_commit": _commit(),
                  "corpus_bytes": size, "corpus_docs": docs,
                  "runs": rows}
        for label, split in (("split (defaults)", {}),
                             ("one task (unsplit)", {"target_bytes": 1 << 40, "min_tasks_per_cpu": 0})):
            load = os.getloadavg()[0]
            before = os.getloadavg()
            r = run_once(folder, data, split, args.cpus)
            r.update({"cpu_per_wall": r["map_cpu"] / r["map_wall"], "loadavg_before": before,
                      "loadavg_after": os.getloadavg()})
            rows[label] = r
            if args.json:
                args.json.write_text(json.dumps(report, indent=1) + "\n")
            print(f"{label:20s} tasks={r['tasks']:4d}  map wall={r['map_wall']:7.1f} s  map CPU={r['map_cpu']:7.1f} s  "
                  f"CPU/wall={r['map_cpu'] / r['map_wall']:.2f}  "
                  f"tasks running on average={r['concurrency']:.2f}  (run {r['run_wall']:.0f} s, "
                  f"load average before {load:.1f} on {os.cpu_count()} cores)")
        a, b = rows["one task (unsplit)"], rows["split (defaults)"]
        assert a["docs"] == b["docs"]
        print(f"utilisation: {b['map_cpu'] / b['map_wall']:.2f} split vs {a['map_cpu'] / a['map_wall']:.2f} unsplit "
              f"(ideal {args.cpus}); map wall speed-up {a['map_wall'] / b['map_wall']:.2f}x")
        if args.json:
            report["map_wall_speedup"] = a["map_wall"] / b["map_wall"]
            args.json.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
