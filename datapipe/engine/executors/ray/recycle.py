"""When a reused Ray worker process makes way for a fresh one (``workers:`` in the pipeline file).

Ray runs many tasks in one worker process. After each task the worker hands freed memory back
(``runtime/release_memory.py``), yet what it holds still creeps up with the tasks it has run: heap
the allocators keep in fragments, caches that grow. So a reused worker's next task starts higher
the more tasks the worker ran, and the more tasks a run has (a larger corpus), the higher the
largest task's peak (bench/scaling/substrings.py's round tasks started higher at 4x the corpus
than at 1x, for the same work of their own). A fresh worker starts from imports alone.

After each task's release, ``should_exit`` compares what the worker holds with two marks: what
it held after its first task (``floor``: Ray, the imported modules and compiled kernels, and that
task's leftovers), and what it held after its first task of the current phase (``phase_base``: the
phase's models and caches, kept for its next tasks). A worker that starts a phase holding more
than ``recycle_above_mib`` above the floor (what earlier phases left), or ends a later task of the
phase holding more than that above the phase's mark, exits once its result is handed over. So a
task starts within about twice that margin of what a fresh worker would hold, whatever the number
of tasks, and so whatever the size of the corpus. Measuring against what the worker held before
its first task instead made a worker leave at every phase change (its first task's imports and
kernels count as growth).

How it exits: Ray's own ``max_calls``, which makes a worker exit after storing the return value
of its max_calls-th task (the reply tells the caller the worker is leaving, so nothing is retried
or lost). The remote function is declared with ``max_calls=MAX_CALLS``, a count no worker
reaches; ``request_exit`` moves this worker's count of it to one short, so the task running now
is its last. Where Ray lacks what that needs (a later version), the worker is simply reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from datapipe.config.sections import WorkersConfig

MAX_CALLS = 1 << 30  # the remote function's max_calls: never reached by counting (executor.py)


@dataclass
class _Worker:
    floor: float | None = None  # RSS (MiB) after this worker's first task and its release
    settled: bool = False  # the floor was taken after a task that loaded something (it grew)
    phase: str | None = None  # the phase of its last task
    phase_base: float = 0.0  # RSS after its first task of that phase: what the phase keeps loaded
    tasks: int = 0


_WORKER = _Worker()


def should_exit(
    phase: str, start_mib: float | None, now_mib: float | None, settings: WorkersConfig, grew: bool = True
) -> str | None:
    """After a task of ``phase`` that started at ``start_mib`` and was released down to ``now_mib``:
    why this worker should make way for a fresh one (a marker's ``worker_exit``), or None.

    ``grew``: the task peaked well above its start (``worker.py``: ``_grew``). Until a task
    has, the floor is not yet what the worker's phases import: a worker whose first tasks only counted
    lines (the ``lines`` phase) would otherwise count the stages' modules and compiled kernels, loaded
    by its first map task, as what earlier phases left, and leave at the next phase, and its fresh
    successor likewise (fresh workers one after another in bench/perf/pipeline.py, each importing and
    compiling again). So the floor is raised once, after the worker's first task that grew."""
    w = _WORKER
    w.tasks += 1
    if settings.recycle_after_tasks and w.tasks >= settings.recycle_after_tasks:
        return f"ran {w.tasks} tasks"
    margin = settings.recycle_above_mib
    if not margin or start_mib is None or now_mib is None:
        return None
    if w.floor is None or (grew and not w.settled):  # its first task, or its first that loaded something
        if w.floor is None or w.phase != phase:
            w.phase, w.phase_base = phase, now_mib
        w.floor, w.settled = max(now_mib, w.floor or 0.0), grew
        return None
    if w.phase != phase:  # its first task of this phase: what it started with is what earlier phases left
        w.phase, w.phase_base = phase, now_mib
        if start_mib - w.floor > margin:
            return f"started {phase} at {start_mib:.0f} MiB, {start_mib - w.floor:.0f} MiB above its first task's {w.floor:.0f}"
        return None
    if now_mib - w.phase_base > margin:
        return f"holds {now_mib:.0f} MiB, {now_mib - w.phase_base:.0f} MiB above its first {phase} task's {w.phase_base:.0f}"
    return None


def call_counts() -> tuple[dict[Any, Any], dict[Any, Any]] | None:
    """This process's remote functions and how many times it ran each (Ray's private
    ``FunctionActorManager``, which ``max_calls`` counts with), or None where this Ray keeps them
    elsewhere (tests/engine/test_ray_private.py says so by name)."""
    try:
        from ray._private.worker import global_worker

        manager: Any = global_worker.function_actor_manager
        return manager._function_execution_info, manager._num_task_executions
    except (ImportError, AttributeError):
        return None


def request_exit() -> bool:
    """Make the task running now this Ray worker's last: Ray exits the worker after storing its result.
    False where this Ray keeps its counts elsewhere (the worker then stays)."""
    found = call_counts()
    if found is None:
        return False
    infos, counts = found
    ours = [fid for fid, info in list(infos.items()) if getattr(info, "max_calls", None) == MAX_CALLS]
    for fid in ours:
        counts[fid] = MAX_CALLS - 1  # Ray adds this task's one after storing its result, then exits at MAX_CALLS
    return bool(ours)
