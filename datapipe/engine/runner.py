"""Running a pipeline: phases on Ray, resume from markers, refusal on a changed config.

The runner is the only place that talks to Ray. Each phase submits one task per
piece of work that has no completion marker yet, waits for all of them (showing
progress), and moves on; a killed run started again skips whatever finished.
"""

from __future__ import annotations

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

from datapipe.atomic import fault_scope, recording_writes
from datapipe.config import Pipeline
from datapipe.engine import tasks
from datapipe.engine.disk_full import DiskFull, find_disk_full
from datapipe.engine.errors import PipelineError
from datapipe.engine.pack_plan import PackRange, pack_ranges
from datapipe.engine.plan import RunSpec, Segment, Shard, build_stage, make_spec, split_target
from datapipe.engine.progress import PhaseProgress
from datapipe.engine.ray_runtime import ray_session
from datapipe.engine.run_folder import RunFolder, RunFolderError
from datapipe.engine.run_lock import RunLock
from datapipe.models import cache_dir
from datapipe.run_identity import config_changes, resource_changes
from datapipe.stages.base import ShuffledGlobalStage
from datapipe.storage import input_stat, remote_of

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


def run_pipeline(pipeline: Pipeline, output: Path | None = None, ray_address: str | None = None,
                 num_cpus: int | None = None, fresh: bool = False, show_progress: bool = True,
                 log: Callable[[str], None] = print, in_process: bool = False) -> RunResult:
    """Run ``pipeline`` into its run folder. ``in_process`` runs every task in this process, one after
    another, without starting Ray: for small jobs, where Ray's start-up and shutdown (seconds) would
    dominate. The tasks are the same functions, so the outputs are the same."""
    folder = RunFolder(output if output is not None else pipeline.default_output())
    folder.check_usable()  # before the lock creates anything in a folder that may be the user's
    try:
        # One driver per folder, taken before anything is read or written (--fresh deletes included).
        with RunLock(folder.root, log=log):
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
                fresh: bool, show_progress: bool, log: Callable[[str], None], in_process: bool = False) -> RunResult:
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
    target = (run.get("split") or {}).get("target_bytes")
    spec = make_spec(pipeline, folder.root, cache_dir(), target) if target else None
    if spec is not None:
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
    if in_process and needs_work:
        if spec is None:
            spec = _plan_for_cluster(pipeline, folder, run, cpus=1)
        log(f"datapipe: running {pipeline.name!r} in this process (no Ray); output in {folder.root}")
        _run_phases(result, folder, spec, timings, show_progress, local=True)
    elif needs_work:
        with ray_session(ray_address, num_cpus) as where:
            if spec is None:
                spec = _plan_for_cluster(pipeline, folder, run)
            log(f"datapipe: running {pipeline.name!r} on {where} ({len(spec.shards)} map tasks); "
                f"output in {folder.root}")
            _run_phases(result, folder, spec, timings, show_progress)
    else:  # nothing left to compute: no need to start Ray at all
        result.skipped_tasks = len(_all_tasks(spec, folder))
        log(f"datapipe: every task of {pipeline.name!r} is already done in {folder.root}; rebuilding statistics")

    from datapipe.engine.audit import build_stats, check_conservation, collect_counts

    started = time.perf_counter()
    folder.pull(files=("docs/", "rejected/"))  # statistics read every kept and rejected document
    counts = collect_counts(folder, spec)
    with fault_scope("stats", "build"):
        build_stats(folder, spec, counts)
    folder.publish("shards/manifest.parquet", "stats.duckdb")
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


def _line_tasks(spec: RunSpec) -> list[Shard]:
    """Ranges of split JSONL files whose newline count a later range needs (every one but the last)."""
    return [s for s in spec.shards
            if len(s.inputs) == 1 and s.format == "jsonl" and s.inputs[0].part < s.inputs[0].parts - 1]


