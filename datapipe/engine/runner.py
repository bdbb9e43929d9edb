"""Running a pipeline: phases on Ray, resume from markers, refusal on a changed config.

The runner is the only place that talks to Ray. Each phase submits one task per
piece of work that has no completion marker yet, waits for all of them (showing
progress), and moves on; a killed run started again skips whatever finished.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from datapipe.assets.models import cache_dir
from datapipe.engine.disk_full import DiskFull, find_disk_full
from datapipe.engine.errors import PipelineError
from datapipe.engine.phases import Phase, Task, plan_phases
from datapipe.engine.plan import RunSpec, build_stage, forget_stages, make_spec, split_target
from datapipe.engine.progress import PhaseProgress
from datapipe.engine.ray_runtime import ray_session
from datapipe.pipeline.identity import config_changes, resource_changes
from datapipe.pipeline.load import Pipeline
from datapipe.run_folder.layout import RunFolder, RunFolderError, map_phase
from datapipe.run_folder.lock import RunLock
from datapipe.runtime import kernel_warmup
from datapipe.runtime.release_memory import release_memory
from datapipe.runtime.task_usage import TaskUsage
from datapipe.storage.atomic import fault_scope, recording_writes
from datapipe.storage.uri import RUN_FILES, folder_stat, folder_stats_once, input_stat, remote_of

PACKAGES = ("datapipe", "pyarrow", "ray", "duckdb", "tokenizers", "datasketch", "fasttext-numpy2", "numpy")


@dataclass
class RunResult:
    root: Path
    run: dict[str, Any]
    skipped_tasks: int = 0
    executed_tasks: int = 0
    phases: list[dict[str, Any]] = field(default_factory=list)


class RunInterrupted(PipelineError):
    """Ctrl-C (SIGINT) or SIGTERM stopped the run; the message says how to resume."""

    exit_code = 130  # 128 + SIGINT, as shells report an interrupted command (datapipe/errors.py)


def run_pipeline(pipeline: Pipeline, output: Path | None = None, ray_address: str | None = None,
                 num_cpus: int | None = None, fresh: bool = False, show_progress: bool = True,
                 log: Callable[[str], None] = print, in_process: bool | None = False) -> RunResult:
    """Run ``pipeline`` into its run folder. ``in_process`` runs every task in this process, one after
    another, without starting Ray: for small jobs, where Ray's start-up and shutdown (seconds) would
    dominate. The tasks are the same functions, so the outputs are the same. ``None`` decides per run:
    in this process when the run has a single map task on the embedded cluster (see ``_auto_in_process``)."""
    folder = RunFolder(output if output is not None else pipeline.default_output())
    folder.check_usable()  # before the lock creates anything in a folder that may be the user's
    try:
        # One driver per folder, taken before anything is read or written (--fresh deletes included).
        with RunLock(folder.root, log=log), folder_stats_once():
            return _run_locked(pipeline, folder, ray_address, num_cpus, fresh, show_progress, log, in_process)
    except KeyboardInterrupt:
        raise RunInterrupted(
            f"interrupted: the run in {folder.root} was stopped; finished work is kept, and running the "
            f"same command again resumes it") from None
    except (PipelineError, RunFolderError):
        raise
    except Exception as exc:
        full = find_disk_full(exc)
        if full is None:
            raise
        raise PipelineError(full.message(folder.root)) from None


def _run_locked(pipeline: Pipeline, folder: RunFolder, ray_address: str | None, num_cpus: int | None,
                fresh: bool, show_progress: bool, log: Callable[[str], None],
                in_process: bool | None = False) -> RunResult:
    folder.check_usable()
    folder.pull(full=True)  # a run folder in object storage: its mirror takes what the store committed
    normalized = pipeline.normalized()
    resources = pipeline.resources()
    inputs = _input_listing(pipeline)
    previous = folder.load_run_json()
    if previous is not None and not fresh:
        changes = config_changes(previous.get("config", {}), normalized)
        if "resources" in previous:
            changes += resource_changes(previous["resources"], resources)
        else:  # a run.json from before rule files were recorded: nothing to compare them with
            log(f"datapipe: {folder.run_json} records no rule files or models; recording today's")
        changes += input_changes(previous.get("inputs", []), inputs)
        if changes:
            raise PipelineError(
                f"{folder.root} holds a run of a different pipeline, rule files or inputs; changed since then:\n"
                + "\n".join(f"  - {c}" for c in changes[:30])
                + "\nUse --fresh to discard that run and start over, or --output to write elsewhere.")
    if fresh:
        folder.wipe()
    folder.root.mkdir(parents=True, exist_ok=True)
    swept = folder.sweep()  # safe: we hold the lock, so no live writer of this folder exists
    if swept:
        log(f"datapipe: removed {swept} temporary file(s) left by an interrupted run")

    run = previous if previous is not None and not fresh else {}
    # Bytes per map task: chosen once per run folder for the cluster it starts on (engine/splits.py),
    # then recorded, so a resumed run forms the same tasks (and finds their markers) on any cluster.
    recorded = run.get("split") or {}
    target = recorded.get("target_bytes")
    spec = make_spec(pipeline, folder.root, cache_dir(), target) if target else None
    if spec is not None:
        planned = recorded.get("map_tasks")
        if planned is not None and planned != len(spec.shards):
            # Same target, other ranges: the folder was planned by a datapipe whose splitting differed
            # (e.g. before ranges could exceed the target by 10%). Its markers name other byte ranges.
            raise PipelineError(
                f"{folder.root} was planned as {planned} map tasks; this datapipe plans the same inputs "
                f"as {len(spec.shards)}, so its finished tasks cannot be reused. Use --fresh to start over, "
                f"or --output to write elsewhere.")
        _prepare(spec)
    run.update({"name": pipeline.name, "fingerprint": pipeline.fingerprint(), "config": normalized,
                "resources": resources, "inputs": inputs,
                "pipeline_file": str(pipeline.file) if pipeline.file else None, "status": "running",
                "packages": _package_versions(), "python": platform.python_version()})
    run.setdefault("started", _now())
    run.setdefault("attempts", 0)
    run["attempts"] += 1
    folder.save_run_json(run)
    _fault_point("lock", 1)

    result = RunResult(folder.root, run)
    timings: dict[str, float] = dict(run.get("timings", {}))
    needs_work = spec is None or any(folder.read_marker(phase, key) is None for phase, key in _all_tasks(spec, folder))
    auto_cpus = None
    if in_process is None:
        auto_cpus = num_cpus or _local_cpus()
        in_process = not ray_address and _auto_in_process(pipeline, folder, spec, auto_cpus)
    if in_process and needs_work:
        if spec is None:
            spec = _plan_for_cluster(pipeline, folder, run, cpus=auto_cpus or 1)
        log(f"datapipe: running {pipeline.name!r} in this process (no Ray); output in {folder.root}")
        _run_phases(result, folder, spec, timings, show_progress, local=True)
    elif needs_work:
        # On the first run after an install, the kernels compile in a throwaway process while Ray
        # starts, not in every worker (whose memory would keep the compiler's); see kernel_warmup.
        warmup = None if ray_address else kernel_warmup.start(log, num_cpus or _local_cpus())
        with ray_session(ray_address, num_cpus) as where:
            if spec is None:
                spec = _plan_for_cluster(pipeline, folder, run)
            if warmup is not None:
                warmup.wait()
            log(f"datapipe: running {pipeline.name!r} on {where} ({len(spec.shards)} map tasks); "
                f"output in {folder.root}")
            _run_phases(result, folder, spec, timings, show_progress)
    else:  # nothing left to compute: no need to start Ray at all
        result.skipped_tasks = len(_all_tasks(spec, folder))
        log(f"datapipe: every task of {pipeline.name!r} is already done in {folder.root}; rebuilding statistics")

    from datapipe.engine.finish import build_stats, check_conservation, collect_counts

    started = time.perf_counter()
    folder.pull(files=("docs/", "rejected/"))  # statistics read every kept and rejected document
    counts = collect_counts(folder, spec)
    with fault_scope("stats", "build"):
        build_stats(folder, spec, counts)
    folder.publish(*(f for f in RUN_FILES if f != "run.json"))  # run.json last: it says complete
    _fault_point("stats", 1)
    timings["stats"] = round(time.perf_counter() - started, 3)
    check_conservation(folder, counts)
    _record_input_hashes(folder, spec, inputs)
    _check_resources_unchanged(pipeline, resources)
    # A Ray worker killed mid-write and retried leaves its temporary file behind; every task is
    # done now, so whatever temporary name is left belongs to no live writer.
    folder.sweep()
    run.update({"status": "complete", "finished": _now(), "timings": timings, "counts": counts})
    folder.save_run_json(run)
    return result


def _prepare(spec: RunSpec) -> None:
    for pos in range(1, len(spec.stages) + 1):
        build_stage(spec, pos).prepare()  # fetch models now: one clear error instead of one per task


def _plan_for_cluster(pipeline: Pipeline, folder: RunFolder, run: dict[str, Any], cpus: int | None = None) -> RunSpec:
    """The run's tasks for the CPUs Ray has (or ``cpus``): large files split, small ones grouped,
    recorded in run.json."""
    if cpus is None:
        import ray

        cpus = int(ray.cluster_resources().get("CPU", 1))
    target = split_target(pipeline, cpus)
    spec = make_spec(pipeline, folder.root, cache_dir(), target)
    _prepare(spec)
    run["split"] = {"target_bytes": target, "cpus": cpus, "map_tasks": len(spec.shards)}
    folder.save_run_json(run)
    return spec


def _local_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _auto_in_process(pipeline: Pipeline, folder: RunFolder, spec: RunSpec | None, cpus: int) -> bool:
    """Whether a run without --in-process or --ray should skip Ray: when it has one map task. Ray can
    only overlap tasks, and one map task leaves nothing to overlap, while embedded Ray's start costs
    seconds of wall and CPU (each of its processes imports Ray; with the seven it once started,
    12 s on a loaded 2-core machine) and hundreds of MiB (bench/startup.py, bench/pipeline.py
    --stages tokenize)."""
    if spec is None:  # not planned yet: plan as the embedded cluster of ``cpus`` CPUs would
        spec = make_spec(pipeline, folder.root, cache_dir(), split_target(pipeline, cpus))
    return len(spec.shards) <= 1


def _run_phases(result: RunResult, folder: RunFolder, spec: RunSpec, timings: dict[str, float],
                show_progress: bool, local: bool = False) -> None:
    """The engine loop: each phase of the plan in order, its unfinished tasks submitted and awaited."""
    if local:
        spec_ref: Any = spec
    else:
        import ray

        spec_ref = ray.put(spec)
    for phase in plan_phases(spec):
        folder.pull()  # a remote run folder: markers other nodes committed (pack's tasks follow from them)
        work = phase.task_list(folder)
        assert work is not None, f"{phase.name}: its tasks depend on phases that did not finish"
        if not work:  # e.g. shuffle rounds after one that forwarded nothing: nothing to run or show
            continue
        _run_phase(result, folder, phase, work, spec_ref, timings, show_progress, local)


def _all_tasks(spec: RunSpec, folder: RunFolder) -> list[tuple[str, str]]:
    """(phase, task key) of every task the run consists of, as their markers name them (packing's
    ranges follow from the final map markers: until those exist, a placeholder stands for packing)."""
    out: list[tuple[str, str]] = []
    for phase in plan_phases(spec):
        work = phase.task_list(folder)
        out += [(phase.name, t.key) for t in work] if work is not None else [(phase.name, "?planned-after-map")]
    return out


def _outcomes(phase: Phase, todo: Sequence[Task], spec: Any, local: bool,
              ) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    """(task key, its marker or the exception it ended with), as tasks finish: in process one after
    another without retries, else as Ray returns them (submitted here, all at once)."""
    if local:
        for task in todo:
            try:
                yield task.key, _run_task(phase.name, task.key, phase.fn, spec, *task.args)
            except Exception as exc:  # noqa: BLE001 - reported with the others, as Ray's failures are
                yield task.key, exc
        return
    import ray

    remote = ray.remote(max_retries=3, retry_exceptions=True)(_run_task).options(**phase.resources, **_fault_env())
    pending = {remote.remote(phase.name, t.key, phase.fn, spec, *t.args): t.key for t in todo}
    while pending:
        # Every finished task at once, at most every 0.2 s: one wait per finished task would copy the
        # list of pending refs each time, quadratic in a phase's tasks (tens of thousands at scale).
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.2)
        for ref in ready:
            key = pending.pop(ref)
            try:
                yield key, ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - already retried by Ray
                yield key, exc


def _run_phase(result: RunResult, folder: RunFolder, phase: Phase, work: Sequence[Task], spec: Any,
               timings: dict[str, float], show_progress: bool, local: bool = False) -> None:
    name = phase.name
    todo = [task for task in work if folder.read_marker(name, task.key) is None]
    result.skipped_tasks += len(work) - len(todo)
    started = time.perf_counter()
    failures: list[str] = []
    disk_full: DiskFull | None = None
    with PhaseProgress(name, len(work), len(work) - len(todo), phase.unit, enabled=show_progress) as progress:
        for key, outcome in _outcomes(phase, todo, spec, local):
            if isinstance(outcome, Exception):  # Ray already retried it; keep the others running
                failures.append(f"{name} {key}: {_short_error(outcome)}")
                disk_full = disk_full or find_disk_full(outcome)
                progress.advance(0)
                continue
            result.executed_tasks += 1
            progress.advance(outcome.get("docs_in", 0))
            _fault_point(name, progress.done - progress.resumed)
    elapsed = time.perf_counter() - started
    timings[name] = round(timings.get(name, 0.0) + elapsed, 3)
    result.phases.append({"phase": name, "tasks": len(work), "ran": len(todo), "seconds": round(elapsed, 3)})
    if disk_full is not None:  # one line, not one traceback per task: the cause is the same for all
        raise PipelineError(disk_full.message(folder.root))
    if failures:
        raise PipelineError(f"{len(failures)} of {len(work)} {name} tasks failed after retries "
                            f"(finished work is kept; run the same command again to resume):\n"
                            + "\n".join(f"  - {f}" for f in failures[:20]))


def _fault_env() -> dict[str, Any]:
    """Hand the fault hooks' settings to the workers when Ray was started before they were set
    (tests share one Ray): workers of an embedded Ray otherwise inherit the driver's environment."""
    env = {k: v for k, v in os.environ.items() if k == "DATAPIPE_FAULT_ENOSPC_AT"}
    return {"runtime_env": {"env_vars": env}} if env else {}


