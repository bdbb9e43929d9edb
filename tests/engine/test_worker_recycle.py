"""A Ray worker that holds too much more than a fresh one makes way for a fresh one after handing over
its task's result (engine/executors/ray/recycle.py, ``workers:`` in the pipeline file), and no task runs twice."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from datapipe.config.sections import WorkersConfig
from datapipe.engine import plan
from datapipe.engine.executors.ray import recycle
from datapipe.engine.executors.ray.executor import RayExecutor
from datapipe.engine.phases import Phase, Task
from datapipe.pipeline.load import ConfigError, load_pipeline
from tests.conftest import write_pipeline

ROOT = Path(__file__).resolve().parents[2]
_KEPT: list[bytearray] = []  # what a worker keeps across tasks, as heap an allocator does not return


def _keep_memory(spec: plan.RunSpec, mib: int, log: str) -> dict[str, Any]:
    """A task that leaves ``mib`` MiB behind in its worker (touched, so resident), and notes each run."""
    _KEPT.append(bytearray(b"x" * (mib << 20)))
    with open(log, "a") as f:  # one line per execution: a retried task would have two
        f.write(f"{os.getpid()}\n")
    return {"pid": os.getpid()}


def _run(tmp_path: Path, workers: WorkersConfig, n: int, mib: int = 48) -> tuple[list[dict[str, Any]], list[str]]:
    spec = plan.make_spec(load_pipeline(ROOT / "pipelines" / "demo.yaml"), tmp_path / "out", tmp_path / "cache")
    spec = dataclasses.replace(spec, workers=workers)
    log = tmp_path / "executions.log"
    # Both CPUs per task: one task at a time, each in the worker the last one left (or a fresh one).
    phase = Phase("recycle_test", _keep_memory, (), {"num_cpus": 2}, "tasks")
    tasks = [Task(f"t{i}", (mib, str(log))) for i in range(n)]
    with RayExecutor() as ex:
        outcomes = dict(ex.outcomes(spec, phase, tasks))
    markers = [json.loads(outcomes[t.key]) for t in tasks]  # the markers' bytes as committed
    assert all(isinstance(m, dict) for m in markers), markers  # no task failed
    return markers, log.read_text().split()


def test_a_worker_holding_too_much_is_replaced_and_no_task_runs_twice(ray_local: str, tmp_path: Path) -> None:
    markers, executions = _run(tmp_path, WorkersConfig(recycle_above_mib=32), 3)
    assert len(executions) == 3  # every task ran exactly once: none was retried
    leaving = [i for i, m in enumerate(markers) if "worker_exit" in m]
    assert leaving, [m.get("rss_start_mib") for m in markers]  # the second task in a worker left 48 MiB more
    for i in leaving:  # the worker that left ran no later task
        assert all(m["pid"] != markers[i]["pid"] for m in markers[i + 1 :])
        assert markers[i]["worker_pid"] == markers[i]["pid"]
    assert len({m["pid"] for m in markers}) >= 2


def test_a_worker_makes_way_after_a_number_of_tasks(ray_local: str, tmp_path: Path) -> None:
    markers, executions = _run(tmp_path, WorkersConfig(recycle_above_mib=0, recycle_after_tasks=2), 3, mib=0)
    assert len(executions) == 3
    assert any("worker_exit" in m for m in markers)
    pids = [m["pid"] for m in markers]
    assert max(pids.count(p) for p in pids) <= 2  # no worker ran a third (it may have run others' tasks before)


def test_worker_settings_are_validated_with_their_yaml_key_and_leave_the_run_identity_alone(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    config: dict[str, Any] = {"name": "t", "sources": [{"name": "s", "paths": ["a.jsonl"]}]}
    with pytest.raises(ConfigError) as err:
        load_pipeline(write_pipeline(tmp_path, {**config, "workers": {"recycle_above_mib": -1, "max_tasks": 3}}))
    assert "workers.recycle_above_mib" in str(err.value) and "workers.max_tasks: unknown key" in str(err.value)
    plain = load_pipeline(write_pipeline(tmp_path, config))
    tuned = load_pipeline(write_pipeline(tmp_path, {**config, "workers": {"recycle_above_mib": 500}}))
    assert tuned.config.workers.recycle_above_mib == 500
    assert plain.normalized() == tuned.normalized()  # a run resumes under other worker settings


def test_what_a_phase_loads_is_allowed_and_what_earlier_phases_left_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recycle, "_WORKER", recycle._Worker())
    settings = WorkersConfig(recycle_above_mib=32)
    assert recycle.should_exit("map0", 180, 280, settings) is None  # first task: imports and kernels set the floor
    assert recycle.should_exit("map0", 280, 300, settings) is None  # within 32 MiB of the phase's first task
    assert recycle.should_exit("langid", 300, 450, settings) is None  # a phase's model: its first task's mark
    assert recycle.should_exit("langid", 450, 470, settings) is None
    assert "above its first langid task" in (recycle.should_exit("langid", 470, 490, settings) or "")
    monkeypatch.setattr(recycle, "_WORKER", recycle._Worker())
    assert recycle.should_exit("map0", 180, 280, settings) is None
    assert recycle.should_exit("map0", 280, 310, settings) is None
    # the next phase starts 35 MiB above the floor (what map0's tasks left): the worker makes way
    assert "started shuffle0 at 315 MiB" in (recycle.should_exit("shuffle0", 315, 330, settings) or "")


def test_the_floor_is_taken_after_the_first_task_that_loaded_something(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose first task only counted lines holds what its map tasks import (stages, kernels)
    from its first map task on: not what earlier phases left (bench/perf/pipeline.py replaced 7 workers)."""
    monkeypatch.setattr(recycle, "_WORKER", recycle._Worker())
    settings = WorkersConfig(recycle_above_mib=32)
    assert recycle.should_exit("lines", 150, 159, settings, grew=False) is None
    assert recycle.should_exit("map0", 150, 309, settings, grew=True) is None  # imports and kernels: the floor
    assert recycle.should_exit("map0", 309, 310, settings, grew=True) is None
    assert recycle.should_exit("shuffle0", 278, 287, settings, grew=False) is None
    # what later phases leave above that floor still makes the worker leave
    assert "started map1 at 350 MiB" in (recycle.should_exit("map1", 350, 360, settings, grew=True) or "")
