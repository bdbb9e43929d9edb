"""`datapipe sql`, explain, stats and report on a small run over real en Wikipedia articles.

- the audit connection writes nothing and reads nothing outside the run, whatever SQL it gets;
- every table the CLI prints shows its data verbatim (no rich markup, no emoji), CSV has LF ends;
- a source that kept nothing is named by `stats` and listed by the report;
- a missing or corrupt stats.duckdb gives one line, not a traceback;
- ``documents`` is a view over the run's own files, indexed with their rows and id ranges: a moved
  run folder answers the same, and `explain` of one id reads only the file holding it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import shutil
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from datapipe.audit import documents
from datapipe.audit.explain import explain
from datapipe.audit.report import Series, build_report, hbar_chart, text_width
from datapipe.audit.sql import AuditError, connect, run_query
from datapipe.audit.sql import connect as audit_connect
from datapipe.cli import main
from datapipe.cli.summary import print_summary
from datapipe.engine.runner import RunResult, run_pipeline
from datapipe.pipeline.load import load_pipeline
from tests.conftest import write_pipeline
from tests.support.shared_data import PROJECT_ROOT, shared_path

SECRET = "canary-3f9a1c-not-for-sql"
NARHF = "[//www.narhf.org/?p=5497 Jordan Spread]"  # the en Wikipedia text that raised MarkupError


def _wiki_docs() -> tuple[list[dict], list[dict]]:
    """Real articles: ones whose text looks like rich markup or emoji codes, plain ones, and stubs."""
    marked, plain, stubs = [], [], []
    with shared_path("corpus", "en_wikipedia.jsonl").open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            text = doc["text"]
            if NARHF in text:
                marked.insert(0, doc)
            elif len(text) < 150:
                if len(stubs) < 8:
                    stubs.append(doc)
            elif len(text) < 4000 and "\t" not in text and (re.search(r"\[[^\]\n]*\]", text) or re.search(r":[a-z_]+:", text)):
                if len(marked) < 25:
                    marked.append(doc)
            elif len(text) < 4000 and len(plain) < 15:
                plain.append(doc)
    assert marked and NARHF in marked[0]["text"] and len(stubs) == 8
    return marked + plain, stubs


@pytest.fixture(scope="module")
def real_run(ray_local, tmp_path_factory) -> Path:
    """A run folder (base/out) over real articles; base also holds a canary file outside the run."""
    base = tmp_path_factory.mktemp("sqlrun")
    wiki, stubs = _wiki_docs()
    (base / "data").mkdir()
    for name, docs in (("wiki", wiki), ("stubs", stubs)):
        (base / "data" / f"{name}.jsonl").write_text(
            "".join(json.dumps({"text": d["text"], "url": d["source"]}, ensure_ascii=False) + "\n" for d in docs),
            encoding="utf-8",
        )
    pipeline = write_pipeline(
        base,
        {
            "name": "sqlaudit",
            "sources": [
                {"name": "wiki", "kind": "web", "paths": ["data/wiki.jsonl"]},
                {"name": "stubs", "kind": "web", "paths": ["data/stubs.jsonl"]},
            ],
            "stages": [{"length": {"min_chars": 200}}],  # keeps no stub: a source that kept nothing
            "tokenize": {
                "tokenizer": str(PROJECT_ROOT / "tokenizer" / "demo.json"),
                "seq_len": 128,
                "val_fraction": 0.1,
                "rows_per_shard": 64,
            },
            "mixture": {"wiki": 0.7, "stubs": 0.3},
        },
    )
    run_pipeline(load_pipeline(pipeline), output=base / "out", show_progress=False, log=lambda m: None)
    (base / "canary.txt").write_text(SECRET + "\n", encoding="utf-8")
    return base / "out"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): _sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


def hostile_statements(run: Path) -> list[str]:
    base = run.parent
    db, canary, outside = run / "stats.duckdb", base / "canary.txt", base / "written.csv"
    return [
        # writes, plain and wrapped
        f"EXPLAIN ANALYZE COPY (SELECT 'x') TO '{db}' (FORMAT csv)",
        f"EXPLAIN ANALYZE COPY (SELECT 'x') TO '{outside}' (FORMAT csv)",
        f"EXPLAIN COPY (SELECT 'x') TO '{outside}' (FORMAT csv)",
        f"COPY (SELECT 'x') TO '{db}' (FORMAT csv, USE_TMP_FILE false)",
        f"COPY (SELECT 'x') TO '{db}.wal' (FORMAT csv)",
        f"COPY (SELECT 'x') TO '{canary}' (FORMAT csv, USE_TMP_FILE false)",
        f"COPY documents TO '{run}/docs/copy.parquet' (FORMAT parquet)",  # inside the run folder too
        f"COPY documents TO '{run}/copy.csv'",
        "COPY documents TO 'relative.csv'",
        f"COPY documents FROM '{canary}'",
        f"WITH t AS (SELECT 1) SELECT * FROM t; COPY (SELECT 1) TO '{outside}'",
        f"SELECT 1; COPY (SELECT 'x') TO '{db}' (FORMAT csv, USE_TMP_FILE false)",
        f"/* SELECT */ COPY (SELECT 'x') TO '{outside}' -- SELECT",
        "SELECT 1 /* ; */ ; DROP TABLE documents",
        f"EXPORT DATABASE '{base}/exported'",
        f"IMPORT DATABASE '{base}'",
        f"ATTACH '{base}/new.duckdb' AS other",
        f"ATTACH '{db}' AS again (READ_WRITE)",
        "ATTACH ':memory:' AS mem",
        "INSTALL httpfs",
        "FORCE INSTALL json",
        "LOAD httpfs",
        "LOAD parquet",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "RESET lock_configuration",
        f"SET temp_directory = '{base}/spill'",
        f"SET allowed_directories = ['{base}']",
        "SET disabled_filesystems = ''",
        "PRAGMA enable_profiling = 'json'",
        f"PRAGMA profiling_output = '{outside}'",
        f"SET profiling_output = '{outside}'",
        "CALL enable_logging()",
        "PRAGMA version",
        "CALL pragma_version()",
        "CHECKPOINT",
        "VACUUM",
        "CREATE TABLE t AS SELECT 1",
        "CREATE VIEW v AS SELECT 1",
        "CREATE MACRO m(x) AS x",
        "INSERT INTO documents SELECT * FROM documents",
        "UPDATE documents SET id = 'x'",
        "DELETE FROM documents",
        "DROP TABLE documents",
        "ALTER TABLE documents ADD COLUMN z INT",
        # reads outside the run folder, plain and wrapped
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/proc/self/environ')",
        f"SELECT * FROM read_text('{canary}')",
        f"SELECT * FROM read_blob('{canary}')",
        f"SELECT * FROM read_csv('{canary}', header=false)",
        f"SELECT * FROM read_parquet('{canary}')",
        f"SELECT * FROM read_text('{run}/docs/../../canary.txt')",
        f"SELECT * FROM glob('{base}/*')",
        "SELECT * FROM glob('/etc/*')",
        f"SELECT * FROM sniff_csv('{canary}')",
        f"WITH c AS (SELECT * FROM read_text('{canary}')) SELECT content FROM c",
        f"EXPLAIN ANALYZE SELECT * FROM read_text('{canary}')",
        f"/* harmless */ SELECT content FROM read_text('{canary}') -- comment",
        f"SELECT * FROM '{canary}'",
    ]


READS_NOTHING = {"PRAGMA version", "CALL pragma_version()"}


def test_sql_refuses_every_write_and_every_read_outside_the_run(real_run: Path, monkeypatch) -> None:
    base = real_run.parent
    monkeypatch.chdir(base)  # a relative COPY target would land here
    db_hash, before = _sha(real_run / "stats.duckdb"), _tree(base)
    runner = CliRunner()
    statements = hostile_statements(real_run)
    for statement in statements:
        res = runner.invoke(main, ["sql", str(real_run), statement, "--format", "json"])
        if res.exit_code == 0 and statement in READS_NOTHING:
            continue  # older DuckDB parses PRAGMA version as a SELECT: a harmless answer
        assert res.exit_code == 2, (statement, res.output)
        assert res.output.startswith("error: ") and len(res.output.strip().splitlines()) == 1, res.output
        assert SECRET not in res.output and "root:" not in res.output
    # The connection on its own, without the statement check: each statement fails or does no harm. Also
    # a second one opened while the first is (DuckDB shares the database instance within a process, as
    # the viewer's pages do): it is confined by the first one's settings.
    con = connect(real_run, text_views=True)
    second = connect(real_run, text_views=True)
    try:
        for c in (con, second):
            for statement in statements:
                try:
                    rows = c.execute(statement).fetchall()
                except duckdb.Error:
                    continue
                assert SECRET not in repr(rows) and "root:x:0" not in repr(rows), statement
    finally:
        second.close()
        con.close()
    assert _sha(real_run / "stats.duckdb") == db_hash
    assert (base / "canary.txt").read_text(encoding="utf-8") == SECRET + "\n"
    assert _tree(base) == before  # no file written, changed or removed anywhere


def test_legit_queries_still_work(real_run: Path) -> None:
    wiki_files = [
        json.loads(x)["text"] for x in (real_run.parent / "data" / "wiki.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    n_kept = run_query(real_run, "select count(*) as n from documents where status = 'kept'").column("n")[0].as_py()
    assert n_kept == sum(len(t.strip()) >= 200 for t in wiki_files) > 0
    texts = run_query(real_run, "with k as (select id, text from kept_docs) select text from k order by id")
    assert sorted(texts.column("text").to_pylist()) == sorted(t for t in wiki_files if len(t.strip()) >= 200)
    rejected = run_query(real_run, "select source, reason, count(*) as n from rejected_docs group by all")
    assert ("stubs", "too_short", 8) in [tuple(r.values()) for r in rejected.to_pylist()]
    funnel = run_query(real_run, "select stage, reason, dropped from funnel where dropped > 0").to_pylist()
    assert {"stage": "length", "reason": "too_short", "dropped": 8} in funnel
    mix = run_query(real_run, "select source, sum(documents) as d from mixture group by source").to_pylist()
    assert mix == [{"source": "wiki", "d": n_kept}]
    assert run_query(real_run, "describe documents").num_rows > 5
    plan = run_query(real_run, "explain analyze select count(*) from kept_docs").to_pylist()
    assert plan and "analyzed_plan" in str(plan[0])
    assert run_query(real_run, "select sum(rows) as r from shards").column("r")[0].as_py() > 0


def test_sql_help_names_every_view_of_a_run(real_run: Path) -> None:
    """`sql --help` lists the views a run has (it once left out mixture and contamination)."""
    with audit_connect(real_run) as con:
        views = {r[0] for r in con.execute("select view_name from duckdb_views() where not internal").fetchall()}
    # `documents` is a view over the tasks' files too, but the help names it as the table it reads as;
    # names starting with "__" are its per-layout parts, not for users
    views = {v for v in views if v != "documents" and not v.startswith("__")}
    assert {"funnel", "shards", "mixture", "contamination"} <= views  # this run's stage (length) adds none
    listed = CliRunner().invoke(main, ["sql", "--help"]).output
    named = set(re.findall(r"\w+", listed.split("Views:", 1)[1].split("Example:", 1)[0]))
    assert views | {"kept_docs", "rejected_docs"} <= named, sorted(views - named)


def test_cli_prints_real_wikipedia_text_verbatim(real_run: Path) -> None:
    runner = CliRunner()
    query = "select id, text from kept_docs where source = 'wiki' order by id"
    expected = run_query(real_run, query).to_pylist()
    assert any(NARHF in r["text"] for r in expected)
    res = runner.invoke(main, ["sql", str(real_run), query])
    assert res.exit_code == 0, res.output
    printed = res.output
    assert NARHF in printed
    checked = 0
    for row in expected:
        assert row["id"] in printed
        for line in row["text"].splitlines():
            if line.strip():
                assert line.strip() in printed, (row["id"], line)
                checked += 1
    assert checked > 40
    # CSV: the same texts back, LF line ends outside the quoted cells.
    res = runner.invoke(main, ["sql", str(real_run), query, "--format", "csv"])
    assert res.exit_code == 0
    assert list(csv.DictReader(io.StringIO(res.output, newline=""))) == expected
    assert res.output.count("\r\n") == sum(r["text"].count("\r\n") for r in expected)
    res = runner.invoke(
        main, ["sql", str(real_run), "select id, text from kept_docs where text like '%narhf%'", "--format", "json"]
    )
    assert [json.loads(x) for x in res.output.splitlines()] == [r for r in expected if "narhf" in r["text"]]


def test_cli_prints_markup_like_strings_verbatim(real_run: Path) -> None:
    cells = ["Tuple[float, float]", "x[i]", ":x:", NARHF, "[bold red]b[/bold red]", "[/]", ":thumbs_up: [link]"]
    select = ", ".join(f"'{c}' AS c{i}" for i, c in enumerate(cells)) + ', 1 AS "[i]header[/i]"'
    res = CliRunner().invoke(main, ["sql", str(real_run), f"select {select}"])
    assert res.exit_code == 0, res.output
    for c in cells + ["[i]header[/i]"]:
        assert c in res.output, c
    assert "\N{CROSS MARK}" not in res.output and "\N{THUMBS UP SIGN}" not in res.output
    # Terminal control sequences in data are shown, not obeyed (rich would pass ESC through).
    res = CliRunner().invoke(main, ["sql", str(real_run), "select chr(27) || ']0;title' || chr(7) || chr(27) || '[31mred' as t"])
    assert res.exit_code == 0 and "\x1b" not in res.output and "\x07" not in res.output
    assert "\\x1b]0;title\\x07\\x1b[31mred" in res.output
    res = CliRunner().invoke(main, ["sql", str(real_run), f"select {select}", "--format", "csv"])
    assert res.exit_code == 0 and "\r" not in res.output and res.output.endswith("\n")
    assert next(csv.reader(io.StringIO(res.output.splitlines()[1]))) == cells + ["1"]


def test_run_summary_prints_names_and_paths_verbatim(tmp_path: Path) -> None:
    from rich.console import Console

    root = tmp_path / "runs[2024]" / ":x:"
    counts = {
        "documents": 3,
        "kept": 1,
        "rejected": 2,
        "stages": [{"position": 1, "stage": "quality", "in": 3, "rejected": {"zh:han_ratio": 1, "c4:lorem_ipsum:x:": 1}}],
        "sources": {"web[1]": {"documents": 3, "kept": 1, "tokens": 12_345_678}},
    }
    out = io.StringIO()
    print_summary(RunResult(root, {"counts": counts}), Console(file=out, width=120))
    print_summary(RunResult(root, {"counts": counts}))  # the default console, too (no exception)
    text = out.getvalue()
    for s in ("c4:lorem_ipsum:x:", "web[1]", "12,345,678"):
        assert s in text, s
    from datapipe.audit.textout import make_console

    out = io.StringIO()
    print_summary(RunResult(root, {"counts": counts}), make_console(out))
    assert str(root) in out.getvalue() and "c4:lorem_ipsum:x: 1" in out.getvalue()


def test_stats_names_the_source_that_kept_nothing_and_prints_full_numbers(real_run: Path) -> None:
    train = run_query(real_run, "select sum(tokens) as t from shards where source = 'wiki' and split = 'train'")
    train_tokens = train.column("t")[0].as_py()
    assert train_tokens > 0
    for columns in ("30", "80", None):  # piped output, whatever COLUMNS says
        env = {"COLUMNS": columns} if columns else {}
        res = CliRunner().invoke(main, ["stats", str(real_run), "--budget", "123456789"], env=env)
        assert res.exit_code == 0, res.output
        assert f"{train_tokens:,}" in res.output and "123,456,789" in res.output
        assert f"{int(0.7 * 123_456_789):,}" in res.output and "…" not in res.output
        line = next(ln for ln in res.output.splitlines() if ln.startswith("Largest budget"))
        assert "stubs" in line and "kept no documents" in line and "30.0%" in line
        assert line.startswith("Largest budget at these weights with no source repeated: 0 train tokens")
        assert line.endswith(f"With it at weight 0 the largest is {train_tokens:,}.")  # wiki alone: weight 1
        assert re.search(r"^\s*│?\s*stubs\s", res.output, re.M)  # listed in the table with its zeros


def test_report_lists_a_source_that_kept_nothing_and_fits_its_labels(real_run: Path) -> None:
    page = build_report(real_run)
    assert re.search(r"<tr><td>stubs</td><td class=\"n\">0</td>", page)
    # Every label of every bar chart starts inside its SVG (text-anchor end at x: needs x >= width).
    labels = re.findall(r'<text x="([0-9.]+)" y="\d+" text-anchor="end">([^<]*)</text>', page)
    assert labels and any(" / " in lab for _, lab in labels)
    for x, label in labels:
        assert float(x) >= text_width(label.replace("&amp;", "&")), label


def test_long_and_wide_labels_are_not_cut_off() -> None:
    for label in ("wikipedia_en_2024 / en / unknown / permissive", "中文维基百科 / zh / hans / weak_copyleft"):
        svg = hbar_chart([(label, [5.0]), ("b", [1.0])], [Series("s", "#000")])
        x = float(re.search(r'<text x="([0-9.]+)" y="18" text-anchor="end">', svg).group(1))
        assert x >= text_width(label) > 190
        width = float(re.search(r'<svg width="([0-9.]+)"', svg).group(1))
        bar = re.search(r'<rect x="([0-9.]+)" y="4" width="([0-9.]+)"', svg)
        assert float(bar.group(1)) > x and float(bar.group(1)) + float(bar.group(2)) < width


@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated", "flipped", "empty", "run_json"])
def test_missing_or_corrupt_database_gives_one_line(real_run: Path, tmp_path: Path, damage: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_bytes((real_run / "run.json").read_bytes())
    data = (real_run / "stats.duckdb").read_bytes()
    if damage == "garbage":
        (run / "stats.duckdb").write_bytes(b"this is not a database\n" * 100)
    elif damage == "truncated":  # the header survives, the first data block does not
        (run / "stats.duckdb").write_bytes(data[:12288])
    elif damage == "flipped":  # bytes flipped in the data blocks: their checksums no longer match
        (run / "stats.duckdb").write_bytes(bytes(b ^ 0x55 if i > 16384 and i % 7 == 0 else b for i, b in enumerate(data)))
    elif damage == "empty":
        (run / "stats.duckdb").write_bytes(b"")
    elif damage == "run_json":
        (run / "stats.duckdb").write_bytes(data)
        (run / "run.json").write_text("{not json", encoding="utf-8")
    runner = CliRunner()
    commands = [
        ["sql", str(run), "select count(*) from documents"],
        ["explain", str(run), "wiki/x#L1"],
        ["stats", str(run)],
        ["report", str(run), "--html", str(tmp_path / "r.html")],
    ]
    for args in commands:
        if damage == "run_json" and args[0] in ("sql", "explain"):
            continue  # they do not read run.json
        res = runner.invoke(main, args)
        assert res.exit_code == 2, (args, res.output)
        assert isinstance(res.exception, SystemExit), (args, res.exception)
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output, res.output
        assert "stats.duckdb" in lines[0] or "run.json" in lines[0], lines[0]
    assert not (tmp_path / "r.html").exists()
    if damage != "run_json":
        with pytest.raises(AuditError):
            run_query(run, "select count(*) from documents")


def test_documents_is_a_view_over_the_run_files_and_explain_reads_one_file(real_run: Path, tmp_path: Path, monkeypatch) -> None:
    with audit_connect(real_run) as con:
        assert con.execute("select count(*) from duckdb_tables() where table_name = 'documents'").fetchone() == (0,)
        files = con.execute("select path, status, rows, min_id, max_id from document_files order by path").fetchall()
    on_disk = sorted(p.relative_to(real_run).as_posix() for d in ("docs", "rejected") for p in (real_run / d).rglob("*.parquet"))
    assert [f[0] for f in files] == on_disk and len(files) == 2
    for path, status, rows, lo, hi in files:  # what the map tasks recorded is what their files hold
        ids = pq.read_table(real_run / path, columns=["id"])["id"].to_pylist()
        assert (status, rows, lo, hi) == ("kept" if path.startswith("docs/") else "rejected", len(ids), min(ids), max(ids))

    query = "select id, status, stage, reason, n_chars, n_tokens from documents order by id"
    before = run_query(real_run, query)
    assert before.num_rows == sum(f[2] for f in files)
    shutil.copytree(real_run, tmp_path / "a")
    (tmp_path / "a").rename(tmp_path / "b")  # the copy it was made as is gone: only b's own files can answer
    assert run_query(tmp_path / "b", query) == before

    registered: list[int] = []
    attach = documents.attach
    monkeypatch.setattr(documents, "attach", lambda *a, **k: registered.append(attach(*a, **k)) or registered[-1])
    doc_id = next(r["id"] for r in before.to_pylist() if r["status"] == "rejected")
    out = io.StringIO()
    explain(tmp_path / "b", doc_id, out)
    assert f"id: {doc_id}" in out.getvalue() and "too_short" in out.getvalue()
    assert registered == [1]  # of the run's files, only the one whose id range holds the id


def test_a_query_left_unread_does_not_block_the_next_one(real_run: Path) -> None:
    """A result never read (a HEAD of the viewer's CSV download) and still referenced while the next query
    opens its connection to the same database instance: the next one answers. DuckDB 2 refuses a
    connection's next query while a result on it was fetched only in part (``fetchone``)."""
    from datapipe.audit.sql import query_result

    first = query_result(real_run, "SELECT id FROM documents")
    unread = first.__enter__()
    with query_result(real_run, "SELECT 42 AS x") as second:
        assert [r for b in second for r in b.to_pylist()] == [{"x": 42}]
    first.__exit__(None, None, None)
    del unread
    with query_result(real_run, "SELECT 43 AS x") as third:
        assert [r for b in third for r in b.to_pylist()] == [{"x": 43}]
