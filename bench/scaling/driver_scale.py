"""Driver CPU per task at 100, 1,000 and 10,000 tiny tasks: does the driver's bookkeeping stay linear?

A synthetic run folder per size: N map tasks in each map phase of a real run (the demo pipeline,
run once in process unless --template names a finished run folder), every marker a copy of that
run's marker with its task key and file names changed. The files the markers name are not there,
except those of the template's own tasks: the driver reads one footer per column layout, never
the others. Per size it measures the driver's CPU (all its threads) for:

- ``old``: the bookkeeping as it was: one marker read per task for the resume check, for each
  phase's to-do list and for the counts (``MarkerStore.read`` one at a time, uncached);
- ``new bookkeeping``: the same questions through one listing per phase and parallel reads
  (``MarkerStore.read_all``, cached), the counts (``collect_counts``) included;
- ``new statistics``: the rest of the end of a run, ``build_stats`` (stats.duckdb from the cached
  markers) and ``check_conservation``.

    python -m bench.scaling.driver_scale                 # 100, 1,000, 10,000 tasks
    python -m bench.scaling.driver_scale --sizes 100,1000

Prints CPU µs per task and the ratio of the largest size to the smallest (flat: about 1).

``--dispatch``: the driver's CPU per task while it runs tasks on Ray (embedded, ``--cpus``), from
submission to the end of the run's sweep: N trivial tasks (each writes and commits its marker, as
every task does) in ``--phases`` phases through the runner's own loop (``run_phases``: the to-do
lists, the adopted markers, the committed phases handed to later tasks), on a run folder on a
loopback S3 server in its own process (tests/support/counting_s3.py; its CPU is not the driver's),
then ``RunFolder.sweep``. Reported apart: the driver's own threads (Python, the store's client) and
Ray's threads in the driver (submission, results, gRPC, timers), read per thread from /proc (10 ms
ticks). ``--idle S``: one task of S seconds as well, the driver's CPU per second of wall while it
waits; ``--profile F``: cProfile (thread CPU) of the driver's main thread at the largest size;
``--json F``: the figures under ``dispatch`` (without --dispatch: the end of the run's CPU per marker
under ``end_of_run``), which bench/scaling/cost_model.py reads. The same script measures the code before a
change when run with that code first on PYTHONPATH and ``python -P`` (a datapipe without ``RunFolder.install`` is
"before": its tasks pull, listing every marker):

    PYTHONPATH=/work/main:. python -P -m bench.scaling.driver_scale --dispatch --sizes 100,1000   # before
    python -m bench.scaling.driver_scale --dispatch --sizes 1000,10000 --idle 30 \
        --json bench/results/driver_dispatch_store.json                                 # after
    python -m bench.scaling.driver_scale --sizes 1000,10000 --json bench/results/driver_dispatch_store.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench._support.paths import ROOT
from datapipe.engine.finish import build_stats, check_conservation, collect_counts
from datapipe.engine.runner import all_done
from datapipe.run_folder.layout import RunFolder


def template_run(tmp: Path) -> Path:
    from datapipe.engine.runner import run_pipeline
    from datapipe.pipeline.load import load_pipeline

    out = tmp / "template"
    run_pipeline(
        load_pipeline(ROOT / "pipelines" / "demo.yaml"), output=out, show_progress=False, log=lambda _: None, in_process=True
    )
    return out


def synthetic(template: Path, root: Path, n: int) -> tuple[Any, list[tuple[str, str]]]:
    """A run folder of ``n`` map tasks per map phase of ``template``, and a spec standing for it."""
    markers = template / "_work" / "markers"
    phases = sorted(p.name for p in markers.iterdir() if p.name.startswith("map"))
    for sub in ("docs", "rejected"):
        shutil.copytree(template / sub, root / sub)
    tasks = []
    for phase in phases:
        path = sorted((markers / phase).rglob("*.json"))[0]
        key = path.relative_to(markers / phase).as_posix()[: -len(".json")]
        text = path.read_text()
        for i in range(n):
            new = key if i == 0 else f"{key}-{i:06d}"
            target = root / "_work" / "markers" / phase / f"{new}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            marker = json.loads(text)
            for f in marker.get("audit_files", []):
                if i:  # a hard link: the driver opens one file per column layout, whichever it is
                    renamed = f["path"].replace(key, new)
                    os.link(template / f["path"], root / renamed)
                    f["path"] = renamed
            target.write_text(json.dumps(marker, sort_keys=True))
            tasks.append((phase, new))
    keys = [k for p, k in tasks if p == phases[0]]
    spec = SimpleNamespace(
        segments=[SimpleNamespace(index=int(p[3:]), final=p == phases[-1], apply_global=None) for p in phases],
        shards=[SimpleNamespace(key=k, source=SimpleNamespace(name=k.split("/")[0])) for k in keys],
        sources={k.split("/")[0]: None for k in keys},
        stages=[],
        stage_types=[],
        stage_name=lambda pos: f"stage{pos}",
        tokenizer=None,
        root=str(root),
        fingerprint="bench",
    )
    return spec, tasks


def old_bookkeeping(root: Path, tasks: list[tuple[str, str]]) -> None:
    """One uncached read per task and question, as the runner and collect_counts did."""

    def read(phase: str, key: str) -> dict[str, Any] | None:
        path = root / "_work" / "markers" / phase / f"{key}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    assert all(read(p, k) is not None for p, k in tasks)  # resume check
    for _ in range(2):  # each phase's to-do list, then collect_counts
        assert all(read(p, k) is not None for p, k in tasks)


def new_bookkeeping(folder: RunFolder, spec: Any, tasks: list[tuple[str, str]]) -> dict[str, Any]:
    """The same questions through one listing per phase and the cache: resume check, to-do lists, counts."""
    assert all_done(folder, tasks)
    for phase in dict.fromkeys(p for p, _ in tasks):
        assert len(folder.markers.read_all(phase)) == len(spec.shards)
    return collect_counts(folder, spec)


def new_statistics(folder: RunFolder, spec: Any, counts: dict[str, Any]) -> None:
    build_stats(folder, spec, counts)
    check_conservation(folder, counts)


def measure(fn: Any) -> tuple[float, float, Any]:
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - cpu, time.perf_counter() - wall, out


def trivial(spec: Any, i: int) -> dict[str, Any]:
    """A task with no work of its own: what is left is its marker and the driver's bookkeeping."""
    return {"docs_in": 0, "i": i}


