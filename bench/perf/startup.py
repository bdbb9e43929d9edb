"""The fixed cost of a `datapipe run`: wall time outside every phase (start-up, Ray, imports, shutdown).

    python -m bench.perf.startup                    # a tiny pipeline (40 demo documents), 3 repeats
    python -m bench.perf.startup --in-process       # also: the tiny pipeline without Ray
    python -m bench.perf.startup --ray              # also: the tiny pipeline on embedded Ray
    python -m bench.perf.startup --tokenize-only    # also: a tokenize-only run on the shared corpus
    python -m bench.perf.startup --json bench/results/startup.json

Each repeat runs `datapipe run --fresh` in a subprocess and reads the phase timings from the
run's run.json; the fixed overhead is the wall time minus the sum of the phases (map, reduce,
pack, stats). The target (issue 18) is under 2 s. Also printed: the import time of the CLI for
`datapipe --help` (which must not import Ray, numba or torch). The variants alternate within each
of the ``--repeats`` rounds (``bench/_support/harness.py``: machine, date, median and range, ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._support.harness import Harness, add_args
from bench._support.paths import ROOT, SHARED

CORPUS = SHARED / "corpus"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def tiny_pipeline(tmp: Path, docs: int) -> Path:
    """The demo's first ``docs`` documents of each language through langid, length and tokenize."""
    paths = []
    for lang in ("zh", "en"):
        src = sorted((ROOT / "pipelines" / "demo" / "data").glob(f"web_{lang}-*.jsonl"))[0]
        out = tmp / f"web_{lang}.jsonl"
        with open(src, encoding="utf-8") as f:
            out.write_text("".join(line for _, line in zip(range(docs // 2), f)), encoding="utf-8")
        paths.append(out)
    spec = {
        "name": "tiny",
        "sources": [{"name": "web", "kind": "web", "paths": [str(p) for p in paths]}],
        "stages": [{"langid": {"keep": ["zh", "en"]}}, {"length": {"min_chars": 20}}],
        "tokenize": {"tokenizer": str(ROOT / "tokenizer" / "demo.json"), "seq_len": 512},
    }
    path = tmp / "tiny.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def tokenize_only_pipeline(tmp: Path) -> Path:
    spec = {
        "name": "tokenize_only",
        "sources": [{"name": p.stem, "kind": "web", "paths": [str(p)]} for p in sorted(CORPUS.glob("*.jsonl"))],
        "stages": [],
        "tokenize": {"tokenizer": str(ROOT / "tokenizer" / "demo.json"), "seq_len": 2048},
    }
    path = tmp / "tokenize_only.yaml"
    path.write_text(json.dumps(spec))
    return path


def timed_run(
    pipeline: Path, out: Path, num_cpus: int, in_process: bool = False, ray: bool = False
) -> tuple[float, dict[str, float], float]:
    """Wall seconds, the run's phase timings, and the CPU seconds of the run's process (user + sys of it
    and the children it waited for: Ray daemons it leaves behind are not counted)."""
    cmd = [
        sys.executable,
        "-m",
        "datapipe.cli",
        "run",
        str(pipeline),
        "--output",
        str(out),
        "--fresh",
        "--no-progress",
        *(["--in-process"] if in_process else ["--num-cpus", str(num_cpus)]),
        *(["--ray"] if ray else []),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"datapipe run failed:\n{proc.stderr[-3000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, json.loads((out / "run.json").read_text())["timings"], cpu


def help_import_seconds() -> tuple[float, list[str]]:
    """Wall time of `datapipe --help`, and which heavy modules it imported."""
    # The CLI ends its process with os._exit after the exit handlers (cli._Program): report from one.
    probe = (
        "import atexit, runpy, sys\nsys.argv = ['datapipe', '--help']\n"
        "atexit.register(lambda: print('HEAVY', *[m for m in ('ray', 'numba', 'torch', 'pyarrow', 'duckdb', "
        "'tokenizers') if m in sys.modules], file=sys.stderr))\n"
        "runpy.run_module('datapipe.cli', run_name='__main__')"
    )
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", probe], env=_env(), capture_output=True, text=True)
    wall = time.perf_counter() - started
    heavy = next((line.split()[1:] for line in proc.stderr.splitlines() if line.startswith("HEAVY")), ["?"])
    return wall, heavy


def report(h: Harness, label: str, runs: list[tuple[float, dict[str, float], float]]) -> None:
    walls = [w for w, _, _ in runs]
    fixed = [w - sum(t.values()) for w, t, _ in runs]
    h.figure(f"{label}: fixed overhead outside phases", fixed, "s", target="< 2 s")
    h.figure(f"{label}: wall", walls, "s")
    # On a loaded machine wall time stretches with the load; CPU time mostly does not.
    h.figure(f"{label}: CPU of the run process", [c for _, _, c in runs], "s")
    last = runs[-1][1]
    print("  phases of the last run (s): " + ", ".join(f"{k} {v:.2f}" for k, v in last.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=40)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--in-process", action="store_true", help="Also time the tiny pipeline with --in-process (no Ray).")
    ap.add_argument(
        "--ray",
        action="store_true",
        help="Also time the tiny pipeline with --ray (its default is one map task, which runs in the driver).",
    )
    ap.add_argument("--tokenize-only", action="store_true", help="Also time a tokenize-only run of the shared corpus.")
    args = add_args(ap, repeats=3).parse_args()
    h = Harness("startup", args)
    heavy: list[str] = []

    def help_run() -> float:
        wall, found = help_import_seconds()
        heavy[:] = found
        return wall

    # Untimed, once per install (a first run would do it itself): compile the numba kernels.
    subprocess.run([sys.executable, "-m", "datapipe.runtime.kernel_warmup"], env=_env(), capture_output=True)
    with tempfile.TemporaryDirectory(prefix="datapipe-startup-") as tmp_name:
        tmp = Path(tmp_name)
        pipeline = tiny_pipeline(tmp, args.docs)
        tiny = f"tiny pipeline ({args.docs} docs)"
        sides = {"datapipe --help": help_run, f"{tiny}, default": lambda: timed_run(pipeline, tmp / "out", args.num_cpus)}
        if args.ray:
            sides[f"{tiny}, --ray"] = lambda: timed_run(pipeline, tmp / "out", args.num_cpus, ray=True)
        if args.in_process:
            sides[f"{tiny}, --in-process"] = lambda: timed_run(pipeline, tmp / "out", args.num_cpus, True)
        if args.tokenize_only:
            if not CORPUS.is_dir():
                sys.exit(f"no shared corpus at {CORPUS}")
            tok = tokenize_only_pipeline(tmp)
            sides["tokenize-only, shared corpus"] = lambda: timed_run(tok, tmp / "tok", args.num_cpus)
        runs = h.interleave(sides)
    print(f"datapipe --help: heavy modules imported: {', '.join(heavy) or 'none'}")
    h.figure("datapipe --help", runs.pop("datapipe --help"), "s")
    h.noise(f"{tiny}, default wall", [w for w, _, _ in runs[f"{tiny}, default"]])
    for label, rs in runs.items():
        report(h, label, rs)
    h.finish(help_heavy_modules=heavy, docs=args.docs, num_cpus=args.num_cpus)


if __name__ == "__main__":
    main()