def _run_task(phase: str, key: str, fn: Callable[..., dict[str, Any]], spec: RunSpec, *args: Any) -> dict[str, Any]:
    """One task of any phase, in a worker or in process: ``fn(spec, *args)``, then its completion marker
    (written after the task's outputs are in place, so a marker means done and durable; a remote run
    folder uploads the files the task wrote, then the marker that names them)."""
    in_worker = _in_ray_worker()
    if in_worker:
        _enter_phase(phase)
        size_thread_pools()
    folder = RunFolder(Path(spec.root))
    folder.pull()  # a remote run folder: this node fetches what earlier tasks committed
    with fault_scope(phase, key), recording_writes() as written:
        usage = TaskUsage()  # per-task peak RSS and CPU, for bench/scale.py and the audit
        marker = fn(spec, *args)
        for name, value in usage.finish().items():
            marker.setdefault(name, value)  # a task's own cpu_seconds (map: its work only) wins
        marker["node"] = _node_id()
        _fault_hold(phase, key)
        folder.write_marker(phase, key, marker, written)
    if in_worker:  # its next task starts from what that task needs
        release_memory(collect=_grew(marker))
    return marker


# A task whose peak was less than this above what its worker held at its start leaves at most that
# much garbage behind: not worth a full garbage collection (~0.1 s in a worker, more than a small
# task's own work: collecting after every task made the demo run 18.5 s instead of 11 s). The
# allocators' free pages are handed back after every task (well under a millisecond): without
# that, a worker's eight small pack tasks of the shared corpus ratcheted it up by 58 MiB, to the
# run's peak.
RELEASE_ABOVE_MIB = 64


