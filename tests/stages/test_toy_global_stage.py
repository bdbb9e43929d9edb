"""A global stage defined only here, registered from here, run through the engine unchanged.

``toy_longest`` keeps the longest document of each (source, language) and drops the others, decided
in partitions by a hash of the group key: the engine knows it only by the steps it declares
(``GlobalStage.steps()``). With ``combine: true`` the partitions only name each group's winner and
a combine step decides, so both kinds of step run. Nothing in datapipe/engine names this stage.
"""

from __future__ import annotations

import json
import pickle
import zlib
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from datapipe.engine.plan import make_spec
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from datapipe.stages import (
    CombineStep,
    GlobalStage,
    PartitionStep,
    ReduceInputs,
    StageOptions,
    register_stage,
    unregister_stage,
)
from datapipe.stages.base import ROW_KEY_SHIFT
from tests.conftest import write_pipeline

ROOT = Path(__file__).resolve().parents[2]
LINES_PER_FILE = 12


class ToyOptions(StageOptions):
    partitions: int = 3
    combine: bool = False  # True: partitions name the winners, a combine step decides


SETUPS: list[str] = []  # one entry per setup() call in this process


class LongestPerGroup(GlobalStage):
    name = "toy_longest"
    Options = ToyOptions
    signal_columns = ("toy_group",)

    def setup(self) -> None:
        SETUPS.append(self.name)
        self.ready = True

    def compute(self, batch: pa.Table) -> pa.Table:
        assert getattr(self, "ready", False), "the engine computes with a stage it did not set up"
        lang = pc.fill_null(batch["lang"], "?")
        return batch.append_column("toy_group", pc.binary_join_element_wise(batch["source"], lang, "/"))

    def steps(self) -> tuple[PartitionStep | CombineStep, ...]:
        part = PartitionStep(self.options.partitions, self._shuffle, self._reduce_partition)
        return (part, CombineStep(self._combine)) if self.options.combine else (part,)

    def _shuffle(self, batch: pa.Table, first_row_key: int) -> pa.Table:
        groups = batch["toy_group"].to_pylist()
        part = [zlib.crc32(g.encode()) % self.options.partitions for g in groups]
        keys = first_row_key + np.arange(batch.num_rows, dtype=np.int64)
        return pa.table({"part": pa.array(part, pa.int32()), "id": batch["id"], "group": batch["toy_group"],
                         "n_chars": batch["n_chars"], "shard": pa.array(keys >> ROW_KEY_SHIFT, pa.int32())})

    def _reduce_partition(self, rows: pa.Table, round: int, inputs: ReduceInputs | None) -> pa.Table:
        """Every row of the partition with its group's winner (longest, then smallest id); without a
        combine step, the losers as decisions."""
        winner: dict[str, tuple[int, str]] = {}
        for group, n, doc in zip(*(rows[c].to_pylist() for c in ("group", "n_chars", "id"))):
            best = winner.get(group)
            if best is None or (-n, doc) < (-best[0], best[1]):
                winner[group] = (n, doc)
        rows = rows.append_column("winner", pa.array([winner[g][1] for g in rows["group"].to_pylist()]))
        return rows if self.options.combine else _losers(rows)

    def _combine(self, partition_outputs: list[str], inputs: ReduceInputs) -> pa.Table:
        return _losers(pa.concat_tables(pq.read_table(p) for p in partition_outputs))


def _losers(rows: pa.Table) -> pa.Table:
    lose = pc.not_equal(rows["id"], rows["winner"])
    losers = rows.filter(lose)
    detail = [f"{n} chars; the longest of {g} is {w}" for n, g, w in
              zip(*(losers[c].to_pylist() for c in ("n_chars", "group", "winner")))]
    return pa.table({"id": losers["id"], "shard": losers["shard"],
                     "reason": pa.array(["not_longest"] * losers.num_rows, pa.string()),
                     "detail": pa.array(detail, pa.string())})


@pytest.fixture
def toy_stage() -> Iterator[type[LongestPerGroup]]:
    register_stage(LongestPerGroup)
    try:
        yield LongestPerGroup
    finally:
        unregister_stage(LongestPerGroup.name)


