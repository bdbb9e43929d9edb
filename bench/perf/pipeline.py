"""The whole pipeline, datapipe against datatrove, on the same input: wall, process-tree CPU, peak tree memory.

    python -m bench.perf.pipeline --datatrove-python /tmp/dt/bin/python [--repeats 3] [--docs 0]
    python -m bench.perf.pipeline --stages tokenize ...     # tokenize-only comparison
    python -m bench.perf.pipeline --sides datapipe ...      # datapipe's runs only (A/B of its changes)
    [--workers 2] [--files 2] [--json bench/results/pipeline.json]

Input: the shared zh/en corpus (../shared/data/corpus, all four files; ``--docs N`` takes the first
N documents of a seeded shuffle), dealt round-robin into ``--files`` JSONL files so every task gets
the same mix. Both sides read those files with ``--workers`` processes:

  datapipe   ``datapipe run`` in a subprocess (``--num-cpus workers``; ``--mode``: its default executor,
             which runs a one-map-task run or a run without stages of up to 128 MiB (tokenize-only)
             in the driver and any other on embedded Ray, or forced):
             langid(zh, en) -> quality(auto) -> dedup(exact) -> minhash(0.7) -> tokenize (--tokenizer)
  datatrove  bench/_support/datatrove_pipeline.py in the datatrove venv: LanguageFilter(zh, en) -> Gopher
             repetition -> Gopher quality -> C4 -> FineWeb -> exact dedup (3 blocks) -> MinHash
             (4 blocks) -> DocumentTokenizer with the same tokenizer file (``--tokenizer``: by default the
             32k byte-level BPE of bench/_support/bench_tokenizer.py, trained on this corpus; ``demo`` for the 2.7k demo one)

Runs alternate datapipe, datatrove, datapipe, ... (--repeats pairs), each from a fresh output
folder. Each run is measured as a process tree (bench/_support/proctree.py: subreaper + RUSAGE_CHILDREN
for exact tree CPU, /proc sampling for peak RSS/PSS summed over the tree), so Ray's raylet, GCS
and workers and datatrove's pool workers are all counted, start-up and shutdown included.
Ratios are per pair: datatrove / datapipe for wall and CPU (> 1: datapipe is faster) and
datapipe / datatrove for memory (< 1: datapipe uses less). Documents kept per language are
counted from each side's output (datapipe's ``lang`` column, datatrove's LanguageFilter label).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._support.bench_tokenizer import resolve
from bench._support.corpus import CORPUS, FILES
from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import ROOT
from bench._support.proctree import run_tree

DT_SCRIPT = ROOT / "bench" / "_support" / "datatrove_pipeline.py"


def prepare_input(folder: Path, docs: int, files: int, seed: int = 0) -> dict[str, int]:
    """Deal the corpus documents (original JSONL lines) round-robin into ``files`` files."""
    lines: list[str] = []
    for name in FILES:
        with open(CORPUS / name, encoding="utf-8") as f:
            lines.extend(line for line in f if line.strip())
    random.Random(seed).shuffle(lines)
    if docs:
        lines = lines[:docs]
    folder.mkdir(parents=True, exist_ok=True)
    outs = [open(folder / f"part-{i:02d}.jsonl", "w", encoding="utf-8") for i in range(files)]
    per_lang: collections.Counter[str] = collections.Counter()
    for i, line in enumerate(lines):
        outs[i % files].write(line if line.endswith("\n") else line + "\n")
        per_lang[json.loads(line).get("lang", "?")] += 1
    for f in outs:
        f.close()
    return dict(per_lang)


def datapipe_yaml(inp: Path, stages: str, tokenizer: Path) -> str:
    body = [
        "name: bench_pipeline",
        "sources:",
        "  - name: corpus",
        "    kind: web",
        "    format: jsonl",
        f"    paths: [{json.dumps(str(inp / '*.jsonl'))}]",
    ]
    if stages == "tokenize":
        body += ["stages: []"]
    else:
        body += [
            "stages:",
            "  - langid: {keep: [zh, en]}",
            "  - quality: {rules: auto}",
            "  - dedup: {exact: true}",
            "  - minhash: {threshold: 0.7}",
        ]
    body += ["tokenize:", f"  tokenizer: {json.dumps(str(tokenizer))}", "  seq_len: 2048"]
    return "\n".join(body) + "\n"


def kept_datapipe(out: Path) -> dict[str, int]:
    import pyarrow.parquet as pq

    counts: collections.Counter[str] = collections.Counter()
    for f in sorted(glob.glob(str(out / "docs" / "**" / "*.parquet"), recursive=True)):
        pf = pq.ParquetFile(f)
        if "lang" in pf.schema_arrow.names:
            counts.update(str(x) for x in pf.read(columns=["lang"])["lang"].to_pylist())
        else:
            counts["(no lang column)"] += pf.metadata.num_rows
    return dict(counts)


def kept_datatrove(work: Path) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for f in sorted(glob.glob(str(work / "final" / "*.jsonl*"))):
        with gzip.open(f, "rt", encoding="utf-8") if f.endswith(".gz") else open(f, encoding="utf-8") as fh:
            for line in fh:
                counts[json.loads(line).get("metadata", {}).get("language", "?")] += 1
    return dict(counts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--datatrove-python",
        default="/tmp/dt/bin/python",
        help="python of a venv with datatrove[processing] and spacy (the datatrove side is skipped when it is missing)",
    )
    ap.add_argument("--stages", choices=["all", "tokenize"], default="all")
    ap.add_argument(
        "--sides",
        choices=["both", "datapipe"],
        default="both",
        help="datapipe: its runs only (an A/B of datapipe changes in ~1 min a run; no ratios), without datatrove's ~5 min",
    )
    ap.add_argument("--docs", type=int, default=0, help="documents from the corpus (0: all 27,369)")
    ap.add_argument("--files", type=int, default=2, help="input files (= tasks of each side's first step)")
    ap.add_argument("--workers", type=int, default=2, help="processes per side (Ray CPUs / datatrove workers)")
    ap.add_argument(
        "--tokenizer",
        default="bpe32k",
        help="bpe32k (default: a 32k byte-level BPE trained on the corpus once, kept in the cache folder; "
        "bench/_support/bench_tokenizer.py), demo (tokenizer/demo.json, 2.7k) or a tokenizer.json path; both sides use it",
    )
    ap.add_argument(
        "--mode",
        choices=["auto", "ray", "in-process"],
        default="auto",
        help="datapipe's executor: its default (auto: in the driver when the run has one map task), "
        "or forced with --ray / --in-process",
    )
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between /proc samples")
    ap.add_argument("--work", type=Path, help="work folder (default: a temporary one, removed after)")
    args = add_args(ap, repeats=3).parse_args()
    tokenizer_name = args.tokenizer if args.tokenizer in ("bpe32k", "demo") else Path(args.tokenizer).name
    args.tokenizer = resolve(args.tokenizer)
    h = Harness(
        f"pipeline{'_tokenize' if args.stages == 'tokenize' else ''}",
        args,
        libs=["ray", "tokenizers", "fastokens", "tiktoken", "fasttext-numpy2", "numba", "duckdb"],
        note=f"tokenizer: {tokenizer_name} ({args.tokenizer})",
    )
    have_dt = args.sides == "both" and Path(args.datatrove_python).exists()
    dt_version = "skipped"
    if have_dt:
        dt_version = (
            subprocess.run(
                [
                    args.datatrove_python,
                    "-c",
                    "from importlib.metadata import version as v; "
                    "print(*(v(p) for p in ('datatrove', 'spacy', 'tokenizers', 'orjson')))",
                ],
                capture_output=True,
                text=True,
            ).stdout.strip()
            or "does not import"
        )
        print(f"datatrove venv {args.datatrove_python}: datatrove, spacy, tokenizers, orjson = {dt_version}")

    work = args.work or Path(tempfile.mkdtemp(prefix="dp-bench-pipeline-"))
    try:
        inp = work / "input"
        inputs = prepare_input(inp, args.docs, args.files)
        n_docs = sum(inputs.values())
        print(
            f"input: {n_docs:,} documents ({', '.join(f'{k} {v:,}' for k, v in sorted(inputs.items()))}) "
            f"in {args.files} files; {args.workers} workers each side; stages: {args.stages}"
        )
        (work / "pipeline.yaml").write_text(datapipe_yaml(inp, args.stages, args.tokenizer.resolve()))

        from datapipe.assets.models import ensure_lid_model

        lid = str(ensure_lid_model())
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        dt_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        dt_env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="true")
        kept: dict[str, dict[str, int]] = {}

        def report(side: str, r: dict) -> None:  # each run as it ends: a long run cut short still tells
            print(
                f"  {side} run: wall {r['wall_s']:.1f} s, tree CPU {r['cpu_s']:.1f} s ({r['cpu_method']}), "
                f"peak tree RSS {r['peak_rss_mib']:,.0f} MiB, PSS {r['peak_pss_mib']:,.0f} MiB, "
                f"kept {kept.get(side)}",
                flush=True,
            )

        def datapipe() -> dict:
            out = work / "dp-out"
            shutil.rmtree(out, ignore_errors=True)
            cmd = [
                sys.executable,
                "-m",
                "datapipe.cli",
                "run",
                str(work / "pipeline.yaml"),
                "-o",
                str(out),
                "--no-progress",
                "--fresh",
            ]
            # --in-process refuses --num-cpus (no Ray); the others size the embedded Ray (auto: its plan)
            cmd += ["--in-process"] if args.mode == "in-process" else ["--num-cpus", str(args.workers)]
            cmd += ["--ray"] if args.mode == "ray" else []
            r = run_tree(cmd, args.interval, env=env, log=work / "datapipe.log")
            if r["rc"] != 0:
                raise SystemExit(
                    f"datapipe run failed (rc {r['rc']}):\n" + (work / "datapipe.log").read_text(errors="replace")[-3000:]
                )
            kept["datapipe"] = kept_datapipe(out)
            report("datapipe", r)
            return r

        def datatrove() -> dict:
            out = work / "dt-out"
            shutil.rmtree(out, ignore_errors=True)
            cfg = {
                "input": str(inp),
                "work": str(out),
                "workers": args.workers,
                "files": args.files,
                "stages": args.stages,
                "tokenizer": str(args.tokenizer.resolve()),
                "eos_token": "<|endoftext|>",
                "lid_model": lid,
            }
            (work / "dt-config.json").write_text(json.dumps(cfg))
            r = run_tree(
                [args.datatrove_python, str(DT_SCRIPT), str(work / "dt-config.json")],
                args.interval,
                env=dt_env,
                log=work / "datatrove.log",
            )
            if r["rc"] != 0:
                raise SystemExit(
                    f"datatrove failed (rc {r['rc']}):\n" + (work / "datatrove.log").read_text(errors="replace")[-3000:]
                )
            lines = (work / "datatrove.log").read_text(errors="replace").strip().splitlines()
            r["block_timings"] = next((json.loads(x)["timings"] for x in reversed(lines) if x.startswith("{")), {})
            kept["datatrove"] = kept_datatrove(out)
            report("datatrove", r)
            return r

        # Untimed, as `pip install` does for datatrove's venv: byte-compile datapipe. An editable checkout
        # run under PYTHONDONTWRITEBYTECODE=1 would otherwise compile every module it imports in every
        # run and every Ray worker (about 5% of a small run's samples).
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "datapipe")], capture_output=True)
        # Likewise once per install: the numba kernels (a first run would compile them itself, ~6 CPU s).
        subprocess.run([sys.executable, "-m", "datapipe.runtime.kernel_warmup"], env=env, capture_output=True)
        if have_dt and args.stages != "tokenize":  # untimed: datatrove copies lid.176 into its cache once
            subprocess.run(
                [
                    args.datatrove_python,
                    "-c",
                    "import sys; from datatrove.io import "
                    "cached_asset_path_or_download as c; c(sys.argv[1], namespace='lid', subfolder='ft176')",
                    lid,
                ],
                env=dt_env,
                capture_output=True,
            )
        sides = {"datapipe": datapipe}
        if have_dt:
            sides["datatrove"] = datatrove
        else:
            why = "--sides datapipe" if args.sides == "datapipe" else f"{args.datatrove_python} not found"
            print(f"datatrove: skipped ({why})")
        runs = h.interleave(sides)
        print()
        for side, rs in runs.items():
            h.figure(f"{side} wall", [r["wall_s"] for r in rs], "s")
            h.figure(f"{side} process-tree CPU", [r["cpu_s"] for r in rs], "s")
            h.figure(f"{side} process-tree CPU, sampled (lower bound)", [r["cpu_sampled_s"] for r in rs], "s")
            h.figure(f"{side} peak tree RSS (sum)", [r["peak_rss_mib"] for r in rs], "MiB")
            h.figure(f"{side} peak tree PSS (sum)", [r["peak_pss_mib"] for r in rs], "MiB")
            print(
                f"  {side}: up to {max(r['max_procs'] for r in rs)} processes at once, "
                f"{max(r['processes_seen'] for r in rs)} seen in a run"
            )
        if "datatrove" in runs:
            h.noise("datatrove wall", [r["wall_s"] for r in runs["datatrove"]])
            dp, dt = runs["datapipe"], runs["datatrove"]
            print()
            h.ratio(
                "wall datatrove/datapipe",
                pair_ratios([r["wall_s"] for r in dt], [r["wall_s"] for r in dp]),
                # the goals of issue 34 (whole pipeline with a 32k vocabulary; tokenize-only)
                target=">= 12" if args.stages == "all" else ">= 3",
            )
            h.ratio(
                "tree CPU datatrove/datapipe",
                pair_ratios([r["cpu_s"] for r in dt], [r["cpu_s"] for r in dp]),
                target=">= 15" if args.stages == "all" else "",
            )
            h.ratio(
                "peak tree RSS datapipe/datatrove",
                pair_ratios([r["peak_rss_mib"] for r in dp], [r["peak_rss_mib"] for r in dt]),
                target="<= 1",
            )
            h.ratio(
                "peak tree PSS datapipe/datatrove",
                pair_ratios([r["peak_pss_mib"] for r in dp], [r["peak_pss_mib"] for r in dt]),
                target="<= 1",
            )
            print(
                "  datatrove block wall times (last run): "
                + ", ".join(f"{k} {v:.1f}s" for k, v in dt[-1]["block_timings"].items())
            )
        if args.stages != "tokenize":
            print()
            print(f"input per language (corpus label): {inputs}")
            for side, k in kept.items():
                print(f"kept per language, {side}: {dict(sorted(k.items(), key=lambda kv: -kv[1]))} (total {sum(k.values()):,})")
        h.finish(
            input_docs=n_docs,
            input_per_lang=inputs,
            kept_per_lang=kept,
            workers=args.workers,
            mode=args.mode,
            files=args.files,
            stages=args.stages,
            tokenizer=tokenizer_name,
            tokenizer_path=str(args.tokenizer),
            datatrove=dt_version,
            runs=runs,
        )
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
