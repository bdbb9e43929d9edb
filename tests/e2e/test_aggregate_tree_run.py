"""The aggregate merge tree in a whole run (in this process), with a fan-in of 2 so that a small real run
has a tree of several levels: the driver reads at most 2 aggregate files, the ``agg_`` tables equal a
direct merge of every map task's file and a scan of ``documents``, and a tree task whose file was lost
is redone on resume with the same tables."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow.fs as pafs
import pytest

from datapipe.audit import aggregates
from datapipe.engine import aggregate_tree, finish
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from tests.conftest import PROJECT_ROOT, write_pipeline
from tests.support.shared_data import shared_path

FAN_IN = 2


def _lines(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line for _, line in zip(range(n), f)]


def _tables(db: Path) -> dict[str, list[tuple]]:
    with duckdb.connect(str(db), read_only=True) as con:
        found = con.execute("select table_name from duckdb_tables() where starts_with(table_name, 'agg_')").fetchall()
        names = [r[0] for r in found]
        return {n: sorted(con.execute(f'select * from "{n}"').fetchall(), key=repr) for n in sorted(names)}


@pytest.fixture(scope="module")
def tree_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[list[str]]]:
    """zh and en Wikipedia articles (some repeated: boilerplate lines) split into ~4 map tasks per source,
    through a global stage (two segments): ~16 aggregate files, three levels of 2."""
    base = tmp_path_factory.mktemp("aggtree")
    (base / "data").mkdir()
    zh = _lines(shared_path("corpus", "zh_wikipedia.jsonl"), 60)
    en = _lines(shared_path("corpus", "en_wikipedia.jsonl"), 60)
    (base / "data" / "zh.jsonl").write_text("".join(zh + zh[:10]), encoding="utf-8")
    (base / "data" / "en.jsonl").write_text("".join(en + en[:10]), encoding="utf-8")
    target = max(4096, min((base / "data" / f).stat().st_size for f in ("zh.jsonl", "en.jsonl")) // 4)
    pipeline = write_pipeline(
        base,
        {
            "name": "aggregate_tree",
            "sources": [
                {"name": "wiki_zh", "kind": "web", "paths": ["data/zh.jsonl"]},
                {"name": "wiki_en", "kind": "web", "paths": ["data/en.jsonl"]},
            ],
            "split": {"target_bytes": target, "min_bytes": 4096, "min_tasks_per_cpu": 0},
            "stages": [
                {"langid": {"keep": ["zh", "en"]}},
                {"boilerplate": {"min_docs": 3}},
                {"length": {"min_chars": 300}},
            ],
            "tokenize": {"tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"), "seq_len": 256},
        },
    )
    read: list[list[str]] = []  # the files each end of the run merged into the database
    real = finish.aggregate_tree.final_inputs

    def spied(folder, spec):  # type: ignore[no-untyped-def]
        got = real(folder, spec)
        read.append(list(got or []))
        return got

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(aggregate_tree, "FAN_IN", FAN_IN)
        mp.setattr(finish.aggregate_tree, "final_inputs", spied)
        run_pipeline(load_pipeline(pipeline), output=base / "out", show_progress=False, log=lambda m: None, in_process=True)
    return base / "out", pipeline, read


def _map_files(run: Path) -> list[str]:
    return sorted(str(p) for p in (run / "aggregates").rglob("*.parquet"))


def test_the_driver_reads_at_most_fan_in_files_and_the_tables_equal_a_direct_merge(tree_run) -> None:
    run, _, read = tree_run
    files = _map_files(run)
    markers = run / "_work" / "markers"
    slots = sum(len(list(d.rglob("*.json"))) for d in markers.glob("map*"))  # (segment, shard) pairs
    depth = aggregate_tree.levels(slots, FAN_IN)
    assert depth >= 3, f"{slots} map tasks: too few for three levels"
    for level in range(1, depth + 1):  # a phase per level, a task per group of FAN_IN below
        assert len(list((markers / f"aggregates{level}").glob("*.json"))) == len(aggregate_tree.spans(slots, level, FAN_IN))
    assert not (markers / f"aggregates{depth + 1}").exists()
    assert len(read) == 1 and 0 < len(read[0]) <= FAN_IN
    assert all(p.startswith(f"_work/aggregates/l{depth}/") for p in read[0])
    # the same tables as the driver merging every map task's file at once
    run_json = json.loads((run / "run.json").read_text())
    types = aggregates.stage_types(run_json)
    with duckdb.connect(str(run / "stats.duckdb"), read_only=True) as con:
        columns = {r[0] for r in con.execute("select name from document_columns").fetchall()}
    declared = aggregates.run_aggregates(types, columns)
    with duckdb.connect() as con:
        relation = aggregates.read_once(con, files, pafs.LocalFileSystem(), aggregates.file_schema(declared))
        aggregates.create_tables(con, relation, declared, temp=True)
        direct = {a.table: sorted(con.execute(f"select * from {a.table}").fetchall(), key=repr) for a in declared}
    tree = _tables(run / "stats.duckdb")
    assert tree == direct
    assert tree["agg_boilerplate_lines"] and tree["agg_lang_scores"]
    # and as a scan of every document gives them
    with datapipe_connect(run) as con:
        aggregates.scan_tables(con, types, temp=True)
        scanned = {a.table: sorted(con.execute(f"select * from temp.{a.table}").fetchall(), key=repr) for a in declared}
    assert scanned == tree


def datapipe_connect(run: Path):  # type: ignore[no-untyped-def]
    from datapipe.audit.sql import connect

    return connect(run)


def test_a_lost_merge_file_is_redone_on_resume_with_the_same_tables(tree_run) -> None:
    run, pipeline, _ = tree_run
    before = _tables(run / "stats.duckdb")
    lost = sorted((run / "_work" / "aggregates" / "l1").glob("*.parquet"))[1]
    lost.unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(aggregate_tree, "FAN_IN", FAN_IN)
        result = run_pipeline(load_pipeline(pipeline), output=run, show_progress=False, log=lambda m: None, in_process=True)
    assert lost.is_file()
    redone = {p["phase"]: p["ran"] for p in result.phases}
    assert redone.get("aggregates1") == 1 and not any(n for phase, n in redone.items() if phase.startswith("map"))
    assert _tables(run / "stats.duckdb") == before


def test_the_stored_documents_view_names_folders_not_files(tree_run) -> None:
    """~8 files per status: the view plain DuckDB reads names each source's folder once (its text
    O(sources x stages), not O(files)), and reads every row the index lists."""
    run, _, _ = tree_run
    with duckdb.connect(str(run / "stats.duckdb"), read_only=True) as con:
        sql = con.execute("select sql from duckdb_views() where view_name = 'documents' and not internal").fetchone()[0]
        paths = [r[0] for r in con.execute("select path from document_files").fetchall()]
        assert len(paths) > 10 and not [p for p in paths if p in sql]
        assert "docs/wiki_zh/*.parquet" in sql and "docs/wiki_en/*.parquet" in sql
        con.execute(f"SET VARIABLE datapipe_run = '{run}'")
        by_status = dict(con.execute("select status, count(*) from documents group by all").fetchall())
        listed = dict(con.execute("select status, sum(rows)::BIGINT from document_files group by all").fetchall())
        assert by_status == listed
