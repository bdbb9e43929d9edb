"""The mixture, funnel and shards views of stats.duckdb, and `datapipe stats`."""

from __future__ import annotations

import json
import re

import duckdb
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from datapipe.audit import aggregates
from datapipe.audit.mixture import mixture_report, parse_tokens
from datapipe.audit.sql import connect as connect_stats
from datapipe.audit.views import mixture_view_sql
from datapipe.cli import main
from tests.conftest import DemoRun


def make_documents(con: duckdb.DuckDBPyConnection, with_tags: bool) -> None:
    con.execute("""CREATE TABLE documents AS SELECT * FROM (VALUES
        ('a', 'web', 'zh', 'kept', 10, 5, 'Hans', 'permissive'),
        ('b', 'web', 'zh', 'kept', 20, 7, NULL, 'permissive'),
        ('c', 'web', 'en', 'kept', 30, 9, 'Latn', NULL),
        ('d', 'code', NULL, 'kept', 40, 11, 'Latn', 'weak_copyleft'),
        ('e', 'web', 'en', 'rejected', 50, NULL, 'Latn', NULL)
    ) t(id, source, lang, status, n_chars, n_tokens, script, license_class)""")
    if not with_tags:
        con.execute("ALTER TABLE documents DROP COLUMN script")
        con.execute("ALTER TABLE documents DROP COLUMN license_class")
    columns = {r[0] for r in con.execute("DESCRIBE documents").fetchall()}
    assert ("script" in columns) == with_tags
    aggregates.scan_tables(con, [], temp=False)  # agg_documents, as the tasks would write it
    con.execute("CREATE OR REPLACE VIEW mixture AS " + mixture_view_sql())


@pytest.mark.parametrize("with_tags", [True, False])
def test_mixture_view_groups_missing_tags_as_unknown(with_tags: bool) -> None:
    con = duckdb.connect()
    make_documents(con, with_tags)
    rows = con.execute(
        "SELECT source, lang, script, license_class, documents, tokens, chars, token_share "
        "FROM mixture ORDER BY source, lang, script"
    ).fetchall()
    if with_tags:
        assert rows == [
            ("code", "unknown", "Latn", "weak_copyleft", 1, 11, 40, round(11 / 32, 6)),
            ("web", "en", "Latn", "unknown", 1, 9, 30, round(9 / 32, 6)),
            ("web", "zh", "Hans", "permissive", 1, 5, 10, round(5 / 32, 6)),
            ("web", "zh", "unknown", "permissive", 1, 7, 20, round(7 / 32, 6)),
        ]
    else:
        assert rows == [
            ("code", "unknown", "unknown", "unknown", 1, 11, 40, round(11 / 32, 6)),
            ("web", "en", "unknown", "unknown", 1, 9, 30, round(9 / 32, 6)),
            ("web", "zh", "unknown", "unknown", 2, 12, 30, round(12 / 32, 6)),
        ]
    ((share, docs),) = con.execute("SELECT sum(token_share), sum(doc_share) FROM mixture").fetchall()
    assert share == pytest.approx(1, abs=1e-5) and docs == pytest.approx(1, abs=1e-5)


def test_mixture_view_weights_tokens_by_dup_count_where_minhash_recorded_it() -> None:
    con = duckdb.connect()
    make_documents(con, with_tags=True)
    assert con.execute("SELECT sum(rehydrated_tokens) = sum(tokens) FROM mixture").fetchone() == (True,)
    # a survivor of a cluster of 3 counts 3 times; a NULL (a source minhash skipped) counts once
    con.execute("ALTER TABLE documents ADD COLUMN dup_count BIGINT")
    con.execute("UPDATE documents SET dup_count = CASE id WHEN 'a' THEN 3 WHEN 'c' THEN 1 END")
    aggregates.scan_tables(con, [], temp=False)
    con.execute("CREATE OR REPLACE VIEW mixture AS " + mixture_view_sql())
    rows = dict(con.execute("SELECT source || '/' || lang || '/' || script, rehydrated_tokens FROM mixture").fetchall())
    assert rows == {"web/zh/Hans": 15, "web/zh/unknown": 7, "web/en/Latn": 9, "code/unknown/Latn": 11}


