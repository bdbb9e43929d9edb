"""Per-task peak memory of every distributed global phase at 1x / 4x / 16x corpus size.

    python -m bench.scaling.global_phases [--base-docs 1000] [--scales 1 4 16]
    python -m bench.scaling.global_phases --minhash-only --base-docs 20000 --scales 1 4   # minhash's tasks alone

Each scale is a corpus of real zh/en text from ../shared/data/corpus, repeated ``scale`` times
with every copy perturbed (a per-copy character rotation: Latin letters shifted, Han characters
moved in their block) so copies are neither exact nor near duplicates of each other, plus
planted duplicates: 3% exact copies (case/space variants), 3% edited near-copies and 2% URL
reuses. Input files hold a fixed number of documents and partitions grow with the corpus
(``2 x scale``), so a task's partition stays the same size while the corpus grows 16x.

The pipeline is dedup (exact + URL, partitioned) -> minhash -> tokenize (concat packing). Every
task of a phase runs in a process forked for it from one per phase (imports loaded, no data:
as a fresh Ray worker), calling the task function as the worker does; its peak RSS (VmHWM,
reset through /proc/self/clear_refs at the start) is the task's peak. Printed: per phase the
number of tasks and the largest per-task peak, and the ratio of the 16x (last) scale to the 1x.
MinHash's partition step is all its rounds (band pairs, then star rounds until nothing is left,
as the engine plans them); ``--minhash-only`` measures it alone on a corpus with many near copies,
copies of copies among them (30% by default), where a task holding every cluster would grow.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench._support.corpus import sample
from bench._support.paths import ROOT

DOCS_PER_FILE = 250
TOKENIZER = ROOT / "tokenizer" / "demo.json"


def _rotate(text: str, k: int) -> str:
    if k == 0:
        return text
    out = []
    for ch in text:
        o = ord(ch)
        if 97 <= o <= 122:
            out.append(chr(97 + (o - 97 + k) % 26))
        elif 65 <= o <= 90:
            out.append(chr(65 + (o - 65 + k) % 26))
        elif 0x4E00 <= o <= 0x9FFF:
            out.append(chr(0x4E00 + (o - 0x4E00 + 97 * k) % 0x5200))
        else:
            out.append(ch)
    return "".join(out)


def make_corpus(folder: Path, base: list[dict], scale: int, near: float = 0.03, minhash_only: bool = False) -> dict[str, int]:
    rng = random.Random(scale)
    docs = [
        {"text": _rotate(d["text"], k), "url": f"https://site{k}.example/{i}"} for k in range(scale) for i, d in enumerate(base)
    ]
    n = len(docs)
    planted = {"exact": int(0.03 * n), "near": int(near * n), "url": int(0.02 * n)}
    for _ in range(planted["exact"]):
        d = docs[rng.randrange(n)]
        docs.append({"text": d["text"].upper() + "  ", "url": f"https://copy.example/{rng.random()}"})
    for _ in range(planted["near"]):
        # minhash_only: copies of copies too, so clusters grow past pairs and chain across partitions
        t = docs[rng.randrange(len(docs) if minhash_only else n)]["text"]
        cut = rng.randrange(len(t) + 1)
        docs.append({"text": t[:cut] + " 转载 reposted " + t[cut:], "url": f"https://near.example/{rng.random()}"})
    for _ in range(planted["url"]):
        docs.append({"text": f"another page {rng.random()} " * 5, "url": docs[rng.randrange(n)]["url"] + "/"})
    rng.shuffle(docs)
    (folder / "data").mkdir(parents=True)
    for f, lo in enumerate(range(0, len(docs), DOCS_PER_FILE)):
        (folder / "data" / f"part-{f:05d}.jsonl").write_text(
            "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs[lo : lo + DOCS_PER_FILE])
        )
    shutil.copy(TOKENIZER, folder / "tok.json")
    (folder / "pipeline.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "scale",
                "sources": [{"name": "web", "kind": "web", "paths": ["data/*.jsonl"]}],
                "stages": [
                    {"dedup": {"exact": True, "url": True, "partitions": 2 * scale}},
                    {"minhash": {"threshold": 0.7, "partitions": 2 * scale}},
                ],
                "tokenize": {"tokenizer": "tok.json", "seq_len": 512, "rows_per_shard": 256, "val_fraction": 0.02},
            }
            if not minhash_only
            else {  # minhash alone: its tasks' memory, on a corpus with many near copies
                "name": "scale",
                "sources": [{"name": "web", "kind": "web", "paths": ["data/*.jsonl"]}],
                # one map task per input file: map outputs (read back for signatures) stay one size
                "split": {"group_small_files": False},
                "stages": [{"minhash": {"threshold": 0.7, "partitions": 2 * scale}}],
            }
        )
    )
    return {"docs": len(docs), **planted}


def _peak_mib(field: str = "VmHWM") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux)
    except OSError:
        pass


def engine_phases(spec, kind: str, arg: str) -> list:
    """The engine's phases (as the run plans them) that one of this bench's phases stands for: a
    segment's map phase, the phases of the global stage ending a segment (its shuffles' merge levels
    and partition tasks, every round, the outputs merges and the combine step), or packing."""
    from datapipe.engine.phases import plan_phases, segment_phases
    from datapipe.engine.work_files import map_phase

    if kind == "map":
        return [p for p in plan_phases(spec) if p.name == map_phase(int(arg))]
    if kind == "global":
        return segment_phases(spec, spec.segments[int(arg)], map_phase_too=False)
    if kind == "pack":
        from datapipe.run_folder.layout import PACK_PHASE

        return [p for p in plan_phases(spec) if p.name == PACK_PHASE]
    raise ValueError(kind)


def _in_child(fn) -> float:
    """``fn()`` in a process forked for it (as a fresh Ray worker: imports loaded, no data, so what one
    task leaves on the heap never counts against the next); its peak RSS, MiB."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _reset_peak()
        fn()
        os.write(write, json.dumps(_peak_mib()).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        got = f.read()
    _, status = os.waitpid(pid, 0)
    if status or not got:
        raise RuntimeError("a task failed in its child process")
    return float(json.loads(got))


def run_phase(root: Path, phase: str) -> dict:
    """Every task of one of this bench's phases (the engine's phases it stands for, each listed from the
    markers of those before it), in this process's forked children; the peak RSS of each task."""
    from datapipe.engine.plan import make_spec
    from datapipe.engine.worker import run_task
    from datapipe.pipeline.load import load_pipeline
    from datapipe.run_folder.layout import RunFolder

    spec = make_spec(load_pipeline(root / "pipeline.yaml"), root / "out", root / "cache")
    folder = RunFolder(root / "out")
    kind, _, arg = phase.partition(":")
    base = _peak_mib("VmRSS")  # what every task's process holds before any data: imports, the plan
    peaks, started, by_round = [], time.perf_counter(), {}
    if kind == "stats":  # the driver's step: the audit database over every Parquet output (DuckDB)
        from datapipe.engine.finish import build_stats, collect_counts

        peaks.append(_in_child(lambda: build_stats(folder, spec, collect_counts(folder, spec), memory_mb=int(arg))))
    else:
        for engine_phase in engine_phases(spec, kind, arg):
            tasks = engine_phase.task_list(folder)
            assert tasks is not None, f"{engine_phase.name}: its tasks depend on phases that did not run"
            for t in tasks:  # none for the rounds after one that forwarded nothing: the engine plans none
                peaks.append(_in_child(lambda p=engine_phase, t=t: run_task(p.name, t.key, p.fn, spec, *t.args)))
                by_round[engine_phase.name] = max(by_round.get(engine_phase.name, 0.0), peaks[-1])
    return {
        "tasks": len(peaks),
        "rounds": sum(1 for name in by_round if name.startswith("shuffle")),
        "peak_mib": max(peaks, default=0.0),
        "base_mib": base,
        "seconds": time.perf_counter() - started,
        "by_round": by_round,
    }


def found(root: Path) -> dict[str, int]:
    import pyarrow.parquet as pq

    rejected = pq.read_table(root / "out" / "rejected", columns=["reason"]).column("reason").to_pylist()
    return {r: rejected.count(r) for r in ("exact_duplicate", "duplicate_url", "near_duplicate")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-docs", type=int, default=1000)
    ap.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument(
        "--stats-memory-mb",
        type=int,
        default=256,
        help="DuckDB memory cap of the statistics step (a small one shows it spilling)",
    )
    ap.add_argument(
        "--minhash-only",
        action="store_true",
        help="a pipeline of minhash alone, on a corpus with --near near copies (copies of copies too)",
    )
    ap.add_argument(
        "--near",
        type=float,
        default=None,
        help="near copies planted, as a share of the corpus (default 0.03; 0.3 with --minhash-only)",
    )
    ap.add_argument("--phase", help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.phase:
        print(json.dumps(run_phase(a.root, a.phase)))
        return 0
    base = sample(a.base_docs, seed=1)
    near = a.near if a.near is not None else (0.3 if a.minhash_only else 0.03)
    phases = ["map:0", "global:0", "map:1", "global:1", "map:2", "pack:", f"stats:{a.stats_memory_mb}"]
    names = {
        "map:0": "map0 (dedup signals)",
        "global:0": "dedup (text hash, URL: all)",
        "map:1": "map1 (minhash signatures)",
        "global:1": "minhash (all its phases)",
        "map:2": "map2 (tokenize)",
        "pack:": "pack ranges",
        f"stats:{a.stats_memory_mb}": f"stats (DuckDB, {a.stats_memory_mb} MB cap)",
    }
    if a.minhash_only:
        phases = ["map:0", "global:0", "map:1"]
        names = {
            "map:0": "map0 (minhash signatures)",
            "global:0": "minhash (all its phases)",
            "map:1": "map1 (decisions applied)",
        }
    table: dict[int, dict[str, dict]] = {}
    for scale in a.scales:
        root = Path(tempfile.mkdtemp(prefix=f"dp-global-{scale}x-"))
        try:
            info = make_corpus(root, base, scale, near, a.minhash_only)
            table[scale] = {}
            for phase in phases:
                proc = subprocess.run(
                    [sys.executable, "-m", __spec__.name, "--phase", phase, "--root", str(root)],
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                )
                if proc.returncode:
                    sys.stderr.write(proc.stderr)
                    return 1
                table[scale][phase] = json.loads(proc.stdout.strip().splitlines()[-1])
            got = found(root)
            print(
                f"{scale:>3}x: {info['docs']:,} docs; planted exact {info['exact']}, near {info['near']}, "
                f"url {info['url']}; removed {got}",
                flush=True,
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)
    first, last = a.scales[0], a.scales[-1]
    print(f"\n{'phase':<28}" + "".join(f"{f'{s}x tasks':>10}{f'{s}x MiB':>9}" for s in a.scales) + f"{f'{last}x/{first}x':>10}")
    for phase in phases:
        row = table[first][phase]
        cells = "".join(f"{table[s][phase]['tasks']:>10}{table[s][phase]['peak_mib']:>9.0f}" for s in a.scales)
        ratio = table[last][phase]["peak_mib"] / row["peak_mib"] if row["peak_mib"] else float("nan")
        print(f"{names[phase]:<28}{cells}{ratio:>10.2f}")
    for rounds in (p for p in phases if p.startswith("global:")):
        print(
            f"{names[rounds]}: shuffle phases that had tasks: "
            + ", ".join(f"{s}x {table[s][rounds]['rounds']}" for s in a.scales)
        )
        for s in a.scales:
            print(
                f"  {s}x largest task per engine phase, MiB: "
                + ", ".join(f"{k} {v:.0f}" for k, v in table[s][rounds].get("by_round", {}).items())
            )
    print(
        "\nMiB: the largest peak RSS of one task's forked process (it counts the pages the task touches:"
        " shared libraries mapped before the fork count only once used; the phase process before any"
        f" data holds {table[first]['map:0']['base_mib']:.0f} MiB). Compare across scales."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