def _thread_cpu() -> tuple[float, float]:
    """(this process's CPU in Ray's threads, in the others), seconds, from /proc per thread."""
    from bench._support.proctree import RAY_THREADS

    ray = own = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            text = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        ticks = int(rest[11]) + int(rest[12])
        if RAY_THREADS.match(name):
            ray += ticks
        else:
            own += ticks
    hz = os.sysconf("SC_CLK_TCK")
    return ray / hz, own / hz


def idle_task(spec: Any, seconds: float) -> dict[str, Any]:
    """One long task: the driver waits on it, so what it spends meanwhile follows wall time, not tasks."""
    time.sleep(seconds)
    return {"docs_in": 0}


def store_server() -> tuple[Any, str]:
    """The loopback counting S3 server in its own process (its CPU is not the driver's), and its URL."""
    import subprocess

    server = subprocess.Popen(
        [sys.executable, "-c", "import logging, time; logging.getLogger('werkzeug').setLevel(logging.WARNING); "
         "from tests.support.counting_s3 import CountingS3; s = CountingS3(); print(s.url, flush=True); time.sleep(1e9)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    return server, server.stdout.readline().strip()


def _run(executor: Any, where: str, phases: list[tuple[Any, list[Any]]]) -> tuple[float, float, float, int]:
    """``phases`` through the runner's own loop (``run_phases``: what it hands each phase's tasks, the
    adopted markers, the committed phases where the code has them), then the end of the run's sweep;
    (own threads' CPU s, Ray's threads' CPU s, wall s, tasks run)."""
    from datapipe.engine import runner
    from datapipe.run_folder.layout import RunFolder as Folder

    folder = Folder(where)
    from datapipe.config.sections import WorkersConfig

    spec = SimpleNamespace(root=str(folder.root), workers=WorkersConfig())  # a worker's recycling reads its settings
    result = runner.RunResult(folder.root, {})
    ray0, own0 = _thread_cpu()
    wall = time.perf_counter()
    runner.run_phases(result, folder, spec, executor, {}, False, phases=[phase for phase, _ in phases])  # type: ignore[arg-type]
    folder.sweep()
    wall = time.perf_counter() - wall
    ray1, own1 = _thread_cpu()
    return own1 - own0, ray1 - ray0, wall, result.executed_tasks


def dispatch(
    sizes: list[int], phases: int, cpus: int, local: bool = False, idle: float = 0.0, profile: Path | None = None
) -> dict[str, Any]:
    import boto3

    from datapipe.engine.executors.ray.executor import RayExecutor
    from datapipe.engine.phases import Phase, Task
    from datapipe.run_folder.layout import RunFolder as Folder

    # before: every task pulls (lists the markers); after: it is handed what earlier phases committed
    handed = hasattr(Folder, "install") or importlib.util.find_spec("datapipe.run_folder.markers") is not None
    code = "after" if handed else "before"
    server, url = store_server()
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"code": code, "store": "local" if local else "S3", "phases": phases, "cpus": cpus, "rows": rows}
    try:
        os.environ.update(
            AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
        )
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket="driver")
        print(
            f"{'code':>6} {'store':>5} {'tasks':>7} {'phases':>6} | driver CPU ms per task: "
            f"{'all':>6} {'own':>6} {'Ray':>6} | {'wall s':>7} | load"
        )
        with RayExecutor(num_cpus=cpus, log=lambda _: None) as executor:
            warm = tuple(Task(f"t{i:06d}", (i,)) for i in range(10 * cpus))  # Ray's workers started, not measured
            _run(executor, _where(local, "warm"), [(Phase("map0", trivial, warm, {"num_cpus": 1}, "tasks"), [])])
            for n in sizes:
                per = -(-n // phases)
                work = []
                for p in range(phases):
                    tasks = tuple(Task(f"t{i:06d}", (i,)) for i in range(p * per, min(n, (p + 1) * per)))
                    work.append((Phase(f"map{p}", trivial, tasks, {"num_cpus": 1}, "tasks"), list(tasks)))
                load0 = os.getloadavg()[0]
                if profile is not None and n == max(sizes):
                    import cProfile

                    prof = cProfile.Profile(time.thread_time)  # CPU of the main thread, not wall
                    prof.enable()
                own, ray, wall, ran = _run(executor, _where(local, str(n)), work)
                if profile is not None and n == max(sizes):
                    prof.disable()
                    prof.dump_stats(str(profile))
                load = (load0, os.getloadavg()[0])
                assert ran == n, ran
                rows.append({"tasks": n, "own_cpu_s": own, "ray_cpu_s": ray, "wall_s": wall, "load": load})
                print(
                    f"{code:>6} {'local' if local else 'S3':>5} {n:>7} {phases:>6} | {'':>24}{(ray + own) / n * 1e3:>6.2f} "
                    f"{own / n * 1e3:>6.2f} {ray / n * 1e3:>6.2f} | {wall:>7.1f} | {load[0]:.1f}-{load[1]:.1f}",
                    flush=True,
                )
            if idle:
                # One task of ``idle`` seconds after a phase of one task (so it is handed a committed
                # phase, as a real task is): the driver's CPU per second of wall while it waits.
                first = Phase("map0", trivial, (Task("t0", (0,)),), {"num_cpus": 1}, "tasks")
                long = Phase("map1", idle_task, (Task("t0", (idle,)),), {"num_cpus": 1}, "tasks")
                load0 = os.getloadavg()[0]
                own, ray, wall, _ = _run(executor, _where(local, "idle"), [(first, []), (long, [])])
                out["idle"] = {"seconds": wall, "own_cpu_s": own, "ray_cpu_s": ray, "load": (load0, os.getloadavg()[0])}
                print(
                    f"one task of {idle:.0f} s: wall {wall:.1f} s, driver CPU per wall second: own {own / wall * 1e3:.2f} ms, "
                    f"Ray's threads {ray / wall * 1e3:.2f} ms",
                    flush=True,
                )
    finally:
        server.terminate()
    return out


def _where(local: bool, name: str) -> str:
    return tempfile.mkdtemp(prefix=f"driver-dispatch-{name}-") if local else f"s3://driver/run-{name}-{os.getpid()}"


def save(path: Path, key: str, value: dict[str, Any]) -> None:
    """``value`` under ``key`` of the JSON at ``path`` (the other mode's figures kept), with the machine."""
    from bench._support.harness import environment

    data = json.loads(path.read_text()) if path.is_file() else {}
    data[key] = {"environment": environment(), **value}
    path.write_text(json.dumps(data, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--template", type=Path, help="a finished run folder (default: the demo pipeline, run now)")
    ap.add_argument("--dispatch", action="store_true", help="the driver's CPU per task running tasks on Ray (see above)")
    ap.add_argument("--phases", type=int, default=4, help="--dispatch: phases the tasks are spread over")
    ap.add_argument("--cpus", type=int, default=2, help="--dispatch: Ray's CPUs")
    ap.add_argument("--local", action="store_true", help="--dispatch: the run folder on local disk, not the store")
    ap.add_argument("--idle", type=float, default=0.0, help="--dispatch: also one task of this many seconds (CPU per wall s)")
    ap.add_argument("--profile", type=Path, help="--dispatch: cProfile of the driver's main thread at the largest size")
    ap.add_argument(
        "--json", type=Path, help="write the figures here (each mode its own key; bench/scaling/cost_model.py reads them)"
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.dispatch:
        out = dispatch(sizes, args.phases, args.cpus, args.local, args.idle, args.profile)
        if args.json:
            save(args.json, "dispatch", out)
        return
    with tempfile.TemporaryDirectory(prefix="driver-scale-") as tmp:
        template = args.template or template_run(Path(tmp))
        per_task: dict[int, dict[str, float]] = {}
        rows: list[dict[str, Any]] = []
        print(
            f"{'tasks':>7} {'markers':>8} | CPU us per task: {'old bookkeeping':>15} {'new bookkeeping':>15} "
            f"{'new statistics':>14} | {'new wall s':>10}"
        )
        for n in sizes:
            root = Path(tmp) / f"n{n}"
            spec, tasks = synthetic(template, root, n)
            folder = RunFolder(root)
            old_cpu, _, _ = measure(lambda r=root, t=tasks: old_bookkeeping(r, t))  # type: ignore[misc]
            book_cpu, book_wall, counts = measure(lambda f=folder, s=spec, t=tasks: new_bookkeeping(f, s, t))  # type: ignore[misc]
            stats_cpu, stats_wall, _ = measure(lambda f=folder, s=spec, c=counts: new_statistics(f, s, c))  # type: ignore[misc]
            per_task[n] = {k: v / n * 1e6 for k, v in (("old", old_cpu), ("book", book_cpu), ("stats", stats_cpu))}
            row = per_task[n]
            print(
                f"{n:>7} {len(tasks):>8} | {'':>16}{row['old']:>15.0f} {row['book']:>15.0f} {row['stats']:>14.0f} | "
                f"{book_wall + stats_wall:>10.2f}",
                flush=True,
            )
            rows.append({"tasks": n, "markers": len(tasks), "own_cpu_s_per_task": (book_cpu + stats_cpu) / len(tasks)})
            rows[-1].update(bookkeeping_cpu_s=book_cpu, statistics_cpu_s=stats_cpu, load=os.getloadavg()[0])
            shutil.rmtree(root)
        if args.json:  # the end of a run's CPU per marker (no Ray here: every thread is the driver's own)
            save(args.json, "end_of_run", {"rows": rows})
        lo, hi = min(sizes), max(sizes)
        ratio = {k: per_task[hi][k] / per_task[lo][k] for k in per_task[hi]}
        print(
            f"per-task CPU, {hi} vs {lo} tasks: old bookkeeping {ratio['old']:.2f}x, new bookkeeping {ratio['book']:.2f}x, "
            f"new statistics {ratio['stats']:.2f}x; new / old bookkeeping at {hi}: "
            f"{per_task[hi]['book'] / per_task[hi]['old']:.2f}"
        )


if __name__ == "__main__":
    main()