def _run_phases(result: RunResult, folder: RunFolder, spec: RunSpec, timings: dict[str, float],
                show_progress: bool, local: bool = False) -> None:
    if local:
        spec_ref: Any = spec
    else:
        import ray

        spec_ref = ray.put(spec)
    if lines := _line_tasks(spec):  # global line numbers for JSONL ranges: a cheap parallel pre-pass
        _run_phase(result, folder, tasks.LINES_PHASE, [(s.key, (spec_ref, s)) for s in lines], _lines_task,
                   {"num_cpus": 1, "scheduling_strategy": "SPREAD"}, timings, show_progress, "ranges", local)
    for segment in spec.segments:
        phase = f"map{segment.index}"
        # SPREAD: input shards are I/O-heavy; spreading them uses every node's disks and network.
        _run_phase(result, folder, phase, [(s.key, (spec_ref, s, segment)) for s in spec.shards],
                   _map_task, {**_segment_resources(spec, segment), "scheduling_strategy": "SPREAD"},
                   timings, show_progress, "shards", local)
        if segment.final:
            continue
        name = spec.stage_name(segment.compute_global)  # type: ignore[arg-type]
        stage = build_stage(spec, segment.compute_global)  # type: ignore[arg-type]
        if isinstance(stage, ShuffledGlobalStage):
            for r in range(stage.rounds()):
                _run_phase(result, folder, shuffle_phase(segment.index, r),
                           [(f"{p:05d}", (spec_ref, segment, p, r)) for p in range(stage.partitions())],
                           _partition_task, {"num_cpus": stage.resources.num_cpus, "scheduling_strategy": "SPREAD"},
                           timings, show_progress, "partitions", local)
            if stage.decides_in_partitions:
                continue  # the next map phase reads its shard's decisions from the partition outputs
        _run_phase(result, folder, f"reduce{segment.index}", [(name, (spec_ref, segment))], _reduce_task,
                   {"num_cpus": stage.resources.num_cpus}, timings, show_progress, "steps", local)
    if spec.tokenizer is not None:
        folder.pull()
        ranges = pack_ranges(folder, spec)
        assert ranges is not None  # every final map task is done here
        _run_phase(result, folder, "pack", [(r.key, (spec_ref, r)) for r in ranges], _pack_task,
                   {"num_cpus": 1}, timings, show_progress, "ranges", local)


def _all_tasks(spec: RunSpec, folder: RunFolder) -> list[tuple[str, str]]:
    """(phase, task key) of every task the run consists of, as their markers name them (packing's
    ranges follow from the final map markers: until those exist, a placeholder stands for packing)."""
    tasks_: list[tuple[str, str]] = [(tasks.LINES_PHASE, s.key) for s in _line_tasks(spec)]
    for segment in spec.segments:
        tasks_ += [(f"map{segment.index}", s.key) for s in spec.shards]
        if segment.final:
            continue
        stage = build_stage(spec, segment.compute_global)  # type: ignore[arg-type]
        if isinstance(stage, ShuffledGlobalStage):
            tasks_ += [(shuffle_phase(segment.index, r), f"{p:05d}")
                       for r in range(stage.rounds()) for p in range(stage.partitions())]
            if stage.decides_in_partitions:
                continue
        tasks_.append((f"reduce{segment.index}", stage.name))
    if spec.tokenizer is not None:
        ranges = pack_ranges(folder, spec)
        tasks_ += [("pack", r.key) for r in ranges] if ranges is not None else [("pack", "?planned-after-map")]
    return tasks_


def shuffle_phase(segment: int, round: int) -> str:
    """Phase (and marker folder) name of a shuffle round: round 0 keeps the name runs had before rounds."""
    return f"shuffle{segment}" if round == 0 else f"shuffle{segment}r{round}"


def _segment_resources(spec: RunSpec, segment: Segment) -> dict[str, Any]:
    positions = [*segment.stages, *(p for p in (segment.apply_global, segment.compute_global) if p)]
    stages = [build_stage(spec, p) for p in positions]
    cpus = max([1.0, *(s.resources.num_cpus for s in stages)])
    memory = sum(s.resources.memory_mb for s in stages)
    return {"num_cpus": cpus, **({"memory": memory * 1024 * 1024} if memory else {})}


def _outcomes(fn: Callable, phase: str, todo: list[tuple[str, tuple]], pending: dict[Any, str],
              local: bool) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    """(task key, its marker or the exception it ended with), as tasks finish: in process one after
    another without retries, else as Ray returns them."""
    if local:
        for key, args in todo:
            try:
                yield key, fn(phase, *args)
            except Exception as exc:  # noqa: BLE001 - reported with the others, as Ray's failures are
                yield key, exc
        return
    import ray

    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
        for ref in ready:
            key = pending.pop(ref)
            try:
                yield key, ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - already retried by Ray
                yield key, exc


