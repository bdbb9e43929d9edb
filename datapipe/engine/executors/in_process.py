"""Every task in the driver's own process: for small runs, where Ray's start-up and shutdown
(seconds) would dominate."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from datapipe.engine.executors.base import Clock, Outcome
from datapipe.engine.phases import Phase, Task
from datapipe.engine.plan import RunSpec
from datapipe.engine.worker import run_task


class InProcessExecutor:
    """Every task in this process, one after another, without retries, and without importing Ray.
    The task runs with no hooks: this process keeps its stages and models from task to task."""

    def __init__(self, cpus: int = 1) -> None:
        self._cpus = cpus

    def __enter__(self) -> InProcessExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def observe(self, clock: Clock) -> None:
        return None  # the tasks' work is the driver's own: nothing to tell apart

    def describe(self) -> str:
        return "in this process (no Ray)"

    def cpus(self) -> int:
        return self._cpus

    def outcomes(self, spec: RunSpec, phase: Phase, tasks: Sequence[Task]) -> Iterator[Outcome]:
        for task in tasks:
            try:
                # The driver's own process holds every committed marker: nothing to hand over.
                marker, _ = run_task(phase.name, task.key, phase.fn, spec, *task.args)
                yield task.key, marker
            except Exception as exc:  # noqa: BLE001 - reported with the others, as Ray's failures are
                yield task.key, exc
