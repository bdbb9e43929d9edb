"""Running a pipeline: the loop over its phases, resumed from markers, refused on a changed config.

One driver per run folder (the lock); the folder's record is opened and checked (run_record.py);
the run is planned (its map tasks, once per folder); then each phase submits one task per piece of
work that has no completion marker yet to the executor (executors/: in this process or on Ray),
waits for all of them (showing progress), and the loop moves on; statistics finish the run. A
killed run started again skips whatever finished. Before a run is recorded complete (and at every
resume), its inputs are checked against what its tasks read (input_identity.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from datapipe.engine.disk_full import DiskFull, find_disk_full
from datapipe.engine.errors import PipelineError
from datapipe.engine.executors.base import Executor, local_cpus, phase_section
from datapipe.engine.executors.in_process import InProcessExecutor
from datapipe.engine.executors.ray.executor import RayExecutor
from datapipe.engine.failures import write_log as failures_log
from datapipe.engine.phases import Phase, Task, plan_phases, prune_after
from datapipe.engine.plan import Recorded, RunSpec, build_stage, input_bytes, make_spec, split_target
from datapipe.engine.redecide import plan_reuse
from datapipe.engine.run_record import RunRecord, open_record
from datapipe.pipeline.load import Pipeline
from datapipe.run_folder.checked import DamagedRunFile
from datapipe.run_folder.layout import RunFolder, RunFolderError
from datapipe.run_folder.lock import ReadLock, RunLock
from datapipe.run_folder.remote import CommittedPhase
from datapipe.runtime.faults import fault_point
from datapipe.runtime.heartbeat import Heartbeat, duration
from datapipe.runtime.own_cpu import Sections
from datapipe.runtime.progress import PhaseProgress
from datapipe.storage.atomic import fault_scope
from datapipe.storage.cache import cache_dir
from datapipe.storage.uri import RUN_FILES, InputUnavailable, folder_stats_once, is_uri


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


def run_pipeline(
    pipeline: Pipeline,
    output: Path | str | None = None,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    fresh: bool = False,
    show_progress: bool = True,
    log: Callable[[str], None] = print,
    in_process: bool | None = False,
    executor: Executor | None = None,
    reuse_from: Path | str | None = None,
) -> RunResult:
    """Run ``pipeline`` into its run folder. ``in_process`` runs every task in this process, one after
    another, without starting Ray: for small jobs, where Ray's start-up and shutdown (seconds) would
    dominate. The tasks are the same functions, so the outputs are the same. ``None`` decides per run:
    in this process when the run has a single map task on the embedded cluster (see ``_auto_in_process``).
    ``executor``, given, runs the tasks instead (``ray_address``, ``num_cpus`` and ``in_process`` unused).
    ``reuse_from``: an earlier, complete run folder of the same inputs whose recorded signals are read
    instead of computed where the stage's signal options are unchanged (engine/redecide.py)."""
    folder = RunFolder(output if output is not None else pipeline.default_output())
    folder.check_usable()  # before the lock creates anything in a folder that may be the user's

    def choose(spec: RunSpec | None) -> Executor:
        if executor is not None:
            return executor
        return _pick_executor(pipeline, folder, spec, ray_address, num_cpus, in_process, log)

    try:
        # One driver per folder, taken before anything is read or written (--fresh deletes included).
        # One driver per folder, taken before anything is read or written (--fresh deletes included);
        # the folder re-decided from is held for reading, so no driver rewrites it meanwhile.
        with RunLock(folder.root, log=log), _reading(reuse_from, folder.root), folder_stats_once():
            return _run_locked(pipeline, folder, fresh, show_progress, log, choose, reuse_from)
    except KeyboardInterrupt:
        raise RunInterrupted(
            f"interrupted: the run in {folder.root} was stopped; finished work is kept, and running the "
            f"same command again resumes it"
        ) from None
    except (PipelineError, RunFolderError):
        raise
    except Exception as exc:
        full = find_disk_full(exc)
        if full is None:
            raise
        raise PipelineError(full.message(folder.root)) from None


