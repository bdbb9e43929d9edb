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

from datapipe.audit.sql import connect as connect_stats
from datapipe.engine.plan import make_spec
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from datapipe.stages import (
    STAGES,
    CombineStep,
    GlobalStage,
    PartitionStep,
    ReduceInputs,
    StageOptions,
    drop_rows,
)
from datapipe.stages.global_stage import DUP_OF_KEY
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

    @classmethod
    def audit_views(cls, columns: set[str]) -> dict[str, str]:
        if "toy_group" not in columns:  # every document dropped before the stage: no signal to show
            return {}
        return {
            "toy_groups": "SELECT toy_group, count(*) FILTER (WHERE status = 'kept') AS kept, count(*) AS reached "
            "FROM documents WHERE toy_group IS NOT NULL GROUP BY ALL ORDER BY toy_group"
        }

    def steps(self) -> tuple[PartitionStep | CombineStep, ...]:
        # Without a combine step the partitions decide; with one, the combine step reads their outputs.
        part = PartitionStep(self.options.partitions, self._shuffle, self._reduce_partition, decides=not self.options.combine)
        return (part, CombineStep(self._combine)) if self.options.combine else (part,)

    def _shuffle(self, batch: pa.Table, first_row_key: int) -> pa.Table:
        groups = batch["toy_group"].to_pylist()
        part = [zlib.crc32(g.encode()) % self.options.partitions for g in groups]
        keys = first_row_key + np.arange(batch.num_rows, dtype=np.int64)
        return pa.table(
            {
                "part": pa.array(part, pa.int32()),
                "id": batch["id"],
                "group": batch["toy_group"],
                "n_chars": batch["n_chars"],
                "doc": pa.array(keys),
            }
        )

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
    detail = [
        f"{n} chars; the longest of {g} is {w}"
        for n, g, w in zip(*(losers[c].to_pylist() for c in ("n_chars", "group", "winner")))
    ]
    return drop_rows(losers["doc"].to_numpy(), losers["id"], "not_longest", detail)


@pytest.fixture
def toy_stage() -> Iterator[type[LongestPerGroup]]:
    with STAGES.override(LongestPerGroup):
        yield LongestPerGroup


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
def test_a_global_stage_from_a_test_module_runs_through_the_engine(toy_stage, tmp_path: Path, combine: bool) -> None:
    _run_and_check(tmp_path, combine, in_process=True)


def test_the_toy_global_stage_runs_on_ray_too(toy_stage, ray_local, tmp_path: Path) -> None:
    """Workers know the stage without its registration: the run spec carries its class (by reference
    to this module, which Ray workers import from the driver's working directory)."""
    _run_and_check(tmp_path, combine=True, in_process=False)


def _run_and_check(tmp_path: Path, combine: bool, in_process: bool) -> None:
    sizes = _inputs(tmp_path)
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "toy",
            "sources": [{"name": s, "kind": "web", "paths": [f"{s[4:]}.jsonl"]} for s in sizes],
            "stages": [{"langid": {}}, {"length": {"min_chars": 60}}, {"toy_longest": {"partitions": 3, "combine": combine}}],
            "split": {"partition_rows": 1},  # a task per part: three partition tasks
        },
    )
    out = tmp_path / "out"
    setups = len(SETUPS)
    result = run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None, in_process=in_process)

    if in_process:
        assert len(SETUPS) == setups + 1  # once in this process (the worker), for two shards
    phases = [p["phase"] for p in result.phases]
    assert phases == ["map0", "shuffle0", *(["reduce0"] if combine else []), "map1"]
    assert sorted(p.stem for p in (out / "_work" / "markers" / "shuffle0").glob("*.json")) == ["00000", "00001", "00002"]
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    counts = run["counts"]
    assert counts["documents"] == sum(sizes.values()) == counts["kept"] + counts["rejected"]

    with connect_stats(out) as con:
        rows = con.execute("select id, source, lang, n_chars, status, stage, reason, detail, toy_group from documents").fetchall()
        view = con.execute("select * from toy_groups").fetchall()  # the stage's own view, no engine edit
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
    assert view == sorted((g, 1, len(docs)) for g, docs in groups.items())
    funnel = {s["stage"]: s for s in counts["stages"]}
    assert funnel["toy_longest"]["in"] == len(reached)
    assert funnel["toy_longest"]["rejected"] == {"not_longest": len(reached) - len(groups)}


