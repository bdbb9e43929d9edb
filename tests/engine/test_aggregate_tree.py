"""The aggregate merge tree's shape (engine/aggregate_tree.py): at crawl proportions the driver merges at
most FAN_IN files, every map task's file is read by exactly one task of the first level and every
task's output by exactly one of the next, and no task reads more than FAN_IN files."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from datapipe.audit import aggregates
from datapipe.engine import aggregate_tree
from datapipe.engine.aggregate_tree import FAN_IN, levels, spans


@pytest.mark.parametrize("files", [1, FAN_IN, FAN_IN + 1, FAN_IN**2 + 1, 10_000, 37_253, 40_000, 149_012])
def test_the_driver_merges_at_most_fan_in_files_at_any_size(files: int) -> None:
    depth = levels(files)
    last = spans(files, depth)  # the files the driver reads: the last level's, or the map tasks' own
    assert len(last) <= FAN_IN
    assert depth == 0 or len(spans(files, depth - 1)) > FAN_IN  # no level more than needed
    for level in range(1, depth + 1):
        tasks = spans(files, level)
        below = spans(files, level - 1)
        # each task reads at most FAN_IN files of the level below, and together they read each exactly once
        children = [aggregate_tree._children(t, level) for t in tasks]
        assert max(len(c) for c in children) <= FAN_IN
        assert [c for group in children for c in group] == below
        assert tasks[0].start == 0 and tasks[-1].stop == files
        assert all(a.stop == b.start for a, b in zip(tasks, tasks[1:]))


def test_crawl_proportions() -> None:
    """10 TB: 37,253 map tasks; with three segments (a dedup stage before a second global one) ~112k files."""
    assert levels(37_253) == 2 and len(spans(37_253, 2)) == 10
    assert levels(3 * 37_253) == 2 and len(spans(3 * 37_253, 2)) == 28
    assert levels(150_000) == 2 and len(spans(150_000, 2)) == 37
    assert levels(1_500_000) == 3 and len(spans(1_500_000, 3)) == 6


def test_no_tree_for_a_run_of_few_map_tasks() -> None:
    assert levels(FAN_IN) == 0 and aggregate_tree.levels(3, fan_in=3) == 0 and aggregate_tree.levels(4, fan_in=3) == 1


def _random_file(aggs: list, rng: random.Random, lines: int) -> pa.Table:
    """One map task's aggregate file: rows of every aggregate, keys from a few values (the removed lines
    from ``lines``; the first five in every file, with large counts), values random."""
    rows: list[dict] = []
    for agg in aggs:
        keys = [c for c, _ in agg.columns if c not in agg.merge]
        n = 30 if agg.limit is not None else 6
        for i in range(n):
            row = {aggregates.AGGREGATE_COLUMN: agg.name}
            for name, ctype in agg.columns:
                if name not in keys:
                    row[name] = rng.randint(100, 200) if agg.limit is not None and i < 5 else rng.randint(0, 9)
                elif ctype == "VARCHAR":
                    row[name] = (
                        f"common {i}" if agg.limit is not None and i < 5 else f"{name} {rng.randrange(lines if agg.limit else 3)}"
                    )
                else:
                    row[name] = rng.randrange(3)
            rows.append(row)
    return pa.Table.from_pylist(rows, schema=aggregates.file_schema(aggs))


def _tables(con, aggs: list) -> dict[str, list[tuple]]:
    return {a.table: sorted(con.execute(f"select * from {a.table}").fetchall(), key=repr) for a in aggs}


@pytest.mark.parametrize("limit", [None, 5])
def test_the_tree_gives_the_serial_merge(tmp_path: Path, limit: int | None) -> None:
    """10 map task files merged by a tree of fan-in 3 (two levels, each task through ``merge_files``,
    as the tree's tasks run it) give the tables a merge of all 10 at once gives: sums, a max, every
    key; the removed lines (a list with a limit: the stage's 1,000, all 60 lines kept) too. With a limit
    of 5 (at most 50 rows kept by a partial merge, of 400 lines) the list keeps its most frequent lines
    exactly, and no partial merge holds more than PARTIAL_KEEP x limit."""
    from datapipe.stages import STAGES

    aggs = aggregates.run_aggregates([STAGES["boilerplate"], STAGES["minhash"]], {"removed_lines", "dup_count"})
    if limit is not None:
        aggs = [replace(a, limit=limit) if a.limit is not None else a for a in aggs]
    assert any(a.limit is not None for a in aggs) and any("max" in a.merge.values() for a in aggs)
    rng = random.Random(7)
    fs = pafs.LocalFileSystem()
    files = 10
    level_files = []
    for i in range(files):
        path = tmp_path / f"l0-{i:03d}.parquet"
        pq.write_table(_random_file(aggs, rng, lines=60 if limit is None else 400), path)
        level_files.append(str(path))
    depth = levels(files, fan_in=3)
    assert depth == 2
    for level in range(1, depth + 1):
        tasks = spans(files, level, fan_in=3)
        below = level_files
        level_files = []
        for t, task in enumerate(tasks):
            width = 3 ** (level - 1)
            inputs = [below[(s - task.start) // width + t * 3] for s in range(task.start, task.stop, width)]
            assert 1 <= len(inputs) <= 3
            merged = aggregates.merge_files(inputs, fs, aggs)
            for agg in aggs:
                if agg.limit is not None:
                    held = merged.filter(pa.compute.equal(merged[aggregates.AGGREGATE_COLUMN], agg.name)).num_rows
                    assert held <= agg.limit * aggregates.PARTIAL_KEEP
            path = tmp_path / f"l{level}-{t:03d}.parquet"
            pq.write_table(merged, path)
            level_files.append(str(path))
    assert len(level_files) <= 3
    all_files = [str(tmp_path / f"l0-{i:03d}.parquet") for i in range(files)]
    results = []
    for inputs in (all_files, level_files):
        with duckdb.connect() as con:
            relation = aggregates.read_once(con, inputs, fs, aggregates.file_schema(aggs))
            aggregates.create_tables(con, relation, aggs, temp=True)
            results.append(_tables(con, aggs))
    serial, tree = results
    assert serial["agg_documents"] and serial["agg_rehydration"] and serial["agg_boilerplate_lines"]
    if limit is None:
        assert tree == serial
    else:
        assert {k: v for k, v in tree.items() if k != "agg_boilerplate_lines"} == {
            k: v for k, v in serial.items() if k != "agg_boilerplate_lines"
        }
        assert tree["agg_boilerplate_lines"] == serial["agg_boilerplate_lines"]
        assert sorted(r[0] for r in serial["agg_boilerplate_lines"]) == [f"common {i}" for i in range(5)]
