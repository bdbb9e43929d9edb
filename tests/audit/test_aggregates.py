"""The aggregates the map tasks write: equal to a scan of ``documents`` on a real run; what ``report`` and
``stats`` read (never a document: they give the same output with every document file destroyed); the
fallback for a database written before aggregates; ``stats.duckdb`` as plain DuckDB opens it; and
``datapipe.audit.connect``, the public API for notebooks."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import datapipe.audit
from datapipe.audit import aggregates
from datapipe.audit.report import build_report
from datapipe.audit.sql import AuditError, read_run_json, reading
from datapipe.cli import main
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from datapipe.run_folder.checked import DamagedRunFile
from datapipe.stages.report_section import Aggregate
from tests.conftest import PROJECT_ROOT, write_pipeline
from tests.support.shared_data import shared_path


def _lines(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line for _, line in zip(range(n), f)]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real zh and en Wikipedia articles (some twice: minhash clusters) through langid, boilerplate,
    minhash and length, tokenized: every core aggregate and three stages' own have rows."""
    base = tmp_path_factory.mktemp("aggrun")
    (base / "data").mkdir()
    zh = _lines(shared_path("corpus", "zh_wikipedia.jsonl"), 120)
    en = _lines(shared_path("corpus", "en_wikipedia.jsonl"), 120)
    (base / "data" / "zh.jsonl").write_text("".join(zh + zh[:15]), encoding="utf-8")
    (base / "data" / "en.jsonl").write_text("".join(en + en[:10]), encoding="utf-8")
    pipeline = write_pipeline(
        base,
        {
            "name": "aggregates",
            "sources": [
                {"name": "wiki_zh", "kind": "web", "paths": ["data/zh.jsonl"]},
                {"name": "wiki_en", "kind": "web", "paths": ["data/en.jsonl"]},
            ],
            "stages": [
                {"langid": {"keep": ["zh", "en"]}},
                {"boilerplate": {"min_docs": 3}},
                {"minhash": {}},
                {"length": {"min_chars": 300}},
            ],
            "tokenize": {"tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"), "seq_len": 256, "val_fraction": 0.1},
        },
    )
    run_pipeline(load_pipeline(pipeline), output=base / "out", show_progress=False, log=lambda m: None, in_process=True)
    return base / "out"


def _sorted(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: json.dumps(r, sort_keys=True, default=str))


def test_every_aggregate_equals_its_query_over_all_documents(real_run: Path) -> None:
    run = read_run_json(real_run)
    with reading(real_run) as con:
        columns = {r[0] for r in con.execute("DESCRIBE documents").fetchall()}
        declared = aggregates.run_aggregates(aggregates.stage_types(run), columns)
        assert {"documents", "lengths", "boilerplate", "boilerplate_lines", "rehydration"} <= {a.name for a in declared}
        scanned = aggregates.scan_rows(con, declared)
        con.register("scanned", scanned)
        for agg in declared:
            merged = con.sql(f"SELECT * FROM {agg.table}").to_arrow_table()
            from_scan = con.sql(aggregates.merge_sql(agg, "scanned")).to_arrow_table()
            assert _sorted(merged) == _sorted(from_scan), agg.name
        # and the figures hold what the documents say
        kept, tokens = con.execute("SELECT count(*), sum(n_tokens) FROM documents WHERE status = 'kept'").fetchone()
        assert con.execute("SELECT sum(documents), sum(tokens) FROM agg_documents WHERE status = 'kept'").fetchone() == (
            kept,
            tokens,
        )
        assert con.execute("SELECT count(*) FROM agg_rehydration WHERE clusters > 0").fetchone()[0] > 0
        files = con.execute("SELECT count(*) FROM aggregate_files").fetchone()[0]
    assert files == len(list((real_run / "aggregates").rglob("*.parquet"))) > 0


def _task_files(run: Path) -> list[tuple[Path, list[tuple[Path, str]]]]:
    """Each map task's aggregate file and the (path, status) of the documents it wrote, from its marker."""
    out = []
    for marker in sorted((run / "_work" / "markers").glob("map*/**/*.json")):
        m = json.loads(marker.read_text())
        if m["audit_files"]:
            out.append((run / m["aggregates"]["path"], [(run / f["path"], f["status"]) for f in m["audit_files"]]))
    return out


class _Broken:
    """A stage type whose aggregate's SQL fails (a column no document has)."""

    name = "broken"

    @classmethod
    def aggregates(cls, columns: set[str]) -> list[Aggregate]:
        return [Aggregate("broken", "SELECT no_such_signal AS x FROM documents GROUP BY ALL", (("x", "VARCHAR"),))]


def _in_child(files: list[tuple[Path, str]], types: list, conn: Any) -> None:
    conn.send(aggregates.task_aggregates(files, types).to_pylist())