def _grew(marker: dict[str, Any]) -> bool:
    peak, start = marker.get("peak_rss_mib"), marker.get("rss_start_mib")
    return peak is None or start is None or peak - start >= RELEASE_ABOVE_MIB


def size_thread_pools() -> None:
    """Size a Ray worker's native thread pools to the CPUs its task was given.

    The tokenizer's rayon pool starts one thread per core of the machine, and Ray runs a worker per
    CPU: on a 64-core node, 64 workers of 64 threads each. Ray caps OpenMP for its workers
    (OMP_NUM_THREADS), not rayon. rayon reads RAYON_NUM_THREADS when it builds its pool, at the first
    parallel call, so this runs before a task's work; a value the user set (inherited by embedded
    workers, or in a cluster's environment) is kept. Measured on the shared corpus with 2 workers on
    2 cores: a worker keeps ~20 MiB less after tokenizing, at the same or less CPU."""
    if "RAYON_NUM_THREADS" in os.environ:
        return
    import ray

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    os.environ["RAYON_NUM_THREADS"] = str(max(1, math.ceil(cpus)))


_WORKER_PHASE: list[str] = []  # the phase of this worker process's last task


def _enter_phase(phase: str) -> None:
    """A Ray worker starting a task of another phase than its last one drops the stages and models
    it built for that phase (phases run one after another, so they are not needed again): a reused
    worker's tasks then peak with what their own phase loads. The models a phase needs are loaded
    once per worker and phase. In-process runs keep everything: they are small, and one process.

    A worker's first task freezes what the worker holds then (Ray, the imported modules: ~110,000
    objects, none of which becomes garbage) out of the garbage collector's sight. A full collection
    after a large task (``release_memory``) then scans the stages and the task's leftovers only:
    it took ~0.15 s with everything in view, 13 times in a run of the shared corpus."""
    if not _WORKER_PHASE:
        gc.freeze()
    elif _WORKER_PHASE[-1] != phase:
        forget_stages()
        release_memory(collect=False)  # the stages are gone by reference count; a full gc costs ~0.1 s
    _WORKER_PHASE[:] = [phase]


