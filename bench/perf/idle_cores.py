"""Where a run leaves cores idle: ``datapipe run`` of bench/perf/pipeline.py's input, with a timeline.

    python -m bench.perf.idle_cores [--repeats 3] [--burners 2] [--docs 0] [--json bench/results/idle_cores.json]
    python -m bench.perf.idle_cores --pythonpath /tmp/old-checkout ...   # A/B: another checkout interleaved

The run (langid -> quality -> dedup(exact) -> minhash -> tokenize, 32k BPE, ``--num-cpus 2``) is measured
as a process tree (bench/_support/proctree.py: exact tree CPU, start-up and shutdown included) while
``--burners`` busy-looping processes share the cores (the "busy cores" of a shared machine; 0 for a quiet
one). Reported per run: wall, tree CPU, and **wall / (tree CPU / cores)**: 1.0 when the run kept every
core it could have busy, more when it waited. The timeline: the run's progress lines (one per phase as it
ends, and the end of the run) with the time each arrived, and, between them, the cores the tree used
(CPU seconds per wall second, from /proc samples every 0.1 s): where it is far below the cores, the run
waits (Ray's start, a one-task phase, the driver's serial steps, the end of the run).

``--pythonpath``: runs with that checkout's datapipe too (PYTHONPATH), interleaved with this one, same
load: the before/after of a change.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench._support.bench_tokenizer import resolve
from bench._support.harness import Harness, add_args
from bench._support.paths import ROOT
from bench._support.proctree import descendants, run_tree
from bench.perf.pipeline import datapipe_yaml, prepare_input

_TICK = os.sysconf("SC_CLK_TCK")


def burn(n: int) -> list[subprocess.Popen]:
    """``n`` processes that spin on a core each (Python loops, nothing else), killed by the caller."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _runnable(pid: int) -> int:
    """Threads of ``pid`` running or waiting for a core (state R)."""
    n = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    n += f.read().rsplit(")", 1)[1].split()[0] == "R"
            except OSError:
                pass
    except OSError:
        pass
    return n


def timed_run(cmd: list[str], env: dict[str, str], log: Path, interval: float = 0.1) -> dict:
    """``run_tree`` of ``cmd`` plus a timeline: the tree's CPU ticks and its runnable threads (state R: on
    a core or waiting for one), sampled every ``interval`` (beside run_tree's own exact figures)."""
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()
    me, sampler = os.getpid(), threading.get_native_id()
    start = time.perf_counter()

    def sample() -> None:
        seen: dict[tuple[int, int], int] = {}
        while not stop.is_set():
            tree = descendants(me)
            for pid, (_, ticks, started, _) in tree.items():
                seen[(pid, started)] = ticks
            runnable = sum(_runnable(pid) for pid in tree if pid != sampler)
            samples.append((time.perf_counter() - start, sum(seen.values()), runnable))
            time.sleep(interval)

    threading.Thread(target=sample, daemon=True).start()
    r = run_tree(cmd, interval, env=env, log=log)
    stop.set()
    lines = []
    # The log holds stderr and stdout; progress lines are timestamped by the heartbeat's own elapsed
    # figures only, so take each phase's end from the order of lines and the sampled CPU curve.
    text = log.read_text(errors="replace").splitlines()
    for line in text:
        if " in " in line and ("/" in line or "stats" in line):
            lines.append(line.strip())
    r["timeline_lines"] = lines
    r["cpu_curve"] = samples
    return r


def per_second(samples: list[tuple[float, int, int]], step: float = 1.0) -> list[tuple[float, float, float]]:
    """(second, cores the tree used in it, its mean runnable threads) from the samples."""
    out: list[tuple[float, float, float]] = []
    t = 0.0
    while samples and t < samples[-1][0]:
        inside = [s for s in samples if t <= s[0] < t + step] or [samples[-1]]
        lo = next((s for s in samples if s[0] >= t), samples[-1])
        hi = next((s for s in samples if s[0] >= t + step), samples[-1])
        dt = hi[0] - lo[0]
        out.append((t, (hi[1] - lo[1]) / _TICK / dt if dt > 0 else 0.0, sum(s[2] for s in inside) / len(inside)))
        t += step
    return out


