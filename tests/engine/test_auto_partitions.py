"""``partitions: auto`` (the default of every partitioned global stage): resolved when the run is
planned to one partition per map task, so partitions grow with the corpus exactly as map tasks do
and a small run has few; an explicit number is kept; stages only ever see a number."""

from __future__ import annotations

from pathlib import Path

import pytest

from datapipe.engine.plan import build_stage, make_spec
from datapipe.pipeline.load import load_pipeline
from datapipe.stages.global_stage import PartitionStep, step_of
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path


def _pipeline(tmp_path: Path, stages: list[dict], files: int) -> Path:
    lines = shared_path("corpus", "en_wikipedia.jsonl").read_text(encoding="utf-8").splitlines()
    data = tmp_path / "data"
    data.mkdir()
    for i in range(files):  # separate files, each larger than the group limit: one map task each
        (data / f"part-{i}.jsonl").write_text("\n".join(lines[i * 40 : (i + 1) * 40]) + "\n", encoding="utf-8")
    return write_pipeline(
        tmp_path,
        {
            "name": "auto",
            "sources": [{"name": "en", "kind": "text", "paths": ["data/*.jsonl"]}],
            "stages": stages,
            "split": {"group_small_files": False},
        },
    )


@pytest.mark.parametrize("files", [1, 5])
def test_auto_partitions_are_one_per_map_task(tmp_path: Path, files: int) -> None:
    pipe = load_pipeline(_pipeline(tmp_path, [{"dedup": {"exact": True}}, {"minhash": {"threshold": 0.7}}], files))
    spec = make_spec(pipe, tmp_path / "run", tmp_path / "cache")
    assert len(spec.shards) == files
    for pos in (1, 2):
        step = step_of(build_stage(spec, pos), PartitionStep)
        assert step is not None and step.partitions == files
    assert all(dict(opts)["partitions"] == "auto" for _, opts in pipe.stage_options)  # the config is unchanged


def test_an_explicit_partition_count_is_kept(tmp_path: Path) -> None:
    pipe = load_pipeline(_pipeline(tmp_path, [{"dedup": {"exact": True, "partitions": 7}}], 2))
    spec = make_spec(pipe, tmp_path / "run", tmp_path / "cache")
    step = step_of(build_stage(spec, 1), PartitionStep)
    assert step is not None and step.partitions == 7