def test_a_task_s_aggregates_are_the_same_file_every_time_and_leave_nothing_behind(real_run: Path) -> None:
    """The worker's DuckDB connection serves task after task: the same documents give the same rows in the
    same order (the file a task wrote, again), no table stays in it, a failed task does not break the next,
    and a forked worker opens its own."""
    types = aggregates.stage_types(read_run_json(real_run))
    tasks = _task_files(real_run)
    assert len(tasks) >= 2
    for written, files in tasks:
        first = aggregates.task_aggregates(files, types)
        assert first is not None and first.equals(aggregates.task_aggregates(files, types))
        assert first.equals(pq.read_table(written))
    con = aggregates._task_connection()
    assert con.execute("SELECT count(*) FROM duckdb_tables()").fetchone() == (0,)
    with pytest.raises(duckdb.BinderException, match="no_such_signal"):
        aggregates.task_aggregates(tasks[0][1], [*types, _Broken])
    assert aggregates.task_aggregates(tasks[0][1], types).equals(pq.read_table(tasks[0][0]))
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_in_child, args=(tasks[1][1], types, child))
    proc.start()
    got = parent.recv()
    proc.join(60)
    assert proc.exitcode == 0 and got == pq.read_table(tasks[1][0]).to_pylist()


def _destroy_documents(run: Path) -> int:
    """Overwrite every kept and rejected Parquet file with bytes no reader accepts (as root, a chmod
    would not stop a read). Returns how many."""
    files = [p for d in ("docs", "rejected") for p in (run / d).rglob("*.parquet")]
    for p in files:
        p.write_bytes(b"not parquet\n")
    return len(files)


def test_report_and_stats_read_no_document(real_run: Path, tmp_path: Path) -> None:
    """The same page and the same `stats` output with every document file destroyed: neither reads one."""
    copy = tmp_path / "run"
    shutil.copytree(real_run, copy)
    runner = CliRunner()
    page_before = build_report(copy)
    stats_before = runner.invoke(main, ["stats", str(copy), "--budget", "1M"])
    assert stats_before.exit_code == 0, stats_before.output
    assert _destroy_documents(copy) > 4
    # the documents really are unreadable now (named as damaged against their markers' sha256)
    with pytest.raises((AuditError, DamagedRunFile)):
        with reading(copy) as con:
            con.execute("SELECT count(*), sum(n_chars) FROM documents").fetchall()
    assert build_report(copy) == page_before
    stats_after = runner.invoke(main, ["stats", str(copy), "--budget", "1M"])
    assert stats_after.exit_code == 0 and stats_after.output == stats_before.output
    assert "Boilerplate removed" in page_before and "Rehydration weights" in page_before


# ``mixture`` as a datapipe before aggregates wrote it: over ``documents``.
OLD_MIXTURE = """WITH g AS (
        SELECT coalesce(nullif(source, ''), 'unknown') AS source, coalesce(nullif(lang, ''), 'unknown') AS lang,
               coalesce(nullif(script, ''), 'unknown') AS script, 'unknown' AS license_class, count(*)::BIGINT AS documents,
               coalesce(sum(n_tokens), 0)::BIGINT AS tokens, coalesce(sum(n_chars), 0)::BIGINT AS chars,
               coalesce(sum(n_tokens * coalesce(dup_count, 1)), 0)::BIGINT AS rehydrated_tokens
        FROM documents WHERE status = 'kept' GROUP BY ALL)
    SELECT *, round(tokens / nullif(sum(tokens) OVER (), 0), 6) AS token_share,
           round(documents / sum(documents) OVER (), 6) AS doc_share
    FROM g ORDER BY tokens DESC, documents DESC, source, lang, script, license_class"""


