"""The executor seam: what the runner's loop asks of whatever runs a run's tasks.

The runner's loop knows only ``Executor``: entered once per run (a Ray session starts, the kernels
warm up), asked for the CPUs the plan is sized for, then handed each phase's unfinished tasks; it
answers with each task's marker or the exception the task ended with, as tasks finish. Every
executor runs ``engine/worker.run_task``, so outputs are the same whatever runs them; the order of
the outcomes is free (outputs are named by task, never by completion order).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from datapipe.engine.phases import Phase, Task
from datapipe.engine.plan import RunSpec

# (task key, its marker, or the marker's bytes as committed, or the exception the task ended with)
Outcome = tuple[str, dict[str, Any] | bytes | Exception]


class Clock(Protocol):
    """The driver's own CPU by section (``runtime/own_cpu.Sections``): ``mark(name)`` closes the
    section running since the last mark and names it."""

    def mark(self, name: str) -> None: ...


def phase_section(phase: str, part: str) -> str:
    """The name of a phase's part in the driver's CPU by section: "plan" up to its first task handed
    over, "submit" handing its tasks over, "results" up to the last task's marker adopted (these two
    overlap running tasks), "commit" the rest. Only what comes before the first task and after the
    last one holds the run up (docs/scaling.md)."""
    return f"phase:{phase}:{part}"


class Executor(Protocol):
    """Runs a run's tasks; ``observe``, ``describe``, ``cpus`` and ``outcomes`` are asked between enter and exit."""

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...

    def observe(self, clock: Clock) -> None:
        """Called once the run is planned, before its first phase, with the driver's clock: an
        executor that hands tasks to other processes marks each phase's "plan" and "submit" parts on
        it (``phase_section``) and may drop what only planning needed; one that runs tasks in the
        driver's own process marks nothing (their work is the driver's)."""
        ...

    def describe(self) -> str:
        """Where the tasks run, for the log: "in this process (no Ray)", "on embedded Ray (...)"."""
        ...

    def cpus(self) -> int:
        """The CPUs the run's map tasks are sized for (a run planned first here keeps that split)."""
        ...

    def outcomes(self, spec: RunSpec, phase: Phase, tasks: Sequence[Task]) -> Iterator[Outcome]:
        """Run ``tasks`` of ``phase``; one outcome per task, in any order: its marker (a dict, or its
        bytes as the task committed them: ``MarkerStore.adopt`` takes either). A task's failure is an
        outcome (the others go on); retries, where the executor has them, are already spent. A task run
        in another process gets ``task.committed`` (``run_task``'s ``committed``): in a remote run
        folder, it learns from it the committed entries of what it reads; and the spec without its
        shards unless ``phase.full_spec`` (a map task is handed its own shard)."""
        ...


def local_cpus() -> int:
    """The CPUs this process may use (its affinity: a container's or taskset's limit, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