def test_workers_receive_validated_options(toy_stage, tmp_path: Path) -> None:
    """The run spec carries the options objects validated on the driver; they pickle (to Ray workers)
    as they are, so a worker validates nothing again."""
    _inputs(tmp_path)
    pipeline = load_pipeline(
        write_pipeline(
            tmp_path,
            {
                "name": "toy",
                "sources": [{"name": "web_zh", "kind": "web", "paths": ["zh.jsonl"]}],
                "stages": [{"length": {"min_chars": 60}}, {"toy_longest": {"partitions": 2}}],
            },
        )
    )
    spec = make_spec(pipeline, tmp_path / "out", tmp_path / "cache")
    assert [o for _, o in spec.stage_options] == [o for _, o in pipeline.stage_options]
    assert spec.stage_types[1] is LongestPerGroup
    again = pickle.loads(pickle.dumps(spec))
    assert isinstance(again.stage_options[1][1], ToyOptions) and again.stage_options[1][1].partitions == 2
    assert again.stage_types[1] is LongestPerGroup  # by reference: a worker imports this module for it
    assert again.stages == (
        ("length", pipeline.stage_options[0][1].model_dump(mode="json")),
        ("toy_longest", {"partitions": 2, "combine": False}),
    )


def test_the_engine_refuses_steps_it_could_not_run() -> None:
    """A global stage declares a PartitionStep, a CombineStep or both, in that order; partition outputs
    are decisions only where the step says ``decides``, else a combine step must read them."""
    from datapipe.stages import StageContext
    from datapipe.stages.global_stage import checked_steps

    context = StageContext("", "")
    assert len(checked_steps(LongestPerGroup(ToyOptions(combine=True), context))) == 2

    class NoSteps(GlobalStage):
        name = "no_steps"

    class UnreadPartitions(LongestPerGroup):
        def steps(self) -> tuple[PartitionStep | CombineStep, ...]:
            return (PartitionStep(2, self._shuffle, self._reduce_partition),)

    class CombineFirst(LongestPerGroup):
        def steps(self) -> tuple[PartitionStep | CombineStep, ...]:
            return (CombineStep(self._combine), PartitionStep(2, self._shuffle, self._reduce_partition))

    for cls, message in (
        (NoSteps, r"declares steps \[\]"),
        (UnreadPartitions, "does not decide"),
        (CombineFirst, "in that order"),
    ):
        with pytest.raises(TypeError, match=message):
            checked_steps(cls(ToyOptions(), context))


def test_drop_rows_and_state_rows_name_the_shard_of_a_row_key() -> None:
    """The contract's helpers turn the engine's row keys into the shard each map task filters on."""
    from datapipe.stages import state_rows
    from datapipe.stages.row_keys import row_keys

    keys = np.concatenate([row_keys(3, 7, 2), row_keys(0, 0, 1)])
    survivors = row_keys(1, 0, 3)  # a copy names its survivor by id and row key (the copies index, for explain)
    dropped = drop_rows(keys, ["a", "b", "c"], "why", dup_of=pa.array(["x", "y", "z"]), dup_of_keys=survivors)
    assert dropped.column_names == ["id", "shard", "reason", "detail", "dup_of", DUP_OF_KEY]
    assert dropped[DUP_OF_KEY].to_pylist() == survivors.tolist()
    with pytest.raises(TypeError, match="go together"):
        drop_rows(keys, ["a", "b", "c"], "why", dup_of=pa.array(["x", "y", "z"]))
    assert dropped["shard"].type == pa.int32() and dropped["shard"].to_pylist() == [3, 3, 0]
    assert dropped["detail"].null_count == 3 and dropped["reason"].to_pylist() == ["why"] * 3
    state = state_rows(keys, n=pa.array([1, 2, 3]))
    assert state["shard"].to_pylist() == [3, 3, 0] and state["row_key"].to_pylist() == keys.tolist()
    assert drop_rows(np.empty(0, np.int64), [], "none").num_rows == 0


def test_a_stage_view_may_not_take_a_name_already_in_the_audit_database() -> None:
    from datapipe.audit.views import stage_views

    class Shadowing(LongestPerGroup):
        name = "shadowing"

        @classmethod
        def audit_views(cls, columns: set[str]) -> dict[str, str]:
            return {"funnel": "SELECT 1"}

    class SameView(LongestPerGroup):
        name = "same_view"

    con = duckdb.connect()
    con.execute("CREATE TABLE documents AS SELECT 'a' AS id, 'kept' AS status, 'x/zh' AS toy_group")
    con.execute("CREATE VIEW funnel AS SELECT 1 AS position")
    assert list(stage_views(con, {"id", "toy_group"}, [LongestPerGroup, LongestPerGroup])) == ["toy_groups"]
    with pytest.raises(ValueError, match="'shadowing' declares the audit view 'funnel'"):
        stage_views(con, set(), [Shadowing])
    with pytest.raises(ValueError, match="a name stage 'toy_longest' already has"):
        stage_views(con, {"toy_group"}, [LongestPerGroup, SameView])
