"""One small Ray run with the classify stage on real documents: columns in `documents`, percentile
drops with reasons, explain, the HTML report, and training again from SQL over the run."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from datapipe.audit.sql import run_query
from datapipe.cli import main
from datapipe.engine.runner import run_pipeline
from datapipe.pipeline.load import load_pipeline
from tests.conftest import write_pipeline
from tests.support.shared_data import shared_path

SMALL = ["--dim", "16", "--epoch", "3", "--bucket", "20000", "--heldout-frac", "0.2"]


def _subset(src: Path, dest: Path, n: int) -> None:
    lines = src.read_text(encoding="utf-8").splitlines()[:n]
    dest.write_text(
        "".join(json.dumps({"text": json.loads(x)["text"]}, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8"
    )


def test_classify_in_a_pipeline_then_train_from_sql(ray_local, tmp_path: Path) -> None:
    corpus = shared_path("corpus")
    data = tmp_path / "data"
    data.mkdir()
    _subset(corpus / "zh_wikipedia.jsonl", data / "wiki.jsonl", 150)
    _subset(corpus / "zh_pingcap_docs.jsonl", data / "docs.jsonl", 150)
    models = tmp_path / "models"
    trained = CliRunner().invoke(
        main,
        [
            "train-classifier",
            "--name",
            "q",
            "--out-dir",
            str(models),
            *SMALL,
            "--positive",
            str(corpus / "zh_wikipedia.jsonl"),
            "--negative",
            str(corpus / "zh_pingcap_docs.jsonl"),
            "--max-per-class",
            "300",
        ],
    )
    assert trained.exit_code == 0, trained.output
    pipeline = write_pipeline(
        tmp_path,
        {
            "name": "c",
            "sources": [
                {"name": "wiki", "kind": "text", "paths": ["data/wiki.jsonl"]},
                {"name": "docs", "kind": "web", "paths": ["data/docs.jsonl"]},
            ],
            "stages": [
                {"langid": {"keep": ["zh", "en"]}},
                {
                    "classify": {
                        "models": {"q": {"path": "models/q.bin"}},
                        "kinds": ["web", "text"],
                        "keep": [{"score": "cls_q_hq", "min_percentile": 25}],
                    }
                },
            ],
        },
    )
    out = tmp_path / "out"
    run_pipeline(load_pipeline(pipeline), output=out, show_progress=False, log=lambda m: None)

    rows = run_query(
        out,
        "select source, lang, kind, count(*) n, count(cls_q_hq) scored, "
        "count(*) filter (reason = 'classifier:cls_q_hq') dropped from documents "
        "where stage is distinct from 'langid' group by all",
    ).to_pylist()
    for r in rows:  # every document past langid is scored; about a quarter of each lang x kind group dropped
        assert r["scored"] == r["n"], r
        if r["n"] >= 20:
            assert 0.15 * r["n"] <= r["dropped"] <= 0.25 * r["n"], r
    assert {(r["source"], r["lang"]) for r in rows} >= {("wiki", "zh"), ("docs", "zh")}
    kept = run_query(
        out,
        "select avg(cls_q_hq) filter (source = 'wiki') w, avg(cls_q_hq) filter (source = 'docs') d "
        "from documents where status = 'kept'",
    ).to_pylist()[0]
    assert kept["w"] > kept["d"]  # the model trained on Wikipedia vs TiDB docs tells them apart on unseen lines

    doc = run_query(out, "select id from documents where reason = 'classifier:cls_q_hq' limit 1").to_pylist()[0]["id"]
    explained = CliRunner().invoke(main, ["explain", str(out), doc])
    assert explained.exit_code == 0 and "cls_q_hq" in explained.output and "(p25 of lang=" in explained.output
    assert re.search(r"FAIL cls_q_hq=0\.\d{4}  \(>= 0\.\d{4}, the p25 cut-off of lang=zh kind=(web|text)\)", explained.output), (
        explained.output
    )
    page = tmp_path / "r.html"
    assert CliRunner().invoke(main, ["report", str(out), "--html", str(page)]).exit_code == 0
    html = page.read_text(encoding="utf-8")
    assert "Classifier scores" in html and "<code>cls_q_hq</code>" in html

    # train again, now from SQL over the run: kept wiki documents against kept docs pages
    again = CliRunner().invoke(
        main,
        [
            "train-classifier",
            "--run",
            str(out),
            "--name",
            "fromsql",
            "--out-dir",
            str(models),
            *SMALL,
            "--positive",
            "select id, text, lang from kept_docs where source = 'wiki'",
            "--negative",
            "select id, text, lang from kept_docs where source = 'docs' and lang = 'zh'",
        ],
    )
    assert again.exit_code == 0, again.output
    meta = json.loads((models / "fromsql.meta.json").read_text())
    n_wiki = run_query(out, "select count(*) n from documents where status = 'kept' and source = 'wiki'").to_pylist()
    assert meta["counts"]["zh"]["hq"]["available"] == n_wiki[0]["n"]
    assert meta["sources"]["positive"] == ["select id, text, lang from kept_docs where source = 'wiki'"]
    refused = CliRunner().invoke(
        main,
        [
            "train-classifier",
            "--run",
            str(out),
            "--name",
            "x",
            "--out-dir",
            str(models),
            "--positive",
            "copy documents to 'x.csv'",
            "--negative",
            "select text from kept_docs",
        ],
    )
    assert refused.exit_code == 2  # not SQL to us (no SELECT): read as a file glob, which matches nothing
