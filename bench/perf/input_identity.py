"""What identifying inputs by content costs the map phase: this tree against the one before it.

    python -m bench.perf.input_identity --repeats 5

Runs the map phase (the newline pre-pass ``lines`` and ``map0``) of a light pipeline (``length``;
``--stages langid`` adds language ID) over the shared corpus's zh and en JSONL
(../shared/data/corpus, 60 MB; ``--copies`` of it, default 4), in process, the files split into ranges of ``--target-mb`` (as
on a cluster: a newline pre-pass, several tasks per file), twice per repeat, interleaved: once with the code
before input identity (``--base``, default the parent of the commit that added
``datapipe/storage/input_reads.py``, exported with ``git archive`` into a temporary folder) and
once with this tree. Each run is a fresh process. Before, the first range task of each file read
the whole file a second time for run.json's sha256; now every task hashes the bytes it reads as
it reads them, and the run's end is a ``stat`` per input. The figure is map-phase throughput
(input bytes / wall seconds of ``lines`` + ``map0``), this tree over the base, per interleaved
pair; the acceptance is >= 0.95. The tasks' own CPU seconds (their markers) are compared too,
and the bytes hashed per run are printed with what hashing them alone costs here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import ROOT, SHARED

CORPUS = SHARED / "corpus"
FILES = ("en_wikipedia.jsonl", "zh_wikipedia.jsonl", "zh_pingcap_docs.jsonl", "zh_oiwiki.jsonl")

# One run, in a fresh process whose PYTHONPATH is the tree under test: prints the map phase's figures.
RUN = r"""
import json, sys, time
from pathlib import Path
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
pipeline, out = sys.argv[1], Path(sys.argv[2])
result = run_pipeline(load_pipeline(pipeline), output=out, in_process=True, show_progress=False, log=lambda m: None)
phases = [p for p in ("lines", "map0") if p in result.run["timings"]]
markers = [json.loads(m.read_text()) for p in phases for m in (out / "_work" / "markers" / p).glob("**/*.json")]
hashed = sum(b - a for m in markers for r in m.get("reads", []) for a, b in r.get("extents", []))
print(json.dumps({"wall": sum(result.run["timings"][p] for p in phases), "cpu": sum(m["cpu_seconds"] for m in markers),
                  "tasks": len(markers), "docs": result.run["counts"]["documents"], "kept": result.run["counts"]["kept"],
                  "hashed": hashed, "status": result.run["status"]}))
"""


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def default_base() -> str:
    added = git("log", "--format=%H", "--diff-filter=A", "-1", "--", "datapipe/storage/input_reads.py")
    if not added:
        sys.exit("datapipe/storage/input_reads.py is not committed here: give --base")
    return git("rev-parse", f"{added}^")


def export_tree(rev: str, to: Path) -> Path:
    """The package at ``rev`` (datapipe/ only: the pipeline and data are this run's), read-only on the repository."""
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "datapipe"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(to, filter="data")
    return to


def run_once(tree: Path, pipeline: Path, out: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", RUN, str(pipeline), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
        timeout=3600,
    )
    if proc.returncode != 0:
        sys.exit(f"run with {tree} failed:\n{proc.stderr[-3000:]}")
    subprocess.run(["rm", "-rf", str(out)], check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sha256_speed() -> float:
    """Bytes per second hashlib's sha256 hashes here, in 1 MiB pieces (as a task's reads come)."""
    data = b"\x5a" * (1 << 20)
    h = hashlib.sha256()
    t0 = time.perf_counter()
    for _ in range(256):
        h.update(data)
    return 256 * (1 << 20) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="the code to compare with (a git revision; default: before input identity)")
    ap.add_argument(
        "--target-mb",
        type=float,
        default=8.0,
        help="split.target_bytes in MB (default 8: the 38 MB file in 5 ranges, the 12 MB one in 2)",
    )
    ap.add_argument(
        "--stages",
        choices=("length", "langid"),
        default="length",
        help="length: the lightest map phase (reading dominates: the worst case for hashing's share); langid: language ID first",
    )
    ap.add_argument(
        "--copies",
        type=int,
        default=4,
        help="copies of the corpus read per run (default 4: 240 MB, a map phase long enough to time on a shared machine)",
    )
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    add_args(ap, repeats=5)
    args = ap.parse_args()
    if not args.corpus.is_dir():
        sys.exit(f"corpus not found: {args.corpus}")
    base = args.base or default_base()
    size = args.copies * sum((args.corpus / f).stat().st_size for f in FILES)
    h = Harness(
        "input_identity",
        args,
        note=f"map phase over {size / 1e6:.0f} MB of JSONL, stages: {args.stages}, "
        f"ranges of {args.target_mb:g} MB, in process; base {git('rev-parse', '--short=12', base)}",
    )
    with tempfile.TemporaryDirectory(prefix="datapipe-identity-bench-") as tmp:
        folder = Path(tmp)
        base_tree = export_tree(base, folder / "base")
        stages = [{"length": {"min_chars": 50}}]
        if args.stages == "langid":
            stages.insert(0, {"langid": {"keep": ["zh", "en"], "min_score": 0.3}})
        import yaml

        data = folder / "data"  # --copies of each file (copies, not links: a run names its inputs by real path)
        data.mkdir()
        for k in range(args.copies):
            for f in FILES:
                shutil.copyfile(args.corpus / f, data / f"{f[:2]}-{k}-{f}")
        pipeline = folder / "p.yaml"
        pipeline.write_text(
            yaml.safe_dump(
                {
                    "name": "bench",
                    "stages": stages,
                    "split": {"target_bytes": int(args.target_mb * 1e6), "min_tasks_per_cpu": 0},
                    "sources": [
                        {"name": "zh", "paths": [str(data / "zh-*.jsonl")]},
                        {"name": "en", "paths": [str(data / "en-*.jsonl")]},
                    ],
                }
            )
        )
        sides = {"base": base_tree, "this tree": ROOT}
        runs = h.interleave(
            {label: (lambda t=tree, label=label: run_once(t, pipeline, folder / "out")) for label, tree in sides.items()},
            warmup=True,
        )
    b, d = runs["base"], runs["this tree"]
    assert all(x["docs"] == y["docs"] and x["kept"] == y["kept"] for x, y in zip(b, d)), "the two trees disagree"
    assert all(x["status"] == "complete" for x in b + d)
    for label, rs in runs.items():
        h.figure(f"{label}: map phase MB/s", [size / 1e6 / r["wall"] for r in rs], unit="MB/s")
        h.figure(f"{label}: task CPU s", [r["cpu"] for r in rs], unit="s")
    h.figure("tasks (lines + map0)", [r["tasks"] for r in d])
    hashed = d[0]["hashed"]
    speed = sha256_speed()
    h.figure("bytes hashed per run (this tree)", hashed / 1e6, unit="MB")
    h.figure("of which hashing alone costs (sha256 here)", hashed / speed, unit="s")
    h.ratio(
        "map-phase throughput, this tree / base", pair_ratios([r["wall"] for r in b], [r["wall"] for r in d]), target=">= 0.95"
    )
    h.ratio("task CPU, base / this tree", pair_ratios([r["cpu"] for r in b], [r["cpu"] for r in d]))
    h.finish(base=base, corpus_bytes=size, runs=runs, sha256_bytes_per_s=speed)


if __name__ == "__main__":
    main()
