"""The executor seam (datapipe/engine/executors/base.py): the runner's loop drives any object with the
``Executor`` protocol, and the executors it ships give the same outputs for the same plan."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from datapipe.engine.executors.base import Clock, Executor, Outcome
from datapipe.engine.executors.in_process import InProcessExecutor
from datapipe.engine.executors.ray.executor import RayExecutor
from datapipe.engine.phases import Phase, Task
from datapipe.engine.plan import RunSpec
from datapipe.engine.runner import RunResult, make_executor, run_pipeline
from datapipe.pipeline.load import load_pipeline
from tests.e2e.test_resume import fingerprint


class CountingExecutor:
    """A custom executor: counts what the loop asks of it, and lets an in-process one do the work."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.entered = self.exited = 0
        self.tasks: Counter[str] = Counter()  # phase -> tasks handed over
        self.outcomes_seen = 0

    def __enter__(self) -> CountingExecutor:
        self.entered += 1
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.exited += 1
        self.inner.__exit__(*exc)

    def describe(self) -> str:
        return "through a counting executor"

    def cpus(self) -> int:
        return self.inner.cpus()

    def observe(self, clock: Clock) -> None:
        self.inner.observe(clock)

    def outcomes(self, spec: RunSpec, phase: Phase, tasks: Sequence[Task]) -> Iterator[Outcome]:
        self.tasks[phase.name] += len(tasks)
        for outcome in self.inner.outcomes(spec, phase, tasks):
            self.outcomes_seen += 1
            yield outcome


def _run(project: Path, out: Path, executor: Executor, log: list[str] | None = None) -> RunResult:
    return run_pipeline(
        load_pipeline(project / "pipelines" / "demo.yaml"),
        output=out,
        show_progress=False,
        log=(log.append if log is not None else lambda _: None),
        executor=executor,
    )


def _docs_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in (root / "docs").rglob("*.parquet"))


def test_in_process_and_ray_executors_give_identical_outputs(demo_project: Path, ray_local: str, tmp_path: Path) -> None:
    # Planned for the shared Ray's 2 CPUs both times: the same map tasks, so the same file names.
    here = _run(demo_project, tmp_path / "here", InProcessExecutor(cpus=2))
    ray = _run(demo_project, tmp_path / "ray", RayExecutor())
    assert here.executed_tasks == ray.executed_tasks > 0
    assert [p["phase"] for p in here.phases] == [p["phase"] for p in ray.phases]
    assert _docs_files(tmp_path / "here") == _docs_files(tmp_path / "ray")
    assert fingerprint(tmp_path / "here") == fingerprint(tmp_path / "ray")  # shard bytes, docs, documents table
    nodes = {json.loads(p.read_text())["node"] for p in (tmp_path / "ray" / "_work" / "markers").rglob("*.json")}
    assert nodes and "local" not in nodes  # the Ray run's tasks did run in Ray's workers
    # The driver's own CPU of each phase, by part: before its first task was handed over, the others
    # handed over, the results, the commit (runner.run_phases; docs/scaling.md fits each).
    sections = json.loads((tmp_path / "ray" / "run.json").read_text())["driver_cpu_s"]
    for phase in ray.phases:
        parts = {k.rsplit(":", 1)[1] for k in sections if k.startswith(f"phase:{phase['phase']}:")}
        assert parts == {"plan", "submit", "results", "commit"}, (phase, sections)


def test_a_custom_executor_drives_a_run(demo_project: Path, tmp_path: Path) -> None:
    counting = CountingExecutor(InProcessExecutor())
    log: list[str] = []
    result = _run(demo_project, tmp_path / "out", counting, log)
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["status"] == "complete"
    assert (counting.entered, counting.exited) == (1, 1)
    assert counting.outcomes_seen == sum(counting.tasks.values()) == result.executed_tasks > 0
    assert list(counting.tasks) == [p["phase"] for p in result.phases]  # one call per phase with work, in order
    assert run["split"]["cpus"] == 1  # planned for the CPUs the executor named
    assert any("through a counting executor" in m for m in log)
    # Everything done: the run is finished again without entering the executor at all.
    again = _run(demo_project, tmp_path / "out", counting)
    assert (counting.entered, again.executed_tasks, again.skipped_tasks) == (1, 0, result.executed_tasks)


def test_the_run_options_pick_the_executor() -> None:
    assert isinstance(make_executor(True), InProcessExecutor)
    embedded, cluster = make_executor(False, num_cpus=3), make_executor(False, ray_address="10.0.0.1:6379")
    assert isinstance(embedded, RayExecutor) and (embedded.address, embedded.num_cpus) == (None, 3)
    assert isinstance(cluster, RayExecutor) and cluster.address == "10.0.0.1:6379"
