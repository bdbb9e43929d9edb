"""Re-tuning a threshold: a fresh run against `datapipe run --from OLD_RUN` (re-deciding from the
recorded signals), on the shared corpus.

    python -m bench.perf.redecide                          # 2 pairs per changed threshold
    python -m bench.perf.redecide --repeats 3 --json bench/results/redecide.json

The pipeline: length, langid, quality, exact dedup, minhash, tokenize (the shared corpus, all four
files). An old run with the first thresholds is made once (untimed); then, per changed threshold
(langid ``min_score`` 0.5 -> 0.8, length ``min_chars`` 1 -> 200, a quality rule-set threshold:
``gopher_quality.min_words`` 50 -> 30 in a copy of ``en_web.yaml``), a fresh run of the changed
pipeline and a re-decided one alternate (``--fresh`` and ``--from OLD --fresh``), each a
``datapipe run`` subprocess. Printed: wall seconds of each, the per-pair ratio, the map tasks' CPU
seconds (their markers' ``cpu_seconds``), and whether the two run folders hold the same outputs
(every shard, docs and rejected file's bytes, and the ``documents`` table).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import ROOT, SHARED

CORPUS = SHARED / "corpus"
RULES = ROOT / "filters" / "quality" / "en_web.yaml"


def pipeline(work: Path, name: str, min_chars: int = 1, min_score: float = 0.5, min_words: int = 50) -> Path:
    rules = work / f"en_web_{min_words}.yaml"
    text = RULES.read_text(encoding="utf-8")
    assert "    min_words: 50 " in text
    rules.write_text(text.replace("    min_words: 50 ", f"    min_words: {min_words} "), encoding="utf-8")
    (work / "en_web.yaml").write_text(rules.read_text(encoding="utf-8"), encoding="utf-8")
    path = work / f"{name}.yaml"
    path.write_text(
        f"""name: redecide_bench
sources:
  - name: corpus
    kind: web
    format: jsonl
    paths: [{json.dumps(str(CORPUS / "*.jsonl"))}]
stages:
  - length: {{min_chars: {min_chars}}}
  - langid: {{keep: [zh, en], min_score: {min_score}}}
  - quality: {{rules: {{en_web: en_web.yaml}}}}
  - dedup: {{exact: true}}
  - minhash: {{threshold: 0.7}}
tokenize:
  tokenizer: {json.dumps(str(ROOT / "tokenizer" / "demo.json"))}
  seq_len: 2048
""",
        encoding="utf-8",
    )
    return path


def run(pipe: Path, out: Path, *extra: str) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "datapipe.cli", "run", str(pipe), "--output", str(out), "--fresh", "--no-progress", *extra],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def run_recording(pipe: Path, out: Path, cpu: list[float], *extra: str) -> float:
    """``run``, appending the run's task CPU seconds to ``cpu``."""
    seconds = run(pipe, out, *extra)
    cpu.append(task_cpu(out))
    return seconds


def task_cpu(out: Path) -> float:
    """CPU seconds of every task of the run (the markers' ``cpu_seconds``): the work, without Ray's start."""
    return sum(json.loads(p.read_text()).get("cpu_seconds", 0.0) for p in (out / "_work" / "markers").rglob("*.json"))


def outputs(root: Path) -> dict[str, Any]:
    import duckdb

    files = {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in ("shards", "docs", "rejected")
        for p in sorted((root / folder).rglob("*"))
        if p.is_file()
    }
    with duckdb.connect(str(root / "stats.duckdb"), read_only=True) as con:
        documents = con.execute("select * from documents order by id").fetchall()
    return {"files": files, "documents": documents}


def main() -> int:
    ap = add_args(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter), 2)
    ap.add_argument("--only", choices=["langid", "length", "quality"], action="append", help="changed thresholds to time")
    args = ap.parse_args()
    if not CORPUS.is_dir():
        print(f"no shared corpus at {CORPUS}", file=sys.stderr)
        return 1
    h = Harness("redecide", args, libs=["ray", "duckdb", "fasttext-numpy2", "tokenizers"])
    changes = {
        "langid": {"min_score": 0.8},
        "length": {"min_chars": 200},
        "quality": {"min_words": 30},
    }
    with tempfile.TemporaryDirectory(prefix="redecide-bench-") as tmp:
        work = Path(tmp)
        old = work / "old"
        seconds = run(pipeline(work, "old"), old)
        print(f"old run (untimed figure): {seconds:.1f} s wall, {task_cpu(old):.1f} s task CPU", flush=True)
        equal: dict[str, bool] = {}
        for name, change in changes.items():
            if args.only and name not in args.only:
                continue
            pipe = pipeline(work, name, **change)
            fresh, again = work / f"fresh_{name}", work / f"redecide_{name}"
            cpu: dict[str, list[float]] = {"fresh": [], "redecide": []}

            sides = {
                f"fresh ({name})": partial(run_recording, pipe, fresh, cpu["fresh"]),
                f"redecide ({name})": partial(run_recording, pipe, again, cpu["redecide"], "--from", str(old)),
            }
            times = h.interleave(sides)
            h.figure(f"fresh run, {name} changed: wall s", times[f"fresh ({name})"], unit="s")
            h.figure(f"re-decided, {name} changed: wall s", times[f"redecide ({name})"], unit="s")
            h.figure(f"fresh run, {name} changed: task CPU s", cpu["fresh"], unit="s")
            h.figure(f"re-decided, {name} changed: task CPU s", cpu["redecide"], unit="s")
            h.ratio(f"{name}: fresh / re-decided wall", pair_ratios(times[f"fresh ({name})"], times[f"redecide ({name})"]))
            h.ratio(f"{name}: fresh / re-decided task CPU", pair_ratios(cpu["fresh"], cpu["redecide"]))
            equal[name] = outputs(fresh) == outputs(again)
            reused = json.loads((again / "run.json").read_text())["from"]
            print(
                f"{name}: outputs equal to the fresh run's: {equal[name]}; reused {reused['reused']}, "
                f"computed {reused['computed']}, token lists reused: {reused['tokens_reused']}",
                flush=True,
            )
            shutil.rmtree(fresh)
            shutil.rmtree(again)
    h.finish(outputs_equal=equal)
    return 0 if all(equal.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