def _run_locked(
    pipeline: Pipeline,
    folder: RunFolder,
    fresh: bool,
    show_progress: bool,
    log: Callable[[str], None],
    choose: Callable[[RunSpec | None], Executor],
    reuse_from: Path | str | None = None,
) -> RunResult:
    for warning in pipeline.warnings:  # settings that run, but likely not as meant (Stage.warnings)
        log(f"datapipe: warning: {warning}")
    reuse = plan_reuse(pipeline, reuse_from, folder, log) if reuse_from is not None else None  # refused: nothing written
    record = open_record(pipeline, folder, fresh, log)
    if reuse is not None:
        record.run["from"] = reuse.record
        if not record.split:  # the earlier run's map tasks: each one's recorded rows are in its files
            record.run["split"] = reuse.split
    spec = _recorded_plan(pipeline, record, reuse.recorded if reuse is not None else None)
    record.start_attempt(pipeline)
    fault_point("lock", 1)
    result = RunResult(folder.root, record.run)
    timings: dict[str, float] = dict(record.run.get("timings", {}))
    # The driver's own CPU (its threads, not Ray's) by section, recorded in run.json: the start (the
    # imports, the record, planning, Ray's start), each phase, the end. What a driver spends per task
    # is the phases' and the end's; the start's, which moves a lot between runs, stays apart.
    sections = Sections()
    closing: _Closing | None = None
    if spec is not None:  # work of earlier attempts: redone where its files are damaged or gone
        _repair(folder, log, hashes=True)
    for _ in range(MAX_REPAIRS + 1):
        tasks = [] if spec is None else _all_tasks(spec, folder)
        if spec is not None and all_done(folder, tasks):
            result.skipped_tasks = len(tasks)  # nothing left to compute: no executor started
            log(f"datapipe: every task of {pipeline.name!r} is already done in {folder.root}; rebuilding statistics")
        else:
            chosen = choose(spec)
            # A fresh run is planned while the executor starts (embedded Ray: seconds of wall in which the
            # driver mostly waits for Ray's processes), for the CPUs it will have when they are known.
            planning = _plan_meanwhile(pipeline, record, chosen) if spec is None else None
            with contextlib.ExitStack() as stack:
                executor = stack.enter_context(chosen)
                if spec is None:  # (a re-decided run is planned already)
                    spec = _planned(planning, pipeline, record, executor.cpus())
                executor.observe(sections)
                log(
                    f"datapipe: running {pipeline.name!r} {executor.describe()}, {len(spec.shards)} map tasks; "
                    f"output in {folder.root}"
                )
                if spec.tokenizer is not None:
                    log(f"datapipe: tokens encoded with {spec.tokenizer.describe()}")
                    # run.json says which encoder the run chose and why; encoder.tasks, at the end,
                    # which one each task's worker used (a worker whose sample check failed fell back).
                    record.run["encoder"] = {"engine": spec.tokenizer.engine, "why": spec.tokenizer.engine_note}
                run_phases(result, folder, spec, executor, timings, show_progress, sections)
                # Every task is done: the executor shuts down (Ray: its processes stopped, seconds of wall
                # and little CPU) while the driver finishes the run, which needs no executor.
                closing = _Closing(stack.pop_all())
        try:
            finished = _finish(pipeline, record, spec, timings, log, sections, closing)
            if closing is not None:  # (the end stopped early: its work is to be redone, on a new executor)
                closing.join()
        except BaseException:
            if closing is not None:
                closing.join(quiet=True)  # the end's own error is the one to tell
            raise
        finally:
            closing = None
        if finished:
            if reuse is not None:
                log(_reused_counts(record))
            return result
    raise PipelineError(
        f"files of {folder.location} were lost or damaged again after their tasks were redone "
        f"{MAX_REPAIRS} times, so the run is not marked complete; is something else deleting or "
        f"writing files there (or is the object store losing them)?"
    )