def _in_ray_worker() -> bool:
    """Whether this process is a Ray worker (not a driver: an in-process run may share its process
    with a Ray session, a notebook's or a test's, and must keep its stages)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    from ray._private.worker import WORKER_MODE, global_worker

    return global_worker.mode == WORKER_MODE


def _node_id() -> str:
    """The Ray node running this task; "local" for a run without Ray (importing Ray costs a second)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return "local"
    return ray.get_runtime_context().get_node_id()


def _fault_point(phase: str, done: int) -> None:
    """Testing hooks at exact points of a run (no timing races), after n tasks of a phase
    (``lock:1``: right after the lock is taken and run.json written; ``stats:1``: after statistics).

    DATAPIPE_FAULT_KILL_AT=<phase>:<n> SIGKILLs the driver there: a real SIGKILL, so nothing
    gets a chance to clean up. DATAPIPE_FAULT_PAUSE_AT=<phase>:<n> with DATAPIPE_FAULT_PAUSE_FILE=F
    creates F.paused and waits there until F exists: a driver holding its lock mid-run, for
    tests of a second driver and of Ctrl-C.
    """
    here = f"{phase}:{done}"
    if os.environ.get("DATAPIPE_FAULT_KILL_AT") == here:
        os.kill(os.getpid(), signal.SIGKILL)
    pause = os.environ.get("DATAPIPE_FAULT_PAUSE_FILE")
    if pause and os.environ.get("DATAPIPE_FAULT_PAUSE_AT") == here:
        Path(pause + ".paused").touch()
        while not Path(pause).exists():
            time.sleep(0.05)


