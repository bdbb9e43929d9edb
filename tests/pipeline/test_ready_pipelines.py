"""Every ready pipeline in pipelines/ gets as far as a run does before its first task: the file
loads, its inputs (files and folders in ../shared/data) are listed and its map tasks planned.
(`datapipe validate` checks the file only; a folder input once failed at the listing.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from datapipe.engine.plan import make_spec, split_target
from datapipe.engine.run_record import input_listing
from datapipe.pipeline.load import ConfigError, load_pipeline
from tests.support.shared_data import PROJECT_ROOT, shared_path

READY = sorted((PROJECT_ROOT / "pipelines").glob("*.yaml"))
# Pipelines that need a file the user makes first (their header says how): the error must name it.
NEEDS_FIRST = {
    "classify.yaml": "stages[2].classify.models.quality.path",
    "classify_ensemble.yaml": "stages[1].classify.models.qa.path",
}


@pytest.mark.parametrize("path", READY, ids=[p.name for p in READY])
def test_ready_pipeline_lists_and_plans_its_inputs(path: Path, tmp_path: Path) -> None:
    shared_path("corpus")  # they read ../shared/data
    try:
        pipeline = load_pipeline(path)
    except ConfigError as e:
        assert path.name in NEEDS_FIRST and NEEDS_FIRST[path.name] in str(e), str(e)
        return
    listing = input_listing(pipeline)
    assert listing and all(i["bytes"] > 0 for i in listing), listing
    spec = make_spec(pipeline, tmp_path / "run", tmp_path / "cache", split_target(pipeline, 2))
    assert spec.shards
    planned = {r.path for shard in spec.shards for r in shard.inputs}
    assert {str(Path(p).resolve()) for p in planned} == {i["path"] for i in listing}
