"""Where a whole-pipeline run's CPU goes: per process role, per phase's tasks, the driver's sections.

    python -m bench.perf.cpu_where [--repeats 3] [--docs 0] [--json bench/results/cpu_where.json]
    python -m bench.perf.cpu_where --pythonpath /tmp/old-checkout ...   # A/B: another checkout interleaved

The run is bench/perf/pipeline.py's datapipe side (langid -> quality -> dedup(exact) -> minhash ->
tokenize, 32k BPE, ``--num-cpus 2``, embedded Ray) measured as a process tree (bench/_support/proctree.py:
exact tree CPU). Beside it, per run:

* CPU by process role (driver, Ray workers, raylet, GCS, the agents' stand-ins, the watchdog), from
  /proc samples every 0.1 s of each process's own utime + stime (a process's last sample: a lower bound
  that misses at most its last 0.1 s);
* the tasks' own CPU per phase, from the completion markers (``cpu_seconds``): the workers' CPU less
  that is what they spend outside tasks (Ray's start and its loop, imports, idle);
* the driver's CPU by section, from run.json (``driver_cpu_s``: the start, each phase, the end).

``--pythonpath``: runs with that checkout's datapipe too (PYTHONPATH), interleaved with this one under
the same load: the before/after of a change in tree CPU, the robust figure on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import defaultdict
from pathlib import Path

from bench._support.bench_tokenizer import resolve
from bench._support.harness import Harness, add_args, pair_ratios
from bench._support.paths import ROOT
from bench._support.proctree import descendants, run_tree
from bench._support.proctree_roles import cmdline, role_of
from bench.perf.pipeline import datapipe_yaml, prepare_input

_TICK = os.sysconf("SC_CLK_TCK")


def _role(pid: int, driver: int) -> str:
    cmd = cmdline(pid)
    role = role_of(pid, driver, cmd)  # the driver, raylet and GCS (by executable) and workers first:
    if role != "other":  # the raylet's own command line names the agents' stand-in script
        return role
    if "agent_stub.py" in cmd.split(" -- ")[0]:
        return "ray:agent stand-ins"
    if "-I -S -c" in cmd:
        return "watchdog"
    return role


def measured_run(cmd: list[str], env: dict[str, str], log: Path) -> dict:
    """``run_tree`` of ``cmd`` plus each process's CPU by role (sampled, see the module docstring)."""
    last: dict[tuple[int, int], int] = {}
    roles: dict[tuple[int, int], str] = {}
    stop = threading.Event()
    me = os.getpid()

    def sample() -> None:
        while not stop.is_set():
            tree = descendants(me)
            driver = next((pid for pid, s in tree.items() if s[0] == me), -1)
            for pid, (_, ticks, started, _) in tree.items():
                key = (pid, started)
                last[key] = ticks
                # a process is seen first between fork and exec, under its parent's command line
                if roles.get(key) in (None, "driver", "other"):
                    roles[key] = _role(pid, driver)
            stop.wait(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    r = run_tree(cmd, 0.2, env=env, log=log)
    stop.set()
    thread.join()
    by_role: defaultdict[str, float] = defaultdict(float)
    for key, ticks in last.items():
        by_role[roles.get(key, "other")] += ticks / _TICK
    r["cpu_by_role"] = dict(sorted(by_role.items(), key=lambda kv: -kv[1]))
    return r


def task_cpu(out: Path) -> dict[str, float]:
    """The tasks' own CPU seconds per phase (``cpu_seconds`` of each completion marker)."""
    per: defaultdict[str, float] = defaultdict(float)
    for marker in (out / "_work" / "markers").rglob("*.json"):
        phase = marker.relative_to(out / "_work" / "markers").parts[0]
        phase = "minhash rounds" if phase.startswith(("shuffle1", "merge1")) else phase
        per[phase] += json.loads(marker.read_text()).get("cpu_seconds") or 0.0
    return {k: round(v, 3) for k, v in sorted(per.items())}


def driver_sections(out: Path) -> dict[str, float]:
    """run.json's driver CPU: the start, the phases (summed), the end."""
    sections = json.loads((out / "run.json").read_text()).get("driver_cpu_s", {})
    phases = sum(v for k, v in sections.items() if k.startswith("phase:"))
    rest = {k: v for k, v in sections.items() if not k.startswith("phase:")}
    return {**rest, "phases": round(phases, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=0, help="documents from the corpus (0: all 27,369)")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--cores", type=int, default=2, help="--num-cpus of the run")
    ap.add_argument("--pythonpath", help="another checkout, run interleaved first (label 'other': the baseline)")
    ap.add_argument("--work", type=Path, help="work folder (default: a temporary one)")
    args = add_args(ap, repeats=2).parse_args()
    tok = resolve("bpe32k")
    h = Harness("cpu_where", args, libs=["ray", "tokenizers", "fastokens"], note=f"--num-cpus {args.cores}")
    work = args.work or Path(tempfile.mkdtemp(prefix="dp-bench-cpu-"))
    inp = work / "input"
    if not inp.exists():
        prepare_input(inp, args.docs, args.files)
    (work / "pipeline.yaml").write_text(datapipe_yaml(inp, "all", tok.resolve()))
    sides = {"other": args.pythonpath} if args.pythonpath else {}
    sides["this"] = str(ROOT)
    for path in sides.values():  # untimed, once per install (bench/perf/pipeline.py does the same)
        subprocess.run([sys.executable, "-m", "compileall", "-q", f"{path}/datapipe"], capture_output=True)
        env = {**os.environ, "PYTHONPATH": path}
        subprocess.run([sys.executable, "-m", "datapipe.runtime.kernel_warmup"], env=env, capture_output=True)

    def one(label: str, path: str) -> dict:
        out = work / f"out-{label}"
        env = {**os.environ, "PYTHONPATH": path}
        cmd = [sys.executable, "-m", "datapipe.cli", "run", str(work / "pipeline.yaml"), "-o", str(out), "--fresh"]
        cmd += ["--no-progress", "--num-cpus", str(args.cores)]
        r = measured_run(cmd, env, work / f"{label}.log")
        if r["rc"] != 0:
            raise SystemExit((work / f"{label}.log").read_text(errors="replace")[-3000:])
        r["task_cpu"], r["driver_cpu"] = task_cpu(out), driver_sections(out)
        r["load"] = os.getloadavg()[0]
        roles = f"driver process {r['driver_cpu_s'] or 0:.1f} (run_tree); " + ", ".join(
            f"{k} {v:.1f}" for k, v in r["cpu_by_role"].items()
        )
        tasks = ", ".join(f"{k} {v:.1f}" for k, v in r["task_cpu"].items() if v >= 0.05)
        print(
            f"  {label}: wall {r['wall_s']:.1f} s, tree CPU {r['cpu_s']:.2f} s (load {r['load']:.1f})\n"
            f"    by role: {roles}\n    tasks: {tasks} (sum {sum(r['task_cpu'].values()):.1f})\n"
            f"    driver: " + ", ".join(f"{k} {v:.2f}" for k, v in r["driver_cpu"].items()),
            flush=True,
        )
        return r

    runs = h.interleave({label: (lambda label=label, path=path: one(label, path)) for label, path in sides.items()})
    print()
    for label, rs in runs.items():
        h.figure(f"{label} tree CPU", [r["cpu_s"] for r in rs], "s")
        h.figure(f"{label} wall (load-dependent)", [r["wall_s"] for r in rs], "s")
        h.figure(f"{label} driver CPU (run.json)", [sum(r["driver_cpu"].values()) for r in rs], "s")
        h.figure(f"{label} tasks' CPU", [sum(r["task_cpu"].values()) for r in rs], "s")
    if "other" in runs:
        h.ratio("tree CPU other/this", pair_ratios([r["cpu_s"] for r in runs["other"]], [r["cpu_s"] for r in runs["this"]]))
    h.finish(sides=sides, runs={k: [{x: v for x, v in r.items() if x != "timeline"} for r in rs] for k, rs in runs.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
