"""The task as a Ray worker runs it, and the hygiene of the worker process across tasks and phases.

``ray_run_task`` is the remote function every phase's tasks run through: it unpacks what the driver
sent (one object per phase, the spec by ref, the task's key and arguments) and calls
``engine/worker.run_task`` with ``RAY_WORKER``, the hooks that keep a reused worker lean (stages
dropped between phases, thread pools sized to the task's CPUs, memory handed back, and a worker that
holds too much making way for a fresh one: ``recycle.py``).
"""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from datapipe.engine.executors.ray import recycle
from datapipe.engine.plan import RunSpec, forget_stages
from datapipe.engine.worker import run_task
from datapipe.runtime.release_memory import release_memory
from datapipe.runtime.task_usage import rss_mib

if TYPE_CHECKING:
    from datapipe.run_folder.remote import CommittedPhase


class RayWorkerHooks:
    """``TaskHooks`` of a Ray worker: its next task starts from what that task needs, in this worker
    or a fresh one."""

    def before(self, phase: str) -> None:
        _enter_phase(phase)
        size_thread_pools()

    def after(self, phase: str, marker: dict[str, Any], spec: RunSpec) -> None:
        collect = _grew(marker)
        release_memory(collect=collect)
        _freeze_after_first_collect(collect)
        _make_way(phase, marker, spec)

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


RAY_WORKER = RayWorkerHooks()


# Where a task's argument that is part of the spec is found there: (its position among the task's
# arguments, the spec's field, a tuple). The driver sends its index instead (``spec_slots``).
SpecSlots = tuple[tuple[int, str], ...]
SPEC_FIELDS = ("shards", "segments")


def ray_run_task(
    call: tuple[str, Callable[..., dict[str, Any]], Any, SpecSlots, CommittedPhase | None],
    spec: RunSpec,
    task: tuple[Any, ...],
) -> bytes:
    """``run_task`` as Ray calls it: ``call`` (the phase's name, function, the folders to prune, spec
    slots and what every task of the phase is handed alike, if so) is one object per phase in Ray's
    object store, so submitting a task serializes its key and arguments only (pickling the function and
    the refs for every task was ~a third of the driver's CPU per task). ``spec``: the run's spec, by
    ref, put once per run (Ray unpickles it for each task). ``task``: its key and arguments, one object
    (Ray serializes each argument of a call on its own: one tuple instead of three to five costs the
    driver less per task). An argument in a spec slot came as its index in the spec, which the task
    has anyway.

    Returns the marker's bytes as committed: the driver parses them once to cache the marker
    (``MarkerStore.adopt``), where a dict cost it a pickle's decoding and a JSON encoding too."""
    phase, fn, prune, slots, same = call
    key, committed, args = task[0], task[1], task[2:]
    committed = same if committed is None else committed
    if slots:
        given = list(args)
        for position, name in slots:
            given[position] = getattr(spec, name)[given[position]]
        args = tuple(given)
    handed = None if committed is None else [committed]
    return run_task(phase, key, fn, spec, *args, committed=handed, hooks=RAY_WORKER, prune=prune)[1]


def spec_slots(
    spec: RunSpec, tasks: Sequence[Any], fields: Sequence[str] = SPEC_FIELDS
) -> tuple[SpecSlots, list[tuple[Any, ...]]]:
    """The positions where every task's argument is an item of the spec's ``fields`` (a map task's
    segment; its shard where the task gets the spec with its shards), and each task's arguments with
    those items replaced by their index there. A map task's shard holds its source's whole
    configuration: pickled for every task it costs the driver ~0.05 ms per task, its index nothing, but
    the spec with every shard cost each task 87 ms to unpickle at 37,253 shards (issue 48)."""
    index: dict[int, tuple[str, int]] = {}
    for name in fields:
        index.update({id(item): (name, i) for i, item in enumerate(getattr(spec, name, ()))})
    arities = {len(t.args) for t in tasks}
    if len(arities) != 1:
        return (), [t.args for t in tasks]
    slots: list[tuple[int, str]] = []
    for position in range(arities.pop()):
        found = {index[id(t.args[position])][0] if id(t.args[position]) in index else "" for t in tasks}
        if len(found) == 1 and (name := found.pop()):
            slots.append((position, name))
    if not slots:
        return (), [t.args for t in tasks]
    packed = []
    for t in tasks:
        given = list(t.args)
        for position, _ in slots:
            given[position] = index[id(given[position])][1]
        packed.append(tuple(given))
    return tuple(slots), packed


_FROZEN_AFTER_COLLECT: list[bool] = []


def _freeze_after_first_collect(collected: bool) -> None:
    """What a worker's first large task loaded and kept (numba, the stages' modules and models:
    tens of thousands of objects) survives every later collection too: frozen like Ray's at the
    first task, a later full collection scans that task's leftovers only."""
    if collected and not _FROZEN_AFTER_COLLECT:
        gc.freeze()
        _FROZEN_AFTER_COLLECT.append(True)


# A task whose peak was less than this above what its worker held at its start leaves at most that
# much garbage behind: not worth a full garbage collection (in a worker, more than a small task's
# own work). The allocators' free pages are handed back after every task (cheap): without that,
# a worker's small tasks ratchet it up, to the run's peak.
RELEASE_ABOVE_MIB = 64


def _grew(marker: dict[str, Any]) -> bool:
    peak, start = marker.get("peak_rss_mib"), marker.get("rss_start_mib")
    return peak is None or start is None or peak - start >= RELEASE_ABOVE_MIB


def _make_way(phase: str, marker: dict[str, Any], spec: RunSpec) -> None:
    """Have this worker exit after this task when it holds too much more than a fresh one would
    (recycle.py); the marker records the worker and, when it leaves, why."""
    marker["worker_pid"] = os.getpid()
    reason = recycle.should_exit(phase, marker.get("rss_start_mib"), rss_mib(), spec.workers, grew=_grew(marker))
    if reason is not None and recycle.request_exit():
        marker["worker_exit"] = reason


def size_thread_pools() -> None:
    """Size a Ray worker's native thread pools to the CPUs its task was given.

    The tokenizer's rayon pool starts one thread per core of the machine, and Ray runs a worker per
    CPU: on a 64-core node, 64 workers of 64 threads each. Ray caps OpenMP for its workers
    (OMP_NUM_THREADS), not rayon. rayon reads RAYON_NUM_THREADS when it builds its pool, at the first
    parallel call, so this runs before a task's work; a value the user set (inherited by embedded
    workers, or in a cluster's environment) is kept. A worker then keeps less memory after
    tokenizing, at the same or less CPU."""
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

    A worker's first task freezes what the worker holds then (Ray, the imported modules: objects
    none of which becomes garbage) out of the garbage collector's sight. A full collection after a
    large task (``release_memory``) then scans the stages and the task's leftovers only."""
    if not _WORKER_PHASE:
        gc.freeze()
    elif _WORKER_PHASE[-1] != phase:
        forget_stages()
        release_memory(collect=False)  # the stages are gone by reference count: no full gc needed
    _WORKER_PHASE[:] = [phase]