def waiting_share(samples: list[tuple[float, int, int]], cores: int) -> float:
    """The share of the run's core-time in which it had no thread to run there: mean over samples of
    max(0, cores - runnable threads) / cores. Independent of other load (a runnable thread waiting
    for a core another process holds is not the run's wait)."""
    return sum(max(0, cores - s[2]) for s in samples) / cores / len(samples) if samples else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=0, help="documents from the corpus (0: all 27,369)")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--cores", type=int, default=2, help="--num-cpus of the run, and the cores of the ratio")
    ap.add_argument("--burners", type=int, default=0, help="busy-looping processes sharing the cores during each run")
    ap.add_argument("--ray", action="store_true", help="--ray: Ray even for a one-map-task run (small --docs)")
    ap.add_argument("--pythonpath", help="another checkout, run interleaved (label 'other')")
    ap.add_argument("--work", type=Path)
    args = add_args(ap, repeats=2).parse_args()
    tok = resolve("bpe32k")
    h = Harness("idle_cores", args, libs=["ray"], note=f"burners {args.burners}, --num-cpus {args.cores}")
    work = args.work or Path(tempfile.mkdtemp(prefix="dp-bench-idle-"))
    inp = work / "input"
    if not inp.exists():
        prepare_input(inp, args.docs, args.files)
    (work / "pipeline.yaml").write_text(datapipe_yaml(inp, "all", tok.resolve()))
    subprocess.run([sys.executable, "-m", "datapipe.runtime.kernel_warmup"], capture_output=True)
    sides = {"this": str(ROOT)}
    if args.pythonpath:
        sides["other"] = args.pythonpath

    def one(label: str, path: str) -> dict:
        out = work / f"out-{label}"
        env = {**os.environ, "PYTHONPATH": path}
        cmd = [sys.executable, "-m", "datapipe.cli", "run", str(work / "pipeline.yaml"), "-o", str(out), "--fresh"]
        cmd += ["--num-cpus", str(args.cores)] + (["--ray"] if args.ray else [])
        burners = burn(args.burners)
        try:
            r = timed_run(cmd, env, work / f"{label}.log")
        finally:
            for p in burners:
                p.kill()
                p.wait()
        if r["rc"] != 0:
            raise SystemExit((work / f"{label}.log").read_text(errors="replace")[-3000:])
        r["idle_ratio"] = r["wall_s"] / (r["cpu_s"] / args.cores)
        samples = r.pop("cpu_curve")
        r["waiting_share"] = waiting_share(samples, args.cores)
        print(
            f"  {label}: wall {r['wall_s']:.1f} s, tree CPU {r['cpu_s']:.1f} s, wall / (CPU / {args.cores}) "
            f"{r['idle_ratio']:.2f}, share of core-time with no runnable thread {r['waiting_share']:.1%}, "
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        curve = per_second(samples)
        print("    cores used per second: " + " ".join(f"{c:.1f}" for _, c, _ in curve))
        print("    runnable threads per second: " + " ".join(f"{n:.1f}" for _, _, n in curve))
        for line in r["timeline_lines"]:
            print(f"    {line}")
        return r

    runs = h.interleave({label: (lambda label=label, path=path: one(label, path)) for label, path in sides.items()})
    for label, rs in runs.items():
        h.figure(f"{label} wall", [r["wall_s"] for r in rs], "s")
        h.figure(f"{label} tree CPU", [r["cpu_s"] for r in rs], "s")
        h.figure(f"{label} wall / (tree CPU / cores)", [r["idle_ratio"] for r in rs], "", target="<= 1.3")
        h.figure(f"{label} share of core-time with no runnable thread", [r["waiting_share"] for r in rs], "")
    h.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
