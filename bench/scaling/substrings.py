"""The substrings stage (exact repeated spans): throughput, memory per task from 1x to 16x, share removed.

    python -m bench.scaling.substrings [--scales 1,4,16] [--cpus 2] [--min-tokens 50] [--json PATH]
    python -m bench.scaling.substrings --combine 1x.json 4x.json 16x.json --json PATH   # runs made side by side

Part 1, the shared corpus as it is (../shared/data/corpus, four JSONL files, one source each): one
``datapipe run`` of the substrings stage alone, and the share of characters removed per source and
language (zh: the three Chinese files, en: English Wikipedia), with the documents rejected as
substring_only and the spans removed from the most documents.

Part 2, scale: s x the shared corpus's size in real zh/en documents, every copy perturbed
(bench/_support/scale_corpus.py: a fifth of its Han characters and words replaced by corpus-frequency
draws, so two copies share a 50-token span with probability about 0.64^50 per window) plus 5%
exact and 5% near planted copies, each at most half a file after its original (the exact ones are
whole-document repeats, which the stage cuts). ``--files-per-scale`` x s files, one map task
each, and as many partitions per round, so a task holds the same amount of work at every scale.
Measured per scale: input MB per wall second
per core (``--cpus``), MB per CPU second of the whole process tree (Ray included; it does not
depend on the load), and per phase the largest task's peak RSS (VmHWM, reset at task start,
datapipe/runtime/task_usage.py). Printed last: the largest task's peak RSS at the last scale over
the first (target <= 1.2). No reference tool: google-research/deduplicate-text-datasets needs a
Rust toolchain (cargo), which this machine does not have and cannot fetch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._support.corpus import CORPUS, FILES
from bench._support.harness import Harness, add_args
from bench._support.paths import ROOT
from bench._support.proctree import run_tree
from bench._support.scale_corpus import load_base, write_corpus
from bench.scaling.scale import read_markers

MIB = 1 << 20


def pipeline(
    sources: list[dict[str, Any]], min_tokens: int, partitions: int, target_bytes: int, recycle_mib: int | None = None
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "substrings",
        "sources": sources,
        "stages": [{"substrings": {"min_tokens": min_tokens, "partitions": partitions, "kinds": ["web", "text"]}}],
        "split": {"target_bytes": target_bytes, "min_tasks_per_cpu": 0, "group_small_files": False},
    }
    if recycle_mib is not None:  # else the default of workers.recycle_above_mib
        config["workers"] = {"recycle_above_mib": recycle_mib}
    return config


def run(work: Path, config: dict[str, Any], cpus: int) -> dict[str, Any]:
    import yaml

    (work / "pipeline.yaml").write_text(yaml.safe_dump(config, allow_unicode=True))
    out = work / "out"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "datapipe.cli", "run", str(work / "pipeline.yaml"), "-o", str(out)]
    cmd += ["--num-cpus", str(cpus), "--no-progress", "--fresh"]
    r = run_tree(cmd, 0.2, env=env, log=work / "datapipe.log")
    if r["rc"] != 0:
        raise SystemExit(f"datapipe run failed (rc {r['rc']}):\n" + (work / "datapipe.log").read_text()[-3000:])
    markers = read_markers(out)
    phases = {
        p: {
            "tasks": len(ms),
            "task_cpu_s": round(sum(m.get("cpu_seconds", 0.0) for m in ms), 2),
            "task_peak_rss_mib_max": max((m["peak_rss_mib"] for m in ms if "peak_rss_mib" in m), default=None),
            # what the worker held when the task started (a reused worker keeps what it allocated before)
            "task_start_rss_mib_max": max((m["rss_start_mib"] for m in ms if "rss_start_mib" in m), default=None),
            "worker_exits": sum("worker_exit" in m for m in ms),
        }
        for p, ms in sorted(markers.items())
    }
    every = [m for ms in markers.values() for m in ms]
    return {
        "out": out,
        "wall_s": r["wall_s"],
        "cpu_s": r["cpu_s"],
        "tree_peak_rss_mib": r["peak_rss_mib"],
        "phases": phases,
        # Ray worker processes that ran a task, and how many of them made way for a fresh one (engine/executors/ray/recycle.py)
        "workers": len({m["worker_pid"] for m in every if "worker_pid" in m}),
        "worker_exits": sum("worker_exit" in m for m in every),
    }


def removed_by_source(out: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    from datapipe.audit.sql import connect

    with connect(out) as con:
        rows = con.execute("""
            SELECT source, count(*), count(*) FILTER (substr_spans_removed > 0), sum(substr_spans_removed),
                   sum(substr_chars_removed),
                   sum(substr_chars_removed) / sum(n_chars + CASE WHEN reason = 'substring_only' THEN 0
                                                   ELSE coalesce(substr_chars_removed, 0) END),
                   count(*) FILTER (reason = 'substring_only'),
                   sum(n_chars + CASE WHEN reason = 'substring_only' THEN 0 ELSE coalesce(substr_chars_removed, 0) END)
            FROM documents GROUP BY source ORDER BY source""").fetchall()
        top = con.execute("""SELECT left(replace(span, chr(10), ' '), 70), count(*) n FROM removed_spans
                             GROUP BY 1 ORDER BY n DESC, 1 LIMIT 8""").fetchall()
    return rows, top


def shared_corpus(args: argparse.Namespace, h: Harness) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="dp-substr-", dir=args.tmp))
    try:
        sources = [{"name": f.split(".")[0], "kind": "text", "format": "jsonl", "paths": [str(CORPUS / f)]} for f in FILES]
        mb = sum((CORPUS / f).stat().st_size for f in FILES) / 1e6
        r = run(work, pipeline(sources, args.min_tokens, args.files_per_scale, 1 << 30), args.cpus)
        rows, top = removed_by_source(r["out"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n--- the shared corpus ({mb:.1f} MB, {len(FILES)} files): wall {r['wall_s']:.1f} s, tree CPU {r['cpu_s']:.1f} s")
    print(f"{'source':<20} {'docs':>7} {'lost spans':>10} {'spans':>7} {'chars removed':>13} {'share':>7} {'rejected':>8}")
    by_lang: dict[str, list[float]] = {}
    for source, n, hit, spans, chars, share, rej, total in rows:
        print(f"{source:<20} {n:>7,} {hit:>10,} {spans or 0:>7,} {chars or 0:>13,} {share or 0:>7.2%} {rej:>8,}")
        lang = "en" if source.startswith("en") else "zh"
        acc = by_lang.setdefault(lang, [0.0, 0.0])
        acc[0] += chars or 0
        acc[1] += total or 0
    for lang, (chars, total) in sorted(by_lang.items()):
        h.figure(f"shared corpus: {lang} characters removed", [100 * chars / total], unit="%")
    print("spans removed from the most documents:")
    for span, n in top:
        print(f"  {n:>5}  {span}")
    return {"mb": mb, "wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "by_source": rows, "top": top, "phases": r["phases"]}


def scale_run(scale: int, args: argparse.Namespace, base: Any, base_docs: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="dp-substr-", dir=args.tmp))
    try:
        files = scale * args.files_per_scale
        # Plants at most half a file after their original: with write_corpus's default window (200,000
        # documents, more than the corpus) they all land in the last files, so the busiest task's
        # repeated text grew with the scale (1x: 40% of the last file, 4x: the last 1.6 files whole).
        window = max(1, base_docs // args.files_per_scale // 2)
        corpus = write_corpus(work / "input", base, scale * base_docs, files, rate=0.05, p=0.2, window=window, seed=scale)
        largest = max(f.stat().st_size for f in corpus.files)
        sources = [{"name": "web", "kind": "web", "format": "jsonl", "paths": [str(work / "input" / "*.jsonl")]}]
        r = run(work, pipeline(sources, args.min_tokens, files, largest + MIB, args.recycle_above_mib), args.cpus)
        rows, _ = removed_by_source(r["out"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mb = corpus.bytes / 1e6
    maps = [p for p in r["phases"] if p.startswith("map")]
    rounds = [p for p in r["phases"] if p.startswith("shuffle")]

    def peak(names: list[str]) -> float:
        return max((r["phases"][p]["task_peak_rss_mib_max"] or 0) for p in names) if names else 0.0

    res = {
        "scale": scale,
        "docs": corpus.docs,
        "mb": mb,
        "files": files,
        "wall_s": r["wall_s"],
        "cpu_s": r["cpu_s"],
        "mb_s_per_core": mb / r["wall_s"] / args.cpus,
        "mb_per_cpu_s": mb / r["cpu_s"],
        "map_task_peak_mib": peak(maps),
        "round_task_peak_mib": peak(rounds),
        "share_removed": (rows[0][4] or 0) / rows[0][7] if rows else 0.0,
        "phases": r["phases"],
        "workers": r["workers"],
        "worker_exits": r["worker_exits"],
        "recycle_above_mib": args.recycle_above_mib,
    }
    print(
        f"{scale:>3}x {corpus.docs:>9,} docs {mb:>7.0f} MB {files:>4} tasks: wall {r['wall_s']:>6.0f} s, "
        f"{res['mb_s_per_core']:.2f} MB/s per core, {res['mb_per_cpu_s']:.2f} MB per CPU s; largest task peak RSS: "
        f"map {res['map_task_peak_mib']:.0f} MiB, rounds {res['round_task_peak_mib']:.0f} MiB; "
        f"removed {res['share_removed']:.2%} of characters; {r['workers']} workers ran tasks, "
        f"{r['worker_exits']} made way for a fresh one",
        flush=True,
    )
    print(
        "     per phase (tasks, task CPU s, largest task peak RSS MiB, largest RSS a task started from, "
        "workers that made way after a task): "
        + "; ".join(
            f"{p} {v['tasks']}, {v['task_cpu_s']:.0f}, {v['task_peak_rss_mib_max'] or 0:.0f}, "
            f"{v['task_start_rss_mib_max'] or 0:.0f}, {v['worker_exits']}"
            for p, v in r["phases"].items()
        ),
        flush=True,
    )
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", default="1,4,16", help='comma-separated multiples of the shared corpus; "" for none')
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--min-tokens", type=int, default=50)
    ap.add_argument("--files-per-scale", type=int, default=4)
    ap.add_argument("--skip-shared", action="store_true", help="only the scale runs")
    ap.add_argument("--tmp", default=None, help="where the corpora and runs are written")
    ap.add_argument(
        "--recycle-above-mib",
        type=int,
        default=None,
        help="the scale runs' workers.recycle_above_mib (0: workers are never replaced); default: the pipeline default",
    )
    ap.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="run nothing: the figures and ratios of the scale runs recorded in these --json files of this "
        "script (one scale each, run side by side), in the order given",
    )
    a = add_args(ap, repeats=1).parse_args()
    h = Harness("substrings", a, libs=["numba", "opencc"])
    if a.combine:
        results = [r for f in a.combine for r in json.loads(f.read_text())["extra"]["scales"]]
        for f in a.combine:  # each run's own noise (this process ran nothing)
            noise = json.loads(f.read_text())["noise"]
            print(f"{f}: load average {noise['loadavg_before'][0]:.1f} before, {noise['loadavg_after'][0]:.1f} after")
        noise = [json.loads(f.read_text())["noise"] for f in a.combine]
        h.load_before = max((n["loadavg_before"] for n in noise), key=lambda x: x[0])  # the busiest run's, not this process's
        return figures(h, results, shared=None, sources=[str(f) for f in a.combine], runs_noise=noise)
    shared = None if a.skip_shared else shared_corpus(a, h)
    if not a.scales:  # --scales "": the shared corpus only
        h.finish(shared=shared)
        return 0
    base = load_base(max_chars=20_000)
    mb_target = sum((CORPUS / f).stat().st_size for f in FILES)
    base_docs = max(1, int(mb_target / base.mean_bytes()))
    print(f"\n--- scale runs: 1x = {base_docs:,} regular documents (about the shared corpus's {mb_target / 1e6:.0f} MB)")
    results = [scale_run(int(s), a, base, base_docs) for s in a.scales.split(",")]
    return figures(h, results, shared=shared)


def figures(h: Harness, results: list[dict[str, Any]], **extra: Any) -> int:
    """The figures of each scale and the ratios of the last scale to the first."""
    first, last = results[0], results[-1]
    s0, s1 = first["scale"], last["scale"]
    for r in results:
        h.figure(f"{r['scale']}x MB/s per core", [r["mb_s_per_core"]], unit="MB/s")
        h.figure(f"{r['scale']}x MB per CPU second (process tree)", [r["mb_per_cpu_s"]], unit="MB")
    if len(results) < 2:  # one scale: no ratio to state (a run to set beside another's, --combine)
        h.finish(scales=results, **extra)
        return 0
    h.ratio(f"largest map task peak RSS {s1}x/{s0}x", [last["map_task_peak_mib"] / first["map_task_peak_mib"]], target="<= 1.2")
    h.ratio(
        f"largest round task peak RSS {s1}x/{s0}x", [last["round_task_peak_mib"] / first["round_task_peak_mib"]], target="<= 1.2"
    )
    h.ratio(f"MB per CPU second {s1}x/{s0}x", [last["mb_per_cpu_s"] / first["mb_per_cpu_s"]], target="~ 1")
    h.finish(scales=results, **extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