def _fault_hold(phase: str, key: str) -> None:
    """Testing hook inside a task, between its outputs and its marker (the window a lost node
    leaves behind: files written, no marker). DATAPIPE_FAULT_HOLD_AT=<phase> with
    DATAPIPE_FAULT_HOLD_FILE=F writes the task key to F.held.<key, / as %> and waits until F exists. Set it in one
    node's environment only: every task of that phase placed there is held in flight, so a test
    can remove the node with tasks on it at a known point instead of racing them.
    """
    hold = os.environ.get("DATAPIPE_FAULT_HOLD_FILE")
    if hold and os.environ.get("DATAPIPE_FAULT_HOLD_AT") == phase:
        tmp = Path(f"{hold}.tmp-{os.getpid()}")
        tmp.write_text(key)
        tmp.replace(f"{hold}.held.{key.replace('/', '%')}")  # whole, so a watcher never reads it half-written
        while not Path(hold).exists():
            time.sleep(0.05)


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:500] if text else type(exc).__name__


# --- change detection -------------------------------------------------------------

def _check_resources_unchanged(pipeline: Pipeline, recorded: list[dict[str, Any]]) -> None:
    """A rule file edited while tasks ran may have judged some documents by the old rules and some by the
    new (a worker reads it when it first builds the stage): such a run is not marked complete."""
    changes = resource_changes(recorded, pipeline.resources())
    if changes:
        raise PipelineError("files the run depends on changed while it ran, so its documents may be judged by "
                            "both versions:\n" + "\n".join(f"  - {c}" for c in changes[:30])
                            + "\nRun again with --fresh to judge every document by today's files.")


