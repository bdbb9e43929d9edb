"""The driver of a crawl's run at its real task counts: every phase through the runner's own loop, per
phase the driver's CPU and its memory (issue 48: "the driver's planning and commit for 149k and 1.5M
tasks ... <= 1 s per phase").

    python -m bench.scaling.driver_crawl --crawls 10,100 --json bench/results/driver_scale.json

A 10 TB and a 100 TB crawl (bench/scaling/crawl_proportions.py's ``Crawl``: 37,253 and 372,530 map tasks
of 256 MiB; its spec: langid, quality, exact dedup, MinHash, tokenize, partitions sized by rows) run
through ``runner.run_phases`` on a run folder in object storage (a loopback S3 server in its own process,
so the driver places tasks and hands them their inputs' committed entries as on a cluster), with an
executor that runs nothing: each task's outcome is the marker it would commit at the crawl's counts
(``crawl_proportions.marker_for``: a map task's is a real one of the demo run with the crawl's counts and
file names; a merge or partition task's carries the rows its inputs give it). Rows per document of
each shuffle round are stand-ins (``ROWS``, from the task counts crawl_proportions planned at 10 TB:
bench/results/crawl_proportions_10tb.json), as are bytes per row; they set how many merge and partition
tasks there are, not what the driver does per task.

Per phase, the driver's own CPU (``runtime/own_cpu.Sections``, as ``run.json`` records it) by part:
``plan`` (the phase's task list from the markers of the phases before, placement, each task's handed
entries: up to its first task), ``submit``, ``results`` (each marker adopted as it comes back; this
overlaps the running tasks, so it is quoted per task, less the CPU this bench spends writing the
markers) and ``commit`` (after the last one: the mirror pruned). Then the end of the run's steps that
read every marker (``finish.collect_counts``, ``document_files``, ``copies_files``, ``aggregate_files``).
The driver's RSS after each phase and its peak (VmHWM).

``--first-plan`` (saved under the key ``first_plan``): the loop only up to its first phase's first
submission (the run's phases planned, the first map phase's tasks, each one's handed entries): what holds a
run up before any task starts, measurable at 100 TB's 372,530 map tasks, where the whole loop (1.5M
markers made and adopted) does not fit on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench._support.paths import ROOT
from bench.scaling.crawl_proportions import NODE

# Rows per document of each shuffle round (segment -> round -> rows), outputs per document of a
# deciding round, bytes per row: stand-ins (see the module doc).
ROWS = {
    "exact_rows": 1.0,
    "band_rows": 13.9,
    "minhash_round_rows": {"1": 1.54, "2": 1.09, "3": 0.19, "4": 0.19, "5": 0.25, "6": 0.26, "7": 0.13},
    "outputs": {
        "0": {"rows_out": 0.05, "state_rows": 0.0, "copies_rows": 0.05},
        "1": {"rows_out": 0.05, "state_rows": 0.0, "copies_rows": 0.05},
    },
}
ROW_BYTES = {"0-0": 24.0, "1-0": 30.0, "1-1": 560.0, **{f"1-{r}": 60.0 for r in range(2, 8)}}


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class Committing:
    """An executor that runs nothing: each task's outcome is the marker it would commit at the crawl's
    counts. Marks the phase's "plan" and "submit" parts as Ray's executor does; the CPU spent writing
    the markers is counted apart (``made_s``), to be taken off the "results" part."""

    def __init__(self, counts: Any, templates: dict[str, str]) -> None:
        self.counts, self.templates = counts, templates
        self.clock: Any = None
        self.made_s: dict[str, float] = {}

    def __enter__(self) -> Committing:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def observe(self, clock: Any) -> None:
        self.clock = clock

    def describe(self) -> str:
        return "committing synthetic markers"

    def cpus(self) -> int:
        return 64 * 64

    def outcomes(self, spec: Any, phase: Any, tasks: Sequence[Any]) -> Iterator[tuple[str, Any]]:
        from bench.scaling.crawl_proportions import marker_for
        from datapipe.engine.executors.base import phase_section

        self.clock.mark(phase_section(phase.name, "plan"))
        self.clock.mark(phase_section(phase.name, "submit"))
        made = 0.0
        for task in tasks:
            t0 = time.thread_time()
            if phase.name.startswith(("map", "pack", "merge", "shuffle")):
                body = marker_for(phase.name, task, self.counts, self.templates, spec)
            else:  # a combine step (reduce1: the clusters left open): a marker naming no file
                body = json.dumps({"decisions": 0, "files": [], "node": NODE}).encode()
            made += time.thread_time() - t0
            yield task.key, body
        self.made_s[phase.name] = self.made_s.get(phase.name, 0.0) + made


def template_markers(work: Path) -> dict[str, str]:
    """A marker of each map phase and a pack task of the demo run (made once under ``work``)."""
    from bench.scaling.driver_scale import template_run

    out = work / "template"
    if not (out / "run.json").is_file():
        shutil.rmtree(out, ignore_errors=True)
        template_run(work)
    markers = out / "_work" / "markers"
    return {p: sorted((markers / p).rglob("*.json"))[0].read_text() for p in ("map0", "map1", "map2", "pack")}


def _crawl(work: Path, tb: int, uri: str) -> tuple[Any, Path, Any, Any]:
    """The crawl, its spec's folder, its spec and its (empty) run folder at ``uri``."""
    import pickle

    from bench.scaling.crawl_proportions import Crawl, crawl_spec
    from datapipe.run_folder.layout import RunFolder

    crawl = Crawl(tb)
    root = work / f"crawl-{tb}" / "run"
    shutil.rmtree(root.parent, ignore_errors=True)
    root.mkdir(parents=True)
    inputs = work / "input"
    inputs.mkdir(exist_ok=True)
    (inputs / "docs.jsonl").write_text(json.dumps({"id": "d0", "text": "a crawl's stand-in document"}) + "\n")
    spec = pickle.loads(crawl_spec(root, crawl, inputs / "docs.jsonl").read_bytes())
    folder = RunFolder(uri)
    shutil.rmtree(folder.root, ignore_errors=True)
    return crawl, root, spec, folder