def _run_phase(result: RunResult, folder: RunFolder, phase: str, work: Sequence[tuple[str, tuple]],
               fn: Callable, resources: dict[str, Any], timings: dict[str, float], show_progress: bool,
               unit: str, local: bool = False) -> None:
    folder.pull()  # markers that tasks on other nodes committed to a remote run folder
    todo = [(key, args) for key, args in work if folder.read_marker(phase, key) is None]
    result.skipped_tasks += len(work) - len(todo)
    started = time.perf_counter()
    failures: list[str] = []
    disk_full: DiskFull | None = None
    if local:
        pending: dict[Any, str] = {}
    else:
        import ray

        remote = ray.remote(max_retries=3, retry_exceptions=True)(fn).options(**resources, **_fault_env())
        pending = {remote.remote(phase, *args): key for key, args in todo}
    with PhaseProgress(phase, len(work), len(work) - len(todo), unit, enabled=show_progress) as progress:
        for key, outcome in _outcomes(fn, phase, todo, pending, local):
            if isinstance(outcome, Exception):  # Ray already retried it; keep the others running
                failures.append(f"{phase} {key}: {_short_error(outcome)}")
                disk_full = disk_full or find_disk_full(outcome)
                progress.advance(0)
                continue
            result.executed_tasks += 1
            progress.advance(outcome.get("docs_in", 0))
            _fault_point(phase, progress.done - progress.resumed)
    elapsed = time.perf_counter() - started
    timings[phase] = round(timings.get(phase, 0.0) + elapsed, 3)
    result.phases.append({"phase": phase, "tasks": len(work), "ran": len(todo), "seconds": round(elapsed, 3)})
    if disk_full is not None:  # one line, not one traceback per task: the cause is the same for all
        raise PipelineError(disk_full.message(folder.root))
    if failures:
        raise PipelineError(f"{len(failures)} of {len(work)} {phase} tasks failed after retries "
                            f"(finished work is kept; run the same command again to resume):\n"
                            + "\n".join(f"  - {f}" for f in failures[:20]))


def _fault_env() -> dict[str, Any]:
    """Hand the fault hooks' settings to the workers when Ray was started before they were set
    (tests share one Ray): workers of an embedded Ray otherwise inherit the driver's environment."""
    env = {k: v for k, v in os.environ.items() if k == "DATAPIPE_FAULT_ENOSPC_AT"}
    return {"runtime_env": {"env_vars": env}} if env else {}


def _with_marker(phase: str, key: str, fn: Callable[[], dict[str, Any]], root: str) -> dict[str, Any]:
    folder = RunFolder(Path(root))
    folder.pull()  # a remote run folder: this node fetches what earlier tasks committed
    with fault_scope(phase, key), recording_writes() as written:
        marker = fn()
        marker["node"] = _node_id()
        folder.write_marker(phase, key, marker, written)
    return marker


def _map_task(phase: str, spec: RunSpec, shard: Shard, segment: Segment) -> dict[str, Any]:
    return _with_marker(phase, shard.key, lambda: tasks.map_shard(spec, shard, segment), spec.root)


def _lines_task(phase: str, spec: RunSpec, shard: Shard) -> dict[str, Any]:
    return _with_marker(phase, shard.key, lambda: tasks.count_range_lines(spec, shard), spec.root)


def _reduce_task(phase: str, spec: RunSpec, segment: Segment) -> dict[str, Any]:
    key = spec.stage_name(segment.compute_global)  # type: ignore[arg-type]
    return _with_marker(phase, key, lambda: tasks.reduce_stage(spec, segment), spec.root)


def _partition_task(phase: str, spec: RunSpec, segment: Segment, partition: int, round: int) -> dict[str, Any]:
    return _with_marker(phase, f"{partition:05d}", lambda: tasks.reduce_partition(spec, segment, partition, round),
                        spec.root)


def _pack_task(phase: str, spec: RunSpec, rng: PackRange) -> dict[str, Any]:
    return _with_marker(phase, rng.key, lambda: tasks.pack_range(spec, rng), spec.root)


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
        marker = folder.read_marker("map0", shard.key) or {}
        hashed = marker.get("inputs") or ([marker["input"]] if "input" in marker else [])  # "input": older runs
        for h in hashed:
            entry = by_path.get(remote_of(h["path"]) or str(Path(h["path"]).resolve()))
            if entry is not None:
                entry["sha256"] = h["sha256"]


def _input_listing(pipeline: Pipeline) -> list[dict[str, Any]]:
    listing = []
    for source, files in pipeline.inputs.items():
        for path, fmt in files:
            st = input_stat(path)  # an input in object storage: as the store listed it, not downloaded
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
