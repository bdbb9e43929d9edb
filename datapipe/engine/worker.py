"""One task of any phase, whatever runs it: the phase's function, then the task's completion marker.

``run_task`` is the one function every executor calls, unchanged. What differs by where it runs
(a Ray worker keeps its process lean across tasks and phases: ``executors/ray/worker.py``) comes in
as ``TaskHooks``; the task never asks where it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from datapipe.engine.plan import RunSpec
from datapipe.run_folder.layout import RunFolder
from datapipe.run_folder.remote import CommittedPhase
from datapipe.runtime.faults import fault_hold
from datapipe.runtime.task_usage import TaskUsage
from datapipe.storage.atomic import fault_scope, recording_writes


class TaskHooks(Protocol):
    """What the process running a task does around it."""

    def before(self, phase: str) -> None:
        """Before the task's work: ``phase`` is the phase it belongs to."""
        ...

    def after(self, phase: str, marker: dict[str, Any], spec: RunSpec) -> None:
        """After its work, before its marker is written (the hook may add to ``marker``)."""
        ...

    def node(self) -> str:
        """The node the task runs on, recorded in its marker (a later phase's task is placed there)."""
        ...


class NoHooks:
    """A task in the driver's own process: nothing around it, and no node of a cluster."""

    def before(self, phase: str) -> None:
        return None

    def after(self, phase: str, marker: dict[str, Any], spec: RunSpec) -> None:
        return None

    def node(self) -> str:
        return "local"


NO_HOOKS = NoHooks()


def run_task(
    phase: str,
    key: str,
    fn: Callable[..., dict[str, Any]],
    spec: RunSpec,
    *args: Any,
    committed: Sequence[CommittedPhase] | None = None,
    hooks: TaskHooks = NO_HOOKS,
    prune: Sequence[str] = (),
) -> tuple[dict[str, Any], bytes]:
    """One task of any phase: ``fn(spec, *args)``, then its completion marker (written after the
    task's outputs are in place, so a marker means done and durable; a remote run folder uploads the
    files the task wrote, then the marker that names them). Returns the marker and its bytes as
    committed.

    ``committed``: in a remote run folder, the committed entries of what the task reads (``Task.committed``),
    from the driver: the task's node learns the files it may fetch without listing or reading markers
    on the store. None: this process already knows (the driver's own). ``prune``: folders no phase from
    this one on reads, deleted from this node's mirror first (``Phase.prune``)."""
    hooks.before(phase)
    folder = RunFolder(Path(spec.root))
    if committed is not None:
        folder.markers.install(committed)
    folder.prune(prune)  # what no phase from this one on reads, gone from this node's mirror (``Phase.prune``)
    with fault_scope(phase, key), recording_writes() as written:
        usage = TaskUsage()  # per-task peak RSS and CPU, for bench/scaling/scale.py and the audit
        marker = fn(spec, *args)
        for name, value in usage.finish().items():
            marker.setdefault(name, value)  # a task's own cpu_seconds (map: its work only) wins
        marker["node"] = hooks.node()
        fault_hold(phase, key)
        hooks.after(phase, marker, spec)  # its next task starts from what that task needs
        body = folder.markers.write(phase, key, marker, written)
    return marker, body
