"""A Ray worker keeps a phase's stages and models for that phase's tasks, and drops them when it moves
on to another phase (engine/executors/ray/worker.py ``_enter_phase``), so later phases do not carry them."""

from __future__ import annotations

from pathlib import Path

import pytest

from datapipe.engine import plan
from datapipe.engine.executors.ray import worker
from datapipe.pipeline.load import load_pipeline
from datapipe.stages import cjk, langid

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spec(tmp_path: Path) -> plan.RunSpec:
    return plan.make_spec(load_pipeline(ROOT / "pipelines" / "demo.yaml"), tmp_path / "out", tmp_path / "cache")


def _langid_position(spec: plan.RunSpec) -> int:
    return next(i for i, (kind, _) in enumerate(spec.stage_options, start=1) if kind == "langid")


def test_models_stay_within_a_phase_and_go_at_the_next(spec: plan.RunSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "_WORKER_PHASE", [])
    pos = _langid_position(spec)
    worker._enter_phase("map0")
    stage = plan.build_stage(spec, pos, setup=True)
    assert langid._MODELS, "langid's setup loads the fastText model"
    detector = cjk.ScriptDetector.shared()

    worker._enter_phase("map0")  # another task of the same phase: everything is reused
    assert plan.build_stage(spec, pos, setup=True) is stage
    assert cjk.ScriptDetector.shared() is detector and langid._MODELS

    worker._enter_phase("map1")  # the next phase: the worker lets them go
    assert not langid._MODELS and not plan._STAGE_CACHE
    assert cjk.ScriptDetector.shared() is not detector
    again = plan.build_stage(spec, pos, setup=True)  # and a stage needed again loads again
    assert again is not stage and langid._MODELS
    plan.forget_stages()


def test_a_driver_dropping_its_planning_state_drops_its_stages_too(spec: plan.RunSpec) -> None:
    """A Ray run's driver lets go of what planning loaded once the run is planned (the Ray executor's
    ``observe``); a stage it had set up must go with the models, or a later run in the same process
    finds it "set up" with no model."""
    from datapipe.engine.executors.ray.executor import RayExecutor
    from datapipe.runtime.own_cpu import Sections

    pos = _langid_position(spec)
    plan.build_stage(spec, pos, setup=True)
    assert langid._MODELS
    RayExecutor().observe(Sections())  # (no Ray started: that happens on entering it)
    plan.build_stage(spec, pos, setup=True)
    assert langid._MODELS, "the stage was set up again and loaded its model"
    plan.forget_stages()