@pytest.mark.parametrize(
    "text,value", [("5000", 5000), ("300M", 300_000_000), ("2.5b", 2_500_000_000), ("1_000", 1000), ("12K", 12_000)]
)
def test_parse_tokens(text: str, value: int) -> None:
    assert parse_tokens(text) == value


def test_parse_tokens_rejects_junk() -> None:
    with pytest.raises(ValueError):
        parse_tokens("lots")


def test_run_views_and_stats_command(demo_run: DemoRun) -> None:
    out = demo_run.out
    con = connect_stats(out)
    # documents.n_tokens accounts for every token in the shards (train and val), per source.
    manifest = pq.read_table(out / "shards" / "manifest.parquet").to_pylist()
    per_source = dict(con.execute("SELECT source, sum(n_tokens) FROM documents WHERE status='kept' GROUP BY source").fetchall())
    for source, n in per_source.items():
        assert n == sum(m["tokens"] for m in manifest if m["source"] == source) > 0
    assert (
        con.execute("SELECT sum(tokens), sum(documents) FROM mixture").fetchone()
        == con.execute("SELECT sum(n_tokens), count(*) FROM documents WHERE status='kept'").fetchone()
    )
    # The funnel: every stage, and what leaves one stage enters the next.
    funnel = con.execute("SELECT DISTINCT position, docs_in, docs_out FROM funnel ORDER BY position").fetchall()
    n_stages = len(json.loads((out / "run.json").read_text())["config"]["stages"])
    assert [p for p, _, _ in funnel] == list(range(n_stages + 1))  # reading, then every stage
    assert all(a[2] == b[1] for a, b in zip(funnel, funnel[1:]))
    kept = con.execute("SELECT count(*) FROM documents WHERE status='kept'").fetchone()[0]
    assert funnel[-1][2] == kept
    dropped = con.execute("SELECT stage, reason, dropped FROM funnel WHERE dropped > 0").fetchall()
    assert sorted(dropped) == sorted(
        con.execute("SELECT stage, reason, count(*) FROM documents WHERE status='rejected' GROUP BY ALL").fetchall()
    )
    assert con.execute("SELECT count(*), min(fill) > 0, max(fill) <= 1 FROM shards").fetchone() == (len(manifest), True, True)
    con.close()

    # Sampling ratios, computed here from the manifest and the demo's weights (web_zh 0.6, web_en 0.4).
    train = {s: sum(m["tokens"] for m in manifest if m["source"] == s and m["split"] == "train") for s in ("web_zh", "web_en")}
    report = mixture_report(out, budget=1_000_000)
    by_name = {r.source: r for r in report.sources}
    assert by_name["web_zh"].ratio == pytest.approx(0.6 * 1_000_000 / train["web_zh"])
    assert by_name["web_en"].target == pytest.approx(0.4)
    assert report.max_budget_one_epoch == int(min(train["web_zh"] / 0.6, train["web_en"] / 0.4))
    first_out = min(("web_zh", 0.6), ("web_en", 0.4), key=lambda sw: train[sw[0]] / sw[1])[0]
    assert report.limiting == [first_out] and not report.starved
    result = CliRunner().invoke(main, ["stats", str(out), "--budget", "1M"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if "web_zh" in ln and "epochs" in ln)
    epochs = float(re.search(r"([0-9.]+) epochs", line).group(1))
    assert epochs == pytest.approx(0.6 * 1_000_000 / train["web_zh"], abs=0.01)
    assert f"{train['web_zh']:,}" in line and "60.0%" in line
    assert f"({first_out} runs out first)" in result.output
