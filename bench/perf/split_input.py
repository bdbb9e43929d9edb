"""Does one large JSONL keep every core busy? Map-phase CPU seconds / wall seconds, split vs not.

    python -m bench.perf.split_input --gb 2 --cpus 2

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
depend on the load: it says whether every CPU was given work. The split run goes first in each
repeat (it is the figure that matters; the one-task run takes --cpus times longer; ``--split-only``
skips it); ``--json PATH`` writes the bench harness's JSON (machine, load, figures, ratios).
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

from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import SHARED

CORPUS = SHARED / "corpus"
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
                out = line[: obj_start + 9] + tag + line[obj_start + 9 :] if obj_start >= 0 else line
                f.write(out + b"\n")
                written += len(out) + 1
                docs += 1
                if written >= target_bytes:
                    break
            copy += 1
    return written, docs


def run_once(folder: Path, data: Path, split: dict, cpus: int) -> dict[str, float]:
    import yaml

    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    config = {
        "name": "bench",
        "sources": [{"name": "big", "paths": [str(data)]}],
        "stages": [{"langid": {"keep": ["zh", "en"], "min_score": 0.3}}, {"length": {"min_chars": 50}}],
        "split": split,
    }
    out = folder / f"out-{len(list(folder.glob('out-*')))}"
    (folder / "p.yaml").write_text(yaml.safe_dump(config))
    started = time.perf_counter()
    result = run_pipeline(load_pipeline(folder / "p.yaml"), output=out, num_cpus=cpus, show_progress=False, log=lambda m: None)
    total = time.perf_counter() - started
    phases = [p for p in ("lines", "map0") if p in result.run["timings"]]
    wall = sum(result.run["timings"][p] for p in phases)
    markers = [json.loads(m.read_text()) for p in phases for m in (out / "_work" / "markers" / p).glob("**/*.json")]
    cpu = sum(m.get("cpu_seconds", 0.0) for m in markers)
    busy = sum(m.get("seconds", 0.0) for m in markers)  # task wall seconds: tasks running on average = busy / wall
    shutil.rmtree(out)
    return {
        "tasks": result.run["split"]["map_tasks"],
        "map_wall": wall,
        "map_cpu": cpu,
        "run_wall": total,
        "phase_wall": {p: result.run["timings"][p] for p in phases},
        "concurrency": busy / wall,
        "docs": result.run["counts"]["documents"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.0, help="size of the generated JSONL in GB (default 2)")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs Ray may use (default 2)")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--tmp", type=Path, default=None, help="where to write the corpus (default: system temp)")
    ap.add_argument(
        "--split-only",
        action="store_true",
        help="skip the one-task run (it takes --cpus times longer; the acceptance figure is the split run's)",
    )
    add_args(ap, repeats=1)
    args = ap.parse_args()
    if not args.corpus.is_dir():
        sys.exit(f"corpus not found: {args.corpus}")
    h = Harness("split_input", args, libs=["ray"], note=f"{args.gb} GB JSONL, langid + length, {args.cpus} CPUs")
    folder = Path(tempfile.mkdtemp(prefix="datapipe-split-bench-", dir=args.tmp))
    try:
        data = folder / "big.jsonl"
        t = time.perf_counter()
        size, docs = write_corpus(data, int(args.gb * 1e9), args.corpus)
        print(f"corpus: {size / 1e9:.2f} GB, {docs:,} documents, written in {time.perf_counter() - t:.0f} s")
        runs = {"split (defaults)": {}}
        if not args.split_only:
            runs["one task (unsplit)"] = {"target_bytes": 1 << 40, "min_tasks_per_cpu": 0}
        results: dict[str, list[dict]] = {label: [] for label in runs}
        for _ in range(h.repeats):
            for label, split in runs.items():
                before = os.getloadavg()
                r = run_once(folder, data, split, args.cpus)
                r.update(
                    {"cpu_per_wall": r["map_cpu"] / r["map_wall"], "loadavg_before": before, "loadavg_after": os.getloadavg()}
                )
                results[label].append(r)
                print(
                    f"{label:20s} tasks={r['tasks']:4d}  map wall={r['map_wall']:7.1f} s  map CPU={r['map_cpu']:7.1f} s  "
                    f"CPU/wall={r['cpu_per_wall']:.2f}  tasks running on average={r['concurrency']:.2f}  "
                    f"(run {r['run_wall']:.0f} s, load average before {before[0]:.1f} on {os.cpu_count()} cores)",
                    flush=True,
                )
        for label, rs in results.items():
            h.figure(f"{label}: map tasks", [r["tasks"] for r in rs])
            h.figure(f"{label}: map-phase CPU s / wall s", [r["cpu_per_wall"] for r in rs])
            h.figure(f"{label}: tasks running on average", [r["concurrency"] for r in rs])
        split = results["split (defaults)"]
        h.ratio("split map phase: CPU s / wall s", [r["cpu_per_wall"] for r in split], target=f">= 1.7 on {args.cpus} idle cores")
        if "one task (unsplit)" in results:
            one = results["one task (unsplit)"]
            assert all(a["docs"] == b["docs"] for a, b in zip(one, split))
            h.ratio("map wall one task / split", pair_ratios([r["map_wall"] for r in one], [r["map_wall"] for r in split]))
        h.finish(corpus_bytes=size, corpus_docs=docs, runs=results)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
