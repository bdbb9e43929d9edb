"""Peak memory of each process of a `datapipe run`: the driver, every Ray worker, Ray's own processes.

    python bench/worker_memory.py                         # pipelines/shared_corpus.yaml
    python bench/worker_memory.py pipelines/demo.yaml --num-cpus 2

It runs the pipeline (fresh, into a temporary folder) as a subprocess and samples
/proc/<pid>/smaps_rollup of the whole process tree every 0.2 s. The target (issue 18) is map
workers under 400 MB each; per-process PSS is the honest figure (RSS counts each shared library
once per process), RSS is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _proctree_roles import mib, run_sampled  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pipeline", nargs="?", default=str(ROOT / "pipelines" / "shared_corpus.yaml"))
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--docs", type=int, help="Run on the first N documents of each JSONL input (a quick sample).")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    with tempfile.TemporaryDirectory(prefix="datapipe-mem-") as tmp:
        pipeline = sample_pipeline(Path(args.pipeline), args.docs, Path(tmp)) if args.docs else args.pipeline
        cmd = [sys.executable, "-m", "datapipe.cli", "run", str(pipeline), "--output", f"{tmp}/run", "--fresh",
               "--no-progress", "--num-cpus", str(args.num_cpus)]
        rc, wall, sampler = run_sampled(cmd, env, args.interval)
        timings = json.loads((Path(tmp) / "run" / "run.json").read_text()).get("timings", {}) if rc == 0 else {}
    if rc != 0:
        sys.exit(f"datapipe run failed (exit {rc})")
    print("phases (s):", ", ".join(f"{k} {v:.1f}" for k, v in timings.items()),
          f"| outside phases {wall - sum(timings.values()):.1f}")
    peaks = sorted(sampler.peaks.values(), key=lambda p: (p.role, -p.pss))
    print(f"pipeline: {args.pipeline}  ({args.num_cpus} CPUs, {os.cpu_count()} on the machine), wall {wall:.1f} s")
    print(f"{'process':<22}{'pid':>8}{'RSS MiB':>9}{'PSS MiB':>9}{'USS MiB':>9}  tasks seen")
    for p in peaks:
        if p.role == "other":
            continue
        titles = ",".join(sorted(t.removeprefix("ray::") for t in p.titles))
        print(f"{p.role:<22}{p.pid:>8}{mib(p.rss):>9}{mib(p.pss):>9}{mib(p.uss):>9}  {titles}")
    workers = [p for p in peaks if p.role == "worker"]
    map_workers = [p for p in workers if any("_map_task" in t for t in p.titles)]
    ray_own = [p for p in peaks if p.role.startswith("ray:")]
    if map_workers:
        print(f"map workers: {len(map_workers)}, peak RSS max {mib(max(p.rss for p in map_workers)).strip()} MiB, "
              f"peak PSS max {mib(max(p.pss for p in map_workers)).strip()} MiB "
              f"(target < {400e6 / 2**20:.0f} MiB = 400 MB)")
    print(f"Ray's own processes ({len(ray_own)}): sum of peak RSS {mib(sum(p.rss for p in ray_own)).strip()} MiB, "
          f"PSS {mib(sum(p.pss for p in ray_own)).strip()} MiB")
    print(f"whole tree: peak PSS {mib(sampler.tree_pss_peak).strip()} MiB, peak RSS sum "
          f"{mib(sampler.tree_rss_peak).strip()} MiB")


if __name__ == "__main__":
    main()
