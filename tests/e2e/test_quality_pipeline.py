"""End to end in this process: langid -> quality -> pii in a real run, then `datapipe explain`."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
from click.testing import CliRunner

from datapipe.audit.sql import connect as connect_stats
from datapipe.cli import main
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from tests.conftest import write_pipeline
from tests.stages.test_quality import GOOD_EN, GOOD_ZH
from tests.support.shared_data import shared_path


def test_run_with_quality_and_pii(ray_local, tmp_path: Path) -> None:
    wiki = shared_path("corpus", "zh_wikipedia.jsonl").read_text(encoding="utf-8").splitlines()[:40]
    records = [json.loads(x)["text"] for x in wiki]
    records += [
        GOOD_EN + " Write to jane.doe@example.org or call +86 139 1234 5678.",
        GOOD_EN + " Lorem ipsum dolor sit amet.",
        GOOD_ZH + "百家乐、时时彩、六合彩，真人荷官在线，注册送彩金！",
        "Le pipeline garde les documents utiles pour l'entraînement des modèles de langue.",
    ]
    data = tmp_path / "data"
    data.mkdir()
    (data / "web.jsonl").write_text(
        "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in records), encoding="utf-8"
    )
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "q",
            "sources": [{"name": "web", "kind": "web", "paths": ["data/*.jsonl"]}],
            "stages": [{"langid": {"keep": ["zh", "en"]}}, {"quality": {"rules": "auto"}}, {"pii": {}}],
        },
    )
    out = tmp_path / "out"
    run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None)
    with connect_stats(out) as con:
        ids = {r[0].rsplit("#L", 1)[1]: r[0] for r in con.execute("select id from documents").fetchall()}
        rows = {
            r[0].rsplit("#L", 1)[1]: r[1:]
            for r in con.execute(
                "select id, status, stage, reason, pii_email, pii_phone, quality_rules from documents"
            ).fetchall()
        }
    n = len(records)
    assert rows[str(n - 3)][:3] == ("kept", None, None) and rows[str(n - 3)][3:5] == (1, 1)
    assert rows[str(n - 2)][2] == "c4:lorem_ipsum"
    assert rows[str(n - 1)][2] == "blocklist:gambling"
    assert rows[str(n)][2] == "language_not_kept"
    kept_wiki = sum(rows[str(i)][0] == "kept" for i in range(1, 41))
    assert kept_wiki >= 38 and rows["1"][5] == "zh_web"
    text = (
        duckdb.connect()
        .execute(f"select text from read_parquet('{out}/docs/**/*.parquet') where text like '%<EMAIL>%'")
        .fetchall()
    )
    assert text and "<PHONE>" in text[0][0] and "jane.doe" not in text[0][0]

    doc_id = ids[str(n - 2)]
    result = CliRunner().invoke(main, ["explain", str(out), doc_id])
    assert result.exit_code == 0, result.output
    assert "rule 'c4:lorem_ipsum'" in result.output and "c4_lorem_ipsum" in result.output
    assert "FAIL c4:lorem_ipsum" in result.output and "ok   gopher_quality:min_words" in result.output
    assert "lang_score" in result.output
    missing = CliRunner().invoke(main, ["explain", str(out), "web/nope#L1"])
    assert missing.exit_code == 2 and "no document" in missing.output