def test_a_database_without_aggregates_is_reported_from_a_scan_and_says_so(real_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(real_run, copy)
    page = build_report(copy)
    with duckdb.connect(str(copy / "stats.duckdb")) as con:  # as a datapipe before aggregates wrote it
        for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE table_name LIKE 'agg\\_%' ESCAPE '\\' OR table_name = 'aggregate_files'"
        ).fetchall():
            con.execute(f"DROP TABLE {name} CASCADE")
        con.execute("UPDATE audit_views SET sql = ? WHERE name = 'mixture'", [OLD_MIXTURE])
    said: list[str] = []
    assert build_report(copy, warn=said.append) == page
    assert said and "reading every document instead" in said[0]
    result = CliRunner().invoke(main, ["report", str(copy), "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 0 and "reading every document instead" in result.output


def test_stats_duckdb_answers_plain_duckdb_from_anywhere_and_after_a_move(real_run: Path, tmp_path: Path) -> None:
    with reading(real_run) as con:
        want = con.execute("SELECT count(*), sum(n_chars) FROM documents").fetchone()
        mixture = con.execute("SELECT * FROM mixture").fetchall()
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(real_run, moved)
    here = os.getcwd()
    try:
        os.chdir(tmp_path)  # neither run folder, nor its parent
        for run in (real_run, moved):
            with duckdb.connect(str(run / "stats.duckdb"), read_only=True) as con:
                assert con.execute("select count(*), sum(n_chars) from documents").fetchone() == want
                assert con.execute("select * from mixture").fetchall() == mixture
                assert con.execute("select count(*) from agg_documents").fetchone()[0] > 0
        shutil.rmtree(moved / "docs")  # a copy without its documents names the missing file
        with duckdb.connect(str(moved / "stats.duckdb"), read_only=True) as con:
            with pytest.raises(duckdb.IOException, match="docs/"):
                con.execute("select count(*) from documents").fetchall()
        # where the database cannot tell its folder, one message names the supported way
        with duckdb.connect(str(real_run / "stats.duckdb"), read_only=True, config={"temp_directory": str(tmp_path)}) as con:
            with pytest.raises(duckdb.InvalidInputException, match=r"datapipe\.audit\.connect\(RUN\)"):
                con.execute("select count(*) from documents").fetchall()
            con.execute(f"SET VARIABLE datapipe_run = '{real_run}'")
            assert con.execute("select count(*), sum(n_chars) from documents").fetchone() == want
    finally:
        os.chdir(here)


def test_the_public_api_gives_arrow_pandas_and_polars(real_run: Path) -> None:
    with datapipe.audit.connect(real_run) as con:
        arrow = con.sql("select status, count(*) as n from documents group by all order by status").to_arrow_table()
        assert isinstance(arrow, pa.Table) and arrow["status"].to_pylist() == ["kept", "rejected"]
        frame = con.sql("select source, sum(tokens) as tokens from mixture group by all order by source").df()
        assert list(frame["source"]) == ["wiki_en", "wiki_zh"] and (frame["tokens"] > 0).all()
        texts = con.execute("select count(*) from kept_docs where length(text) > 0").fetchone()[0]
        assert texts == con.execute("select count(*) from documents where status = 'kept'").fetchone()[0]
        with pytest.raises(duckdb.Error):  # still confined: no file outside the run
            con.execute("select * from read_text('/etc/hostname')").fetchall()
        # nor through the views stored for plain DuckDB (behind datapipe's own temporary ones)
        con.execute(f"SET VARIABLE datapipe_run = '{real_run}'")
        with pytest.raises(duckdb.Error, match="Permission|disabled|external access"):
            con.execute("select count(*) from stats.main.documents").fetchall()
        try:
            import polars  # noqa: F401
        except ImportError:
            return
        assert con.sql("select count(*) as n from documents").pl()["n"][0] > 0
    with pytest.raises(AuditError, match="no run.json|no stats.duckdb"):
        datapipe.audit.connect(real_run.parent / "data")


# The signals each built-in stage's aggregates read, with their types (as the stages write them).
SIGNALS = {
    "langid": {"lang": "VARCHAR", "lang_score": "FLOAT"},
    "boilerplate": {"lines_removed": "BIGINT", "chars_removed": "BIGINT", "removed_lines": "VARCHAR[]"},
    "substrings": {"substr_spans_removed": "BIGINT", "substr_chars_removed": "BIGINT", "substr_removed": "VARCHAR[]"},
    "minhash": {"dup_count": "INTEGER", "dup_of": "VARCHAR"},
    "semantic": {"semantic_similarity": "FLOAT", "dup_of": "VARCHAR"},
    "decontaminate": {"contam_hits": "INTEGER", "contam_benchmark": "VARCHAR", "contam_item": "VARCHAR", "contam_frac": "FLOAT"},
    "classify": {"cls_q_hq": "FLOAT", "bucket_q": "SMALLINT"},
    "annotate": {
        "llm_error": "VARCHAR",
        "llm_model": "VARCHAR",
        "llm_prompt_tokens": "BIGINT",
        "llm_completion_tokens": "BIGINT",
    },
}
BASE = {"id": "VARCHAR", "source": "VARCHAR", "kind": "VARCHAR", "text": "VARCHAR", "n_chars": "BIGINT", "status": "VARCHAR"}
REJECTS = {"stage": "VARCHAR", "reason": "VARCHAR", "detail": "VARCHAR"}


@pytest.mark.parametrize("kind", sorted(SIGNALS))
@pytest.mark.parametrize("with_signals", [True, False])
@pytest.mark.parametrize("with_rejects", [True, False])
def test_a_stage_s_aggregates_run_over_any_task_s_columns(kind: str, with_signals: bool, with_rejects: bool) -> None:
    """A task's files may lack the stage's signals (rejected before it) or any reject column (it rejected
    nothing): every aggregate still runs, with the columns it declares."""
    from datapipe.stages import STAGES

    columns = {**BASE, **(REJECTS if with_rejects else {}), **(SIGNALS[kind] if with_signals else {})}
    con = duckdb.connect()
    con.execute(f"CREATE TABLE documents ({', '.join(f'{c} {t}' for c, t in columns.items())})")
    con.execute("INSERT INTO documents (id, source, kind, text, n_chars, status) VALUES ('a', 's', 'web', 'x', 1, 'kept')")
    declared = aggregates.run_aggregates([STAGES[kind]], set(columns))
    rows = aggregates.scan_rows(con, declared)
    assert rows.schema == aggregates.file_schema(declared)
    assert {a.name for a in declared} >= {"documents", "lengths"}
