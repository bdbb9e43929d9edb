"""Files written and opened by the shuffles, per document, when map tasks and partitions both grow
with the corpus: counted, not timed (issue 30, "shuffles whose files and requests stay flat").

    python -m bench.scaling.shuffle_files [--docs-per-file 200] [--base-files 2] [--scales 1,2,4]

Scale s: ``base-files`` x s JSONL files of ``docs-per-file`` documents each (real en/zh Wikipedia
articles from ../shared/data/corpus, 5% exact and 5% edited copies planted in later files), one
map task per file, and exact dedup and MinHash with ``base-files`` x s partitions each: a task and a
partition hold the same number of documents at every scale. Each scale runs ``datapipe run
--in-process`` (every task in one process, no Ray, so one strace sees them all) under
``strace -f -e trace=openat`` and counts the successful opens of files in the run folder, by the
folder they are in (a shuffle file, a round's forwarded rows, a partition's decisions, a map
output, ...) and whether the open created the file. Printed: per folder and in all, opens and
files written per document at each scale and the ratio last / first (flat = 1.0).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench._support.paths import ROOT, SHARED

CORPUS = SHARED / "corpus"
TEMP = re.compile(r"\.tmp-\d+-[0-9a-f]+$")
OPEN = re.compile(r'openat\([^,]+, "([^"]+)", ([A-Z_|]+)[^)]*\)\s+=\s+(\d+)')


def _texts(n: int) -> list[str]:
    out: list[str] = []
    for name in ("zh_wikipedia.jsonl", "en_wikipedia.jsonl"):
        with (CORPUS / name).open(encoding="utf-8") as f:
            for line in f:
                text = json.loads(line)["text"]
                if len(text) > 300:
                    out.append(text[:4000])
                if len(out) >= n:
                    return out
    raise SystemExit(f"the shared corpus has fewer than {n} documents over 300 characters")


def _edited(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(max(1, len(chars) // 200)):
        chars[rng.randrange(len(chars))] = rng.choice("的了是在和 the of and")
    return "".join(chars) + " (reposted)"


def write_corpus(folder: Path, files: int, per_file: int, texts: list[str]) -> int:
    """``files`` JSONL files; 10% of each file's lines are copies (exact or edited) of earlier documents."""
    rng = random.Random(7)
    folder.mkdir(parents=True)
    written, used = 0, 0
    for f in range(files):
        lines = []
        for _ in range(per_file):
            if written > 50 and rng.random() < 0.1:
                src = texts[rng.randrange(used)]
                text = src if rng.random() < 0.5 else _edited(src, rng)
            else:
                text, used = texts[used], used + 1
            lines.append(json.dumps({"text": text}, ensure_ascii=False))
            written += 1
        (folder / f"part-{f:04d}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return written


def _category(rel: str) -> str:
    """The run-folder area of a path: the phase folder, with partitions and rounds folded together."""
    parts = rel.split("/")
    if parts[0] != "_work":
        return parts[0]
    name = parts[1] if len(parts) > 1 else ""
    if name == "markers":
        return "markers"
    name = re.sub(r"-r\d+$", "-r*", name)  # shuffle1-r3: the forwarded rows of a round
    name = re.sub(r"^merge(\d+)r\d+$", r"merge\1r*", name)  # a round's merged inputs
    leaf = parts[-1]
    if name.endswith("-parts"):
        name += "/state" if leaf.startswith("state-") else "/decisions"
    return name


def count(trace: Path, out: Path) -> dict[str, dict[str, int]]:
    prefix = str(out.resolve()) + "/"
    got: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"opened": 0, "written": 0})
    for line in trace.read_text(errors="replace").splitlines():
        m = OPEN.search(line)
        if not m or not m.group(1).startswith(prefix) or "O_DIRECTORY" in m.group(2):
            continue
        rel = m.group(1)[len(prefix) :]
        creates = "O_CREAT" in m.group(2)
        temp = TEMP.search(rel)
        if rel.endswith(".lock") or (temp and not creates):
            continue  # the run lock; a file read back while written (its write is counted)
        rel = TEMP.sub("", rel)  # written to a temporary name, then renamed: counted under its name
        kind = "written" if creates else "opened"
        got[_category(rel)][kind] += 1
    return dict(got)


