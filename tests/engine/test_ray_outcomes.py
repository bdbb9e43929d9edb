"""The Ray executor hands back each task's marker, or the error the task ended with once its retries
were spent, as the task's own exception class: the runner names it in the run's error, and a full
disk is recognised by it (executors/ray/executor.py ``_when_done``, ``_outcome``); retried only
where the error may pass on another attempt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from datapipe.engine import plan
from datapipe.engine.executors.ray.executor import RayExecutor, Retryable
from datapipe.engine.phases import Phase, Task
from datapipe.errors import PipelineError, UsageError
from datapipe.pipeline.load import load_pipeline

ROOT = Path(__file__).resolve().parents[2]


class BadShard(ValueError):
    pass


def _maybe_fail(spec: plan.RunSpec, shard: plan.Shard, i: int) -> dict[str, Any]:
    with open(Path(spec.root).parent / f"attempts-{i}", "a") as f:
        f.write(".")
    if i == 1:
        raise BadShard(f"task {i} cannot be done")
    if i == 2:
        raise UsageError(f"task {i} is asked for something this machine lacks")
    # The task's own shard comes with it; the spec without the run's shards (Phase.full_spec: a crawl's
    # 37,253 shards pickled for every task cost it 87 ms).
    assert spec.shards == () and shard.ordinal == i
    return {"i": i, "shard": shard.key}


def test_markers_and_failures_come_back_by_task(ray_local: str, tmp_path: Path) -> None:
    spec = plan.make_spec(load_pipeline(ROOT / "pipelines" / "demo.yaml"), tmp_path / "out", tmp_path / "cache", 1 << 16)
    assert len(spec.shards) >= 4
    phase = Phase("outcomes_test", _maybe_fail, (), {"num_cpus": 1}, "tasks")
    tasks = [Task(f"t{i}", (spec.shards[i], i)) for i in range(4)]
    with RayExecutor() as ex:
        outcomes = list(ex.outcomes(spec, phase, tasks))
    assert sorted(k for k, _ in outcomes) == ["t0", "t1", "t2", "t3"]  # each task once
    got = dict(outcomes)
    # A marker comes back as the bytes its task committed: parsed once, by the driver's cache.
    assert got["t0"] == (tmp_path / "out" / "_work" / "markers" / "outcomes_test" / "t0.json").read_bytes()
    markers = {k: json.loads(v) for k, v in got.items() if isinstance(v, bytes)}
    assert [markers[f"t{i}"]["shard"] for i in (0, 3)] == [spec.shards[i].key for i in (0, 3)]
    assert isinstance(got["t1"], BadShard) and "task 1 cannot be done" in str(got["t1"])
    assert isinstance(got["t2"], UsageError) and "lacks" in str(got["t2"])
    # Retried for what another attempt may pass (any exception but a datapipe error that says it is
    # not retryable: DatapipeError.retryable); a usage error fails on its first attempt.
    attempts = {i: len((tmp_path / f"attempts-{i}").read_text()) for i in range(4)}
    assert attempts == {0: 1, 1: 1 + RayExecutor.RETRIES, 2: 1, 3: 1}, attempts


def test_the_retry_allow_list_asks_the_error() -> None:
    assert isinstance(BadShard("x"), Retryable) and isinstance(PipelineError("x"), Retryable)
    assert not isinstance(UsageError("x"), Retryable) and not isinstance(KeyboardInterrupt(), Retryable)
    assert issubclass(PipelineError, Retryable) and not issubclass(UsageError, Retryable)


def test_a_map_task_is_sent_its_shard_and_segment_by_index_and_gets_them_back(tmp_path: Path) -> None:
    import pickle

    from datapipe.engine.executors.ray.worker import spec_slots
    from datapipe.engine.phases import plan_phases

    spec = plan.make_spec(load_pipeline(ROOT / "pipelines" / "demo.yaml"), tmp_path / "out", tmp_path / "cache", 1 << 16)
    assert len(spec.shards) > 1
    by_name = {p.name: p for p in plan_phases(spec)}
    tasks = by_name["map0"].task_list(None)  # type: ignore[arg-type]  # a fixed list: no folder asked
    assert tasks is not None
    slots, sent = spec_slots(spec, tasks)
    assert slots == ((0, "shards"), (1, "segments"))
    assert all(isinstance(a, int) for args in sent for a in args)  # not the source's configuration
    back = pickle.loads(pickle.dumps(spec))  # as a worker gets the spec
    for task, args in zip(tasks, sent):
        assert (back.shards[args[0]], back.segments[args[1]]) == task.args
    # Arguments that are not the spec's travel as they are.
    plain = [Task("a", (spec.segments[0], 3)), Task("b", (spec.segments[0], 4))]
    assert spec_slots(spec, plain) == (((0, "segments"),), [(0, 3), (0, 4)])
    assert spec_slots(spec, [Task("c", ("x",)), Task("d", (spec.segments[0],))]) == ((), [("x",), (spec.segments[0],)])
    # A phase whose tasks get the spec without its shards: the shard travels itself, the segment by index.
    slots, sent = spec_slots(spec, tasks, ("segments",))
    assert slots == ((1, "segments"),) and [a[0] for a in sent] == [t.args[0] for t in tasks]