class _Planned(Exception):
    """The first phase is planned (``FirstPlan``): the loop stops there."""


class FirstPlan(Committing):
    """An executor that stops the run once its first phase is planned (``--first-plan``)."""

    def outcomes(self, spec: Any, phase: Any, tasks: Sequence[Any]) -> Iterator[tuple[str, Any]]:
        from datapipe.engine.executors.base import phase_section

        self.clock.mark(phase_section(phase.name, "plan"))
        self.planned = (phase.name, len(tasks))
        raise _Planned
        yield  # (a generator, as the loop expects)


def first_plan(work: Path, tb: int, uri: str) -> dict[str, Any]:
    """The runner's loop up to the first phase's first submission (what a run holds up before its first map
    task starts: the plan of the run, the map tasks, each task's handed entries), at a crawl's map tasks:
    the full loop at 100 TB (1.5M tasks, each marker made and adopted) does not fit on a shared 2-core
    machine, and every later phase's planning needs the markers of the phases before."""
    from datapipe.engine import runner
    from datapipe.runtime.own_cpu import Sections

    crawl, root, spec, folder = _crawl(work, tb, uri)
    executor = FirstPlan(None, {})
    sections = Sections()
    gc.collect()
    rss0 = _kib("VmRSS") / 1024
    executor.observe(sections)
    try:
        runner.run_phases(runner.RunResult(folder.root, {}), folder, spec, executor, {}, False, sections)
    except _Planned:
        pass
    name, tasks = executor.planned
    out = {
        "crawl": crawl.name,
        "map_tasks": crawl.map_tasks,
        "phase": name,
        "tasks": tasks,
        "plan_cpu_s": round(sections.seconds.get(f"phase:{name}:plan", 0.0), 4),
        "plan_cpu_us_per_task": round(sections.seconds.get(f"phase:{name}:plan", 0.0) / max(1, tasks) * 1e6, 2),
        "rss_start_mib": round(rss0, 1),
        "rss_mib": round(_kib("VmRSS") / 1024, 1),
        "load": os.getloadavg(),
    }
    shutil.rmtree(root.parent, ignore_errors=True)
    return out


