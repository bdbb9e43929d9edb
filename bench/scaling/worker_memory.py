"""Peak memory of each process of a `datapipe run`: the driver, every Ray worker, Ray's own processes.

    python -m bench.scaling.worker_memory                         # pipelines/shared_corpus.yaml, first 300 docs per input
    python -m bench.scaling.worker_memory --docs 0                # the whole shared corpus
    python -m bench.scaling.worker_memory pipelines/demo.yaml --num-cpus 2 --repeats 3 --json bench/results/worker_memory.json

It runs the pipeline (fresh, into a temporary folder) as a subprocess and samples
/proc/<pid>/smaps_rollup of the whole process tree every 0.2 s. The target (issue 18) is map
workers under 400 MB each; per-process PSS is the honest figure (RSS counts each shared library
once per process), RSS is printed beside it. With ``--repeats N`` the run is repeated and each
figure is given as median and range (``bench/_support/harness.py``: machine, date, load, ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench._support.harness import Harness, add_args
from bench._support.paths import ROOT
from bench._support.proctree_roles import mib, run_sampled


def sample_pipeline(pipeline: Path, docs: int, tmp: Path) -> Path:
    """A copy of the pipeline file reading the first ``docs`` lines of each JSONL input, written to
    ``tmp`` (the inputs too); relative paths in it are made absolute."""
    import glob

    import yaml

    raw = yaml.safe_load(pipeline.read_text())
    base = pipeline.resolve().parent
    for src in raw["sources"]:
        paths = []
        for pattern in src["paths"]:
            for i, path in enumerate(sorted(glob.glob(str(base / pattern)))):
                out = tmp / f"{src['name']}-{i}.jsonl"
                with open(path, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as g:
                    g.writelines(line for _, line in zip(range(docs), f))
                paths.append(str(out))
        src["paths"] = paths
    if raw.get("tokenize", {}).get("tokenizer"):
        raw["tokenize"]["tokenizer"] = str(base / raw["tokenize"]["tokenizer"])
    raw.pop("output", None)
    out = tmp / pipeline.name
    out.write_text(yaml.safe_dump(raw, allow_unicode=True))
    return out


def run_once(args: argparse.Namespace, env: dict[str, str], show: bool) -> dict[str, float]:
    """One sampled run; prints its per-process table when ``show``; returns its figures in MiB / s."""
    with tempfile.TemporaryDirectory(prefix="datapipe-mem-") as tmp:
        pipeline = sample_pipeline(Path(args.pipeline), args.docs, Path(tmp)) if args.docs else args.pipeline
        cmd = [
            sys.executable,
            "-m",
            "datapipe.cli",
            "run",
            str(pipeline),
            "--output",
            f"{tmp}/run",
            "--fresh",
            "--no-progress",
            "--num-cpus",
            str(args.num_cpus),
        ]
        rc, wall, sampler = run_sampled(cmd, env, args.interval)
        timings = json.loads((Path(tmp) / "run" / "run.json").read_text()).get("timings", {}) if rc == 0 else {}
    if rc != 0:
        sys.exit(f"datapipe run failed (exit {rc})")
    peaks = sorted(sampler.peaks.values(), key=lambda p: (p.role, -p.pss))
    workers = [p for p in peaks if p.role == "worker"]
    # Every phase's tasks run through one remote function (engine/executors/ray/worker.py ``ray_run_task``; formerly
    # ``_run_task``, ``_map_task`` and others), so a worker that ran a task is counted; map tasks set the peak.
    map_workers = [p for p in workers if any(t.endswith(("_map_task", "run_task")) for t in p.titles)]
    ray_own = [p for p in peaks if p.role.startswith("ray:")]
    driver = [p for p in peaks if p.role == "driver"]
    if show:
        print(
            "phases (s):",
            ", ".join(f"{k} {v:.1f}" for k, v in timings.items()),
            f"| outside phases {wall - sum(timings.values()):.1f}",
        )
        print(f"pipeline: {args.pipeline}  ({args.num_cpus} CPUs, {os.cpu_count()} on the machine), wall {wall:.1f} s")
        print(f"{'process':<22}{'pid':>8}{'RSS MiB':>9}{'PSS MiB':>9}{'USS MiB':>9}  tasks seen")
        for p in peaks:
            if p.role == "other":
                continue
            titles = ",".join(sorted(t.removeprefix("ray::") for t in p.titles))
            print(f"{p.role:<22}{p.pid:>8}{mib(p.rss):>9}{mib(p.pss):>9}{mib(p.uss):>9}  {titles}")
        print(f"Ray's own processes: {len(ray_own)}; task workers: {len(map_workers)}\n")
    out = {
        "wall": wall,
        "tree_pss": sampler.tree_pss_peak / 2**20,
        "tree_rss": sampler.tree_rss_peak / 2**20,
        "ray_own_pss": sum(p.pss for p in ray_own) / 2**20,
        "ray_own_rss": sum(p.rss for p in ray_own) / 2**20,
        "driver_pss": max((p.pss for p in driver), default=0) / 2**20,
    }
    if map_workers:
        out.update(
            map_pss=max(p.pss for p in map_workers) / 2**20,
            map_rss=max(p.rss for p in map_workers) / 2**20,
            map_uss=max(p.uss for p in map_workers) / 2**20,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pipeline", nargs="?", default=str(ROOT / "pipelines" / "shared_corpus.yaml"))
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument(
        "--docs",
        type=int,
        default=300,
        help="Run on the first N documents of each JSONL input (default 300; 0: the whole input).",
    )
    args = add_args(ap, repeats=1).parse_args()
    h = Harness(
        "worker_memory", args, note=f"{Path(args.pipeline).name}, docs per input {args.docs or 'all'}, {args.num_cpus} CPUs"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    runs = [run_once(args, env, show=r == h.repeats - 1) for r in range(h.repeats)]
    h.noise("wall", [r["wall"] for r in runs])
    if all("map_pss" in r for r in runs):
        h.figure(
            "task worker peak PSS (largest worker)",
            [r["map_pss"] for r in runs],
            "MiB",
            target=f"< {400e6 / 2**20:.0f} MiB (400 MB)",
        )
        h.figure("task worker peak RSS (largest worker)", [r["map_rss"] for r in runs], "MiB")
        h.figure("task worker peak USS (largest worker)", [r["map_uss"] for r in runs], "MiB")
    else:
        print("no task ran on a Ray worker (a run with one map task runs it in the driver)")
    h.figure("driver peak PSS", [r["driver_pss"] for r in runs], "MiB")
    h.figure("Ray's own processes: sum of peak PSS", [r["ray_own_pss"] for r in runs], "MiB")
    h.figure("whole tree peak PSS", [r["tree_pss"] for r in runs], "MiB")
    h.figure("whole tree peak RSS sum", [r["tree_rss"] for r in runs], "MiB")
    h.figure("wall", [r["wall"] for r in runs], "s")
    h.finish(pipeline=str(args.pipeline), docs=args.docs, num_cpus=args.num_cpus)


if __name__ == "__main__":
    main()