def run_scale(work: Path, scale: int, a: argparse.Namespace, texts: list[str]) -> dict:
    files = a.base_files * scale
    inp = work / f"in-{scale}"
    docs = write_corpus(inp, files, a.docs_per_file, texts)
    split = {"target_bytes": 1 << 30, "min_tasks_per_cpu": 0, "group_small_files": False}
    config = {
        "name": f"shuffle-{scale}",
        "sources": [{"name": "wiki", "kind": "text", "paths": [str(inp / "*.jsonl")]}],
        "stages": [
            {"dedup": {"exact": True, "partitions": files}},
            {"minhash": {"threshold": 0.7, "partitions": files}},
        ],
        "split": {
            **split,
            **({"shuffle_fan_in": a.fan_in} if a.fan_in is not None else {}),
            **({"partition_rows": a.partition_rows} if a.partition_rows is not None else {}),
        },
    }
    pipeline = work / f"pipeline-{scale}.yaml"
    pipeline.write_text(yaml.safe_dump(config))
    out = work / f"out-{scale}"
    trace = work / f"trace-{scale}.txt"
    cmd = ["strace", "-f", "-qq", "-e", "trace=openat", "-o", str(trace)]
    args = ["run", str(pipeline), "--output", str(out), "--in-process"]
    cmd += [sys.executable, "-m", "datapipe.cli", *args]
    subprocess.run(cmd, check=True, cwd=a.code, env={**os.environ, "PYTHONPATH": str(a.code)}, stdout=subprocess.DEVNULL)
    counts = count(trace, out)
    removed = sum(1 for _ in (out / "rejected").glob("*minhash*.parquet"))
    return {"scale": scale, "map_tasks": files, "partitions": files, "documents": docs, "counts": counts, "reject_files": removed}


def report(results: list[dict]) -> None:
    cats = sorted({c for r in results for c in r["counts"]})
    head = " | ".join(f"{r['scale']}x ({r['map_tasks']} tasks, {r['documents']} docs)" for r in results)
    print(f"\nper 1,000 documents: opened / written; ratio last/first\n| folder | {head} | ratio opened | ratio written |")
    print("|---" * (len(results) + 3) + "|")
    for c in [*cats, "ALL"]:
        cells, per = [], []
        for r in results:
            if c == "ALL":
                o = sum(v["opened"] for v in r["counts"].values())
                w = sum(v["written"] for v in r["counts"].values())
            else:
                o, w = r["counts"].get(c, {}).get("opened", 0), r["counts"].get(c, {}).get("written", 0)
            per.append((1000 * o / r["documents"], 1000 * w / r["documents"]))
            cells.append(f"{per[-1][0]:.1f} / {per[-1][1]:.1f}")
        ro = per[-1][0] / per[0][0] if per[0][0] else float("nan")
        rw = per[-1][1] / per[0][1] if per[0][1] else float("nan")
        print(f"| {c} | {' | '.join(cells)} | {ro:.2f} | {rw:.2f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs-per-file", type=int, default=200)
    ap.add_argument("--base-files", type=int, default=2)
    ap.add_argument("--scales", default="1,2,4")
    ap.add_argument("--fan-in", type=int, help="split.shuffle_fan_in (default: the pipeline's, 256: no merges at these sizes)")
    ap.add_argument("--partition-rows", type=int, help="split.partition_rows (default: the pipeline's, 4M: a task a round)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--code", type=Path, default=ROOT, help="the datapipe checkout to run (default this one; main's to compare)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (traces, run folders)")
    a = ap.parse_args(argv)
    if shutil.which("strace") is None:
        raise SystemExit("needs strace (apt-get install strace)")
    scales = [int(s) for s in a.scales.split(",")]
    texts = _texts(int(max(scales) * a.base_files * a.docs_per_file))
    work = Path(tempfile.mkdtemp(prefix="shuffle-files-"))
    try:
        results = []
        for s in scales:
            results.append(run_scale(work, s, a, texts))
            print(json.dumps(results[-1]), flush=True)
        report(results)
        if a.json:
            a.json.write_text(json.dumps(results, indent=1))
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