def crawl_run(work: Path, tb: int, uri: str) -> dict[str, Any]:
    """One crawl's run through the runner's loop, then the end of the run's reads (see the module doc)."""
    from bench.scaling.crawl_proportions import Counts
    from datapipe.engine import finish, runner
    from datapipe.runtime.own_cpu import Sections

    crawl, root, spec, folder = _crawl(work, tb, uri)
    executor = Committing(Counts(crawl, ROWS, ROW_BYTES), template_markers(work))
    sections = Sections()
    gc.collect()
    rss0 = _kib("VmRSS") / 1024
    result = runner.RunResult(folder.root, {})
    rss: dict[str, float] = {}

    class Watched(Sections):  # the RSS after each phase's commit, with the sections; a line per phase
        def mark(self, name: str) -> None:
            sections.mark(name)
            if name.endswith(":commit"):
                phase = name.split(":")[1]
                rss[phase] = _kib("VmRSS") / 1024
                cpu = {p: round(sections.seconds.get(f"phase:{phase}:{p}", 0.0), 3) for p in ("plan", "results", "commit")}
                made = round(executor.made_s.get(phase, 0.0), 3)
                print(f"phase {phase}: CPU s {cpu}, made {made}, RSS {rss[phase]:.0f} MiB", file=sys.stderr, flush=True)

    clock = Watched()
    executor.observe(clock)
    wall = time.perf_counter()
    runner.run_phases(result, folder, spec, executor, {}, False, clock)
    run_wall = time.perf_counter() - wall
    phases = []
    for row in result.phases:
        name = row["phase"]
        cpu = {part: sections.seconds.get(f"phase:{name}:{part}", 0.0) for part in ("plan", "submit", "results", "commit")}
        adopt = cpu["results"] - executor.made_s.get(name, 0.0)
        phases.append(
            {
                "phase": name,
                "tasks": row["tasks"],
                "plan_cpu_s": round(cpu["plan"], 4),
                "submit_cpu_s": round(cpu["submit"], 4),
                "adopt_cpu_s": round(adopt, 4),
                "adopt_cpu_us_per_task": round(adopt / max(1, row["tasks"]) * 1e6, 2),
                "commit_cpu_s": round(cpu["commit"], 4),
                "rss_mib": round(rss.get(name, 0.0), 1),
            }
        )
        print(json.dumps(phases[-1]), flush=True)
    end: dict[str, float] = {}
    for name, fn in (
        ("collect_counts", lambda: finish.collect_counts(folder, spec)),
        ("document_files", lambda: finish.document_files(folder, spec)),
        ("copies_files", lambda: finish.copies_files(folder, spec)),
        ("aggregate_files", lambda: finish.aggregate_files(folder, spec)),
        ("known_files", lambda: folder.markers.known_files()),
    ):
        t0 = time.process_time()
        fn()
        end[f"{name}_cpu_s"] = round(time.process_time() - t0, 3)
        print(f"end of run: {name} {end[f'{name}_cpu_s']} CPU s", flush=True)
    gc.collect()
    tasks = sum(p["tasks"] for p in phases)
    out = {
        "crawl": crawl.name,
        "map_tasks": crawl.map_tasks,
        "tasks": tasks,
        "phases": phases,
        "end_of_run": end,
        "run_wall_s": round(run_wall, 1),
        "rss_start_mib": round(rss0, 1),
        "rss_end_mib": round(_kib("VmRSS") / 1024, 1),
        "peak_mib": round(_kib("VmHWM") / 1024, 1),
        "rss_kib_per_task": round((max(rss.values(), default=rss0) - rss0) * 1024 / max(1, tasks), 3),
        "load": os.getloadavg(),
    }
    shutil.rmtree(folder.root, ignore_errors=True)
    shutil.rmtree(root.parent, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crawls", default="10,100", help="crawl sizes in TB")
    ap.add_argument("--work", type=Path, default=Path("/tmp/driver-crawl"))
    ap.add_argument("--json", type=Path, help="the figures, under the key 'crawl' (bench/results/driver_scale.json)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one crawl, in this process (a child)
    ap.add_argument(
        "--first-plan",
        action="store_true",
        help="only the loop up to the first phase's first submission, per crawl (saved under 'first_plan')",
    )
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    if a.one is not None:
        import signal

        import boto3

        from bench.scaling.driver_scale import store_server

        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the store's process is ended too (finally)
        server, url = store_server()
        try:
            os.environ.update(
                AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
            )
            boto3.client("s3", endpoint_url=url).create_bucket(Bucket="driver-crawl")
            run = first_plan if a.first_plan else crawl_run
            out = run(a.work, a.one, f"s3://driver-crawl/run-{a.one}")
        finally:
            server.terminate()
        print(json.dumps(out))
        return 0
    import subprocess

    rows = []
    for tb in (int(t) for t in a.crawls.split(",")):
        # A fresh process per crawl: its peak RSS is this crawl's driver's alone.
        proc = subprocess.run(
            [sys.executable, "-m", "bench.scaling.driver_crawl", "--one", str(tb), "--work", str(a.work)]
            + (["--first-plan"] if a.first_plan else []),
            cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True,
        )  # fmt: skip
        print(proc.stdout, end="", flush=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    if a.json:
        from bench.scaling.driver_scale import save

        if a.first_plan:
            save(a.json, "first_plan", {"rows": rows})
        else:
            save(a.json, "crawl", {"rows": rows, "rows_per_document": ROWS, "bytes_per_row": ROW_BYTES})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