def _inputs(tmp_path: Path) -> dict[str, int]:
    """The first lines of the demo's web files, as two sources (zh pages, en pages); lines per source."""
    sizes = {}
    for lang in ("zh", "en"):
        files = sorted((ROOT / "pipelines" / "demo" / "data").glob(f"web_{lang}-*.jsonl"))
        lines = [line for f in files for line in f.read_text(encoding="utf-8").splitlines()[:LINES_PER_FILE]]
        (tmp_path / f"{lang}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        sizes[f"web_{lang}"] = len(lines)
    return sizes


@pytest.mark.parametrize("combine", [False, True])
def test_a_global_stage_from_a_test_module_runs_through_the_engine(toy_stage, tmp_path: Path,
                                                                   combine: bool) -> None:
    _run_and_check(tmp_path, combine, in_process=True)


def test_the_toy_global_stage_runs_on_ray_too(toy_stage, ray_local, tmp_path: Path) -> None:
    """Workers know the stage without its registration: the run spec carries its class (by reference
    to this module, which Ray workers import from the driver's working directory)."""
    _run_and_check(tmp_path, combine=True, in_process=False)


def _run_and_check(tmp_path: Path, combine: bool, in_process: bool) -> None:
    sizes = _inputs(tmp_path)
    pipeline = write_pipeline(tmp_path, {
        "name": "toy", "sources": [{"name": s, "kind": "web", "paths": [f"{s[4:]}.jsonl"]} for s in sizes],
        "stages": [{"langid": {}}, {"length": {"min_chars": 60}},
                   {"toy_longest": {"partitions": 3, "combine": combine}}]})
    out = tmp_path / "out"
    setups = len(SETUPS)
    result = run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None,
                          in_process=in_process)

    if in_process:
        assert len(SETUPS) == setups + 1  # once in this process (the worker), for two shards
    phases = [p["phase"] for p in result.phases]
    assert phases == ["map0", "shuffle0", *(["reduce0"] if combine else []), "map1"]
    assert sorted(p.stem for p in (out / "_work" / "markers" / "shuffle0").glob("*.json")) == ["00000", "00001",
                                                                                               "00002"]
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    counts = run["counts"]
    assert counts["documents"] == sum(sizes.values()) == counts["kept"] + counts["rejected"]

    with duckdb.connect(str(out / "stats.duckdb"), read_only=True) as con:
        rows = con.execute("select id, source, lang, n_chars, status, stage, reason, detail, toy_group "
                           "from documents").fetchall()
    assert len(rows) == sum(sizes.values()) and len({r[0] for r in rows}) == len(rows)  # each document once
    reached = [r for r in rows if r[4] == "kept" or r[5] == "toy_longest"]
    groups: dict[str, list[tuple]] = {}
    for r in reached:
        assert r[8] == f"{r[1]}/{r[2]}"  # the signal column the stage computed is in the audit table
        groups.setdefault(r[8], []).append(r)
    assert {"web_zh/zh", "web_en/en"} <= set(groups) and len(reached) > 2 * len(groups)
    for group, docs in groups.items():
        longest = min(docs, key=lambda r: (-r[3], r[0]))
        kept = [r for r in docs if r[4] == "kept"]
        assert kept == [longest], group  # exactly the longest document of the group survives
        for r in docs:
            if r is not longest:
                assert (r[5], r[6]) == ("toy_longest", "not_longest")
                assert r[7] == f"{r[3]} chars; the longest of {group} is {longest[0]}"
    funnel = {s["stage"]: s for s in counts["stages"]}
    assert funnel["toy_longest"]["in"] == len(reached)
    assert funnel["toy_longest"]["rejected"] == {"not_longest": len(reached) - len(groups)}


def test_workers_receive_validated_options(toy_stage, tmp_path: Path) -> None:
    """The run spec carries the options objects validated on the driver; they pickle (to Ray workers)
    as they are, so a worker validates nothing again."""
    _inputs(tmp_path)
    pipeline = load_pipeline(write_pipeline(tmp_path, {
        "name": "toy", "sources": [{"name": "web_zh", "kind": "web", "paths": ["zh.jsonl"]}],
        "stages": [{"length": {"min_chars": 60}}, {"toy_longest": {"partitions": 2}}]}))
    spec = make_spec(pipeline, tmp_path / "out", tmp_path / "cache")
    assert [o for _, o in spec.stage_options] == [o for _, o in pipeline.stage_options]
    assert spec.stage_types[1] is LongestPerGroup
    again = pickle.loads(pickle.dumps(spec))
    assert isinstance(again.stage_options[1][1], ToyOptions) and again.stage_options[1][1].partitions == 2
    assert again.stage_types[1] is LongestPerGroup  # by reference: a worker imports this module for it
    assert again.stages == (("length", pipeline.stage_options[0][1].model_dump(mode="json")),
                            ("toy_longest", {"partitions": 2, "combine": False}))