def input_changes(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    before = {(i["source"], i["path"]): i for i in old}
    after = {(i["source"], i["path"]): i for i in new}
    out = [f"input added: {p} (source {s})" for s, p in after.keys() - before.keys()]
    out += [f"input removed: {p} (source {s})" for s, p in before.keys() - after.keys()]
    for key in sorted(before.keys() & after.keys()):
        if before[key].get("bytes") != after[key].get("bytes") or before[key].get("mtime") != after[key].get("mtime"):
            out.append(f"input modified: {key[1]} (size or modification time differs)")
    return sorted(out)


def _record_input_hashes(folder: RunFolder, spec: RunSpec, inputs: list[dict[str, Any]]) -> None:
    """Attach the sha256 each map0 task computed while reading its input file."""
    by_path = {i["path"]: i for i in inputs}
    for shard in spec.shards:
        marker = folder.read_marker(map_phase(0), shard.key) or {}
        hashed = marker.get("inputs") or ([marker["input"]] if "input" in marker else [])  # "input": older runs
        for h in hashed:
            entry = by_path.get(remote_of(h["path"]) or str(Path(h["path"]).resolve()))
            if entry is not None:
                entry["sha256"] = h["sha256"]


def _input_listing(pipeline: Pipeline) -> list[dict[str, Any]]:
    listing = []
    for source, files in pipeline.inputs.items():
        for path, fmt in files:
            # an input in object storage: as the store listed it, not downloaded; a folder input: its files
            st = input_stat(path) or folder_stat(path)
            if st is None:
                raise FileNotFoundError(path)
            # an input in object storage by its URI: the same on every machine, whatever its mirror path
            listing.append({"source": source, "path": remote_of(path) or str(path.resolve()), "format": fmt, "bytes": st.size,
                            "mtime": int(st.mtime)})
    return listing


def _package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