class _Closing:
    """An executor's exit (``ExitStack.close``) on a thread of its own; ``join`` waits for it and raises
    what it raised."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._error: BaseException | None = None

        def close() -> None:
            try:
                stack.close()
            except BaseException as exc:  # noqa: BLE001 - raised again by join, in the driver's thread
                self._error = exc

        self._thread = threading.Thread(target=close, name="datapipe-executor-exit", daemon=True)
        self._thread.start()

    def join(self, quiet: bool = False) -> None:
        """Wait for the exit; raise its error once, unless ``quiet``."""
        self._thread.join()
        error, self._error = self._error, None
        if error is not None and not quiet:
            raise error


def _plan_meanwhile(pipeline: Pipeline, record: RunRecord, executor: Executor) -> tuple[int, Future[RunSpec]] | None:
    """``_plan`` on a thread, for the CPUs ``executor`` says it will have (``planned_cpus``), started
    before the executor is entered; None when those are known only once it has started (a Ray
    cluster's, an executor that runs the tasks in this process)."""
    planned_cpus = getattr(executor, "planned_cpus", None)
    cpus = planned_cpus() if planned_cpus is not None else None
    if cpus is None:
        return None
    pool = ThreadPoolExecutor(1, thread_name_prefix="datapipe-plan")
    try:
        return cpus, pool.submit(_plan, pipeline, record, cpus)
    finally:
        pool.shutdown(wait=False)


def _planned(planning: tuple[int, Future[RunSpec]] | None, pipeline: Pipeline, record: RunRecord, cpus: int) -> RunSpec:
    """The run planned for ``cpus`` CPUs: what ``_plan_meanwhile`` planned, when it planned for as many."""
    if planning is not None:
        spec = planning[1].result()  # planning's own error, if it failed, as _plan would raise it
        if planning[0] == cpus:
            return spec
    return _plan(pipeline, record, cpus)


# Finished work found damaged at the end of a run (files lost from an object store meanwhile) is
# redone, and the run finished again, at most this many times before the run gives up.
MAX_REPAIRS = 2


def _repair(folder: RunFolder, log: Callable[[str], None], hashes: bool) -> int:
    """Discard finished work whose files are missing or damaged (run_folder/integrity.py), so it is
    redone; returns how many tasks. ``hashes``: documents and shards are hashed too."""
    from datapipe.run_folder.integrity import discard, find_damage

    damaged = find_damage(folder, hashes=hashes)
    return discard(folder, damaged, log) if damaged else 0


def _reading(source: Path | str | None, output: Path) -> contextlib.AbstractContextManager[object]:
    """The run folder a run re-decides from (``--from``), locked for reading while the run reads it."""
    if source is None or is_uri(source) or not Path(source).is_dir() or Path(source).resolve() == output:
        return contextlib.nullcontext()  # refused by plan_reuse, with its reason
    return ReadLock(Path(source).resolve())


def _redo_miscounted(folder: RunFolder, spec: RunSpec, log: Callable[[str], None]) -> int:
    """Discard the map markers whose counts disagree with their files (engine/marker_counts.py), so
    their tasks are redone; returns how many."""
    from datapipe.engine.marker_counts import count_damage
    from datapipe.run_folder.integrity import discard

    damaged = count_damage(folder, spec)
    return discard(folder, damaged, log) if damaged else 0


def _recorded_plan(pipeline: Pipeline, record: RunRecord, recorded: Recorded | None = None) -> RunSpec | None:
    """The run's tasks as planned when it first started; None before that. Bytes per map task are
    chosen once per run folder for the cluster it starts on (engine/splits.py), then recorded, so a
    resumed run forms the same tasks (and finds their markers) on any cluster."""
    target = record.split.get("target_bytes")
    if not target:
        return None
    spec = make_spec(pipeline, record.folder.root, cache_dir(), target, recorded)
    planned = record.split.get("map_tasks")
    if planned is not None and planned != len(spec.shards):
        # Same target, other ranges: the folder was planned by a datapipe whose splitting differed
        # (e.g. before ranges could exceed the target by 10%). Its markers name other byte ranges.
        raise PipelineError(
            f"{record.folder.root} was planned as {planned} map tasks; this datapipe plans the same inputs "
            f"as {len(spec.shards)}, so its finished tasks cannot be reused. Use --fresh to start over, "
            f"or --output to write elsewhere."
        )
    _prepare(spec)
    return spec


def _plan(pipeline: Pipeline, record: RunRecord, cpus: int) -> RunSpec:
    """The run's tasks for ``cpus`` CPUs: large files split, small ones grouped; recorded in run.json."""
    target = split_target(pipeline, cpus)
    spec = make_spec(pipeline, record.folder.root, cache_dir(), target)
    _prepare(spec)
    record.record_split(target, cpus, len(spec.shards))
    return spec


def _prepare(spec: RunSpec) -> None:
    for pos in range(1, len(spec.stages) + 1):
        build_stage(spec, pos).prepare()  # fetch models now: one clear error instead of one per task


def _pick_executor(
    pipeline: Pipeline,
    folder: RunFolder,
    spec: RunSpec | None,
    ray_address: str | None,
    num_cpus: int | None,
    in_process: bool | None,
    log: Callable[[str], None],
) -> Executor:
    if in_process is None:
        cpus = num_cpus or local_cpus()
        if not ray_address and _auto_in_process(pipeline, folder, spec, cpus):
            return InProcessExecutor(cpus)  # planned as the embedded Ray it replaces would plan it
    return make_executor(bool(in_process), ray_address, num_cpus, log)


def make_executor(
    in_process: bool, ray_address: str | None = None, num_cpus: int | None = None, log: Callable[[str], None] = print
) -> Executor:
    """The executor ``datapipe run`` asked for: ``--in-process``, else Ray (``--ray-address``: a cluster)."""
    if in_process:
        return InProcessExecutor()
    return RayExecutor(ray_address, num_cpus, log)


# A run without per-document stages (read, tokenize, write) runs in the driver up to this much input.
# Its work is then reading (one thread) and encoding, which the fast encoder spreads over threads
# (tiktoken releases the GIL), so Ray's worker processes add only their start-up
# (bench/perf/pipeline.py --stages tokenize). Past a few hundred MB the driver's one reading thread
# would be the bottleneck, and Ray's processes read in parallel.
STAGELESS_IN_PROCESS_BYTES = 128 << 20


def _auto_in_process(pipeline: Pipeline, folder: RunFolder, spec: RunSpec | None, cpus: int) -> bool:
    """Whether a run without --in-process or --ray should skip Ray: when it has one map task, or no
    per-document stages and at most ``STAGELESS_IN_PROCESS_BYTES`` of input. Ray can only overlap
    tasks, and one map task leaves nothing to overlap, while embedded Ray's start costs seconds of
    wall and CPU (each of its processes imports Ray) and hundreds of MiB (bench/perf/startup.py,
    bench/perf/pipeline.py --stages tokenize)."""
    if not pipeline.stage_options and input_bytes(pipeline) <= STAGELESS_IN_PROCESS_BYTES:
        return True
    if spec is None:  # not planned yet: plan as the embedded cluster of ``cpus`` CPUs would
        spec = make_spec(pipeline, folder.root, cache_dir(), split_target(pipeline, cpus))
    return len(spec.shards) <= 1


def run_phases(
    result: RunResult,
    folder: RunFolder,
    spec: RunSpec,
    executor: Executor,
    timings: dict[str, float],
    show_progress: bool,
    sections: Sections | None = None,
    phases: Sequence[Phase] | None = None,
) -> None:
    """The engine loop: each phase of the plan in order, its unfinished tasks run and awaited.
    ``sections``: the driver's own CPU is marked by part of each phase (plan, submit, results,
    commit: below), so what holds the run up is told apart from what overlaps running tasks.
    ``phases``: the plan's phases (default ``plan_phases(spec)``); benches and tests that drive the
    loop with phases of their own pass them here (bench/scaling/driver_scale.py)."""
    if sections is not None:
        sections.mark("start")
    # A remote run folder: the markers committed before this driver started (a resumed run's). Those
    # of the tasks it runs come back with their results (``_run_phase`` adopts them), and no other
    # driver writes here (the lock), so no phase needs another pull (one per phase listed every
    # marker of the run again).
    folder.pull()
    # A remote run folder: what no later phase reads is deleted from each node's mirror (the store keeps
    # it), by the driver here and by each worker before its next task (Phase.prune).
    dead: list[str] = []
    gone_after = prune_after(spec) if folder.remote is not None else {}
    for phase in plan_phases(spec) if phases is None else phases:
        work = phase.task_list(folder)
        assert work is not None, f"{phase.name}: its tasks depend on phases that did not finish"
        if work:  # e.g. shuffle rounds after one that forwarded nothing have none: nothing to run or show
            _run_phase(result, folder, replace(phase, prune=tuple(dead)), work, executor, spec, timings, show_progress)
            if sections is not None:
                sections.mark(phase_section(phase.name, "results"))
        dead += gone_after.get(phase.name, ())
        folder.prune(dead)
        if sections is not None and work:
            # The phase's parts (executors/base.py ``phase_section``): the executor marks "plan" and
            # "submit", the loop "results" and "commit".
            sections.mark(phase_section(phase.name, "commit"))


def _all_tasks(spec: RunSpec, folder: RunFolder) -> list[tuple[str, str]]:
    """(phase, task key) of every task the run consists of, as their markers name them (packing's
    ranges follow from the final map markers: until those exist, a placeholder stands for packing)."""
    out: list[tuple[str, str]] = []
    for phase in plan_phases(spec):
        work = phase.task_list(folder)
        out += [(phase.name, t.key) for t in work] if work is not None else [(phase.name, "?planned-after-map")]
    return out


def all_done(folder: RunFolder, tasks: list[tuple[str, str]]) -> bool:
    """Whether every task has its marker: one listing of each phase's markers (read in parallel)."""
    done: dict[str, dict[str, Any]] = {}
    for phase, key in tasks:
        if phase not in done:
            done[phase] = folder.markers.read_all(phase)
        if key not in done[phase]:
            return False
    return True


def _handed(folder: RunFolder, phase: Phase, task: Task, nothing: list[CommittedPhase] | None = None) -> CommittedPhase:
    """``nothing``: the entries of a task that reads nothing by path (a first map task), made once and shared."""
    files, markers = phase.inputs(task) if phase.inputs is not None else ([], [])
    if files or markers or nothing is None:
        return folder.markers.handed(files, markers)
    if not nothing:
        nothing.append(folder.markers.handed([], []))
    return nothing[0]


def _run_phase(
    result: RunResult,
    folder: RunFolder,
    phase: Phase,
    work: Sequence[Task],
    executor: Executor,
    spec: RunSpec,
    timings: dict[str, float],
    show_progress: bool,
) -> None:
    """Run the phase's unfinished tasks, counting their outcomes as they come; its failures, all of
    them, end the run once the phase is over."""
    name = phase.name
    done = folder.markers.read_all(name)  # one listing of the phase's markers, not one read per task
    todo = [task for task in work if task.key not in done]
    if phase.follows is not None and folder.remote is not None:
        # Each task on the node whose mirror holds the outputs of the task it follows (engine/phases.py).
        todo = phase.placed(todo, {key: m["node"] for key, m in folder.markers.read_all(phase.follows).items() if "node" in m})
    if folder.remote is not None and phase.same_inputs and todo:
        shared = _handed(folder, phase, todo[0])  # the same for every task: made once, one object for all
        todo = [t.handed(shared) for t in todo]
    elif folder.remote is not None:
        # Each task is handed the committed entries of what it reads (Phase.inputs): a task neither lists
        # nor reads markers on the store, and a worker holds only its current task's (run_folder/remote.py).
        nothing: list[CommittedPhase] = []
        todo = [t.handed(_handed(folder, phase, t, nothing)) for t in todo]
    result.skipped_tasks += len(work) - len(todo)
    started = time.perf_counter()
    failed: list[tuple[str, Exception]] = []
    disk_full: DiskFull | None = None
    with PhaseProgress(name, len(work), len(work) - len(todo), phase.unit, enabled=show_progress, label=phase.label) as progress:
        for key, outcome in executor.outcomes(spec, phase, todo):
            if isinstance(outcome, Exception):  # retried where the executor retries; keep the others running
                failed.append((key, outcome))
                disk_full = disk_full or find_disk_full(outcome)
                progress.advance(0, failed=True)
                continue
            # The marker came back with the result: the driver never reads it back (run_folder/remote.py).
            marker = folder.markers.adopt(name, key, outcome)
            result.executed_tasks += 1
            progress.advance(marker.get("docs_in", 0) if marker is not None else 0)
            fault_point(name, progress.done - progress.resumed)
    elapsed = time.perf_counter() - started
    timings[name] = round(timings.get(name, 0.0) + elapsed, 3)
    result.phases.append({"phase": name, "tasks": len(work), "ran": len(todo), "seconds": round(elapsed, 3)})
    if disk_full is not None:  # one line, not one traceback per task: the cause is the same for all
        raise PipelineError(disk_full.message(folder.root))
    # A Ray task's error is also an instance of its cause (executors/ray): the cause holds the details.
    if unread := [getattr(exc, "cause", exc) for _, exc in failed if isinstance(exc, InputUnavailable)]:
        raise _inputs_unavailable(unread, len(failed), len(work), name)
    if damaged := [getattr(exc, "cause", exc) for _, exc in failed if isinstance(exc, DamagedRunFile)]:
        # A file a task read is not what its task wrote (the run re-decided from, --from): no retry helps.
        raise PipelineError(str(damaged[0]), hint=damaged[0].hint)
    if not failed:
        folder.markers.seal(name)  # every marker of the phase held: planning the next ones lists no folder
    if failed:
        try:  # the tracebacks, and Ray's notices of the attempts it retried (engine/failures.py)
            where = f"; tracebacks in {failures_log(folder.work, name, failed)}"
        except OSError:
            where = ""
        raise PipelineError(
            f"{len(failed)} of {len(work)} {name} tasks failed after retries "
            f"(finished work is kept; run the same command again to resume{where}):\n"
            + "\n".join(f"  - {name} {key}: {_short_error(exc)}" for key, exc in failed[:20])
        )


def _reused_counts(record: RunRecord) -> str:
    """After a re-decided run: per stage reached, the documents whose signals were read from the earlier
    run and those computed (the earlier run dropped them before the stage, or the stage is computed)."""
    parts = []
    for row in record.run.get("counts", {}).get("stages", [])[1:]:
        judged = row["in"] - row.get("skipped", 0)
        if judged <= 0 or row["stage"] == "tokenize":
            continue
        read = row.get("recorded", 0)
        parts.append(f"{row['position']} {row['stage']} {read} read, {judged - read} computed")
    return f"datapipe: signals from {record.run['from']['run']}: " + ("; ".join(parts) or "no stage judged a document")


def _finish(
    pipeline: Pipeline,
    record: RunRecord,
    spec: RunSpec,
    timings: dict[str, float],
    log: Callable[[str], None],
    sections: Sections,
    closing: _Closing | None = None,
) -> bool:
    """Every task done: the inputs checked against what the tasks read (before anything is built
    from them), statistics built and published, the run checked, then recorded as complete. False,
    with nothing recorded, when files of finished tasks were lost or damaged meanwhile (their tasks
    are then to be redone): run.json says complete only over every file the markers name. ``closing``:
    the executor's exit, running meanwhile; joined before the run is recorded complete."""
    from datapipe.engine.finish import build_stats, check_conservation, collect_counts

    folder = record.folder
    # Checking the inputs and building the audit database read the whole run: at scale they take long
    # enough to need progress lines in a log too (runtime/heartbeat.py).
    with Heartbeat(lambda elapsed: f"stats: checking inputs, building stats.duckdb, {duration(elapsed)} elapsed"):
        record.check_inputs(log)
        started = time.perf_counter()
        if _repair(folder, log, hashes=False):  # sizes (on a store: one listing), before they are read
            return False
        counts = collect_counts(folder, spec)
        # Map tasks per encoding library: a fact of how the run was executed, not of its documents, so
        # beside the encoder's choice and not in counts (which a run split otherwise must equal).
        encoders = counts.pop("encoders", {})
        if encoders:
            record.run.setdefault("encoder", {})["tasks"] = encoders
        if spec.tokenizer is not None and set(encoders) - {spec.tokenizer.engine}:
            log(
                f"datapipe: a worker's sample check fell back: map tasks by encoder {encoders} "
                "(each checked against tokenizers on its first batch)"
            )
        with fault_scope("stats", "build"):
            build_stats(folder, spec, counts)
        folder.publish(*(f for f in RUN_FILES if f != "run.json"))  # run.json last: it says complete
        fault_point("stats", 1)
        timings["stats"] = round(time.perf_counter() - started, 3)
        try:
            check_conservation(folder, counts)
        except PipelineError:
            if _redo_miscounted(folder, spec, log):  # a marker changed after its task wrote it: redone
                return False
            raise
        record.check_finished(pipeline, spec)
        # A Ray worker killed mid-write and retried leaves its temporary file behind; every task is
        # done now, so whatever temporary name is left belongs to no live writer.
        folder.sweep()
        if _repair(folder, log, hashes=False):  # lost while statistics were built (an object store restarted)
            return False
        sections.mark("end")
        if closing is not None:  # the executor's exit, which ran meanwhile: what is left of it
            closing.join()
        sections.mark("executor_exit")
        record.run["driver_cpu_s"] = sections.record()
        record.complete(timings, counts)
        return True


def _inputs_unavailable(unread: list[InputUnavailable], failed: int, tasks: int, phase: str) -> PipelineError:
    """The run's error when its inputs' store failed tasks: the store, the files, what to do."""
    stores = sorted({exc.store for exc in unread})
    files = sorted({exc.path for exc in unread})
    return PipelineError(
        f"inputs of the run could not be read from {', '.join(stores)}, though they were there when the run "
        f"was planned: {failed} of {tasks} {phase} tasks failed after retrying the store (finished work is kept; "
        f"no document of these files was counted as read):\n" + "\n".join(f"  - {f}: {_detail(unread, f)}" for f in files[:20]),
        hint=unread[0].hint or "check that the store is up and holds these files, then run the same command again",
    )


def _detail(unread: list[InputUnavailable], path: str) -> str:
    """What went wrong with ``path``, from the first error naming it (its message less the path)."""
    text = next(str(e) for e in unread if e.path == path)
    return text[len(path) + 2 :] if text.startswith(f"{path}: ") else text


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:500] if text else type(exc).__name__
