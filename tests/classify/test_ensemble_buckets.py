"""classify with several models: corpus-wide percentile buckets per (lang, kind), the ensemble bucket,
keep rules on buckets, and their config errors; two tiny fastText models trained here on real text."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from datapipe.classify import buckets as bk
from datapipe.cli import main
from datapipe.engine.runner import run_pipeline
from datapipe.engine.tasks.reduce_inputs import ParquetReduceInputs
from datapipe.pipeline.load import ConfigError, load_pipeline
from datapipe.stages.base import StageContext
from datapipe.stages.classify import Classify, ClassifyOptions, KeepRule
from datapipe.stages.row_keys import row_keys
from tests.support.shared_data import shared_path
from tests.support.zh_classifiers import train_zh_pair


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two small zh models with different negatives: TiDB docs and OI-wiki pages against Wikipedia."""
    return train_zh_pair(tmp_path_factory.mktemp("models"))


def _docs(n_per_file: int = 120) -> pa.Table:
    """Real documents of three files, as text (Wikipedia) and web (the docs sites)."""
    rows = []
    for file, kind in (("zh_wikipedia.jsonl", "text"), ("zh_pingcap_docs.jsonl", "web"), ("zh_oiwiki.jsonl", "web")):
        lines = shared_path("corpus", file).read_text(encoding="utf-8").splitlines()[-n_per_file:]  # not the training head
        rows += [(f"{file}#L{i}", json.loads(x)["text"], kind) for i, x in enumerate(lines)]
    ids, texts, kinds = zip(*rows)
    return pa.table({"id": list(ids), "text": list(texts), "kind": list(kinds), "lang": ["zh"] * len(ids)})


def _options(models: Path, **buckets: object) -> ClassifyOptions:
    return ClassifyOptions(
        models={"qa": {"path": str(models / "qa.bin")}, "qb": {"path": str(models / "qb.bin")}},
        kinds=["web", "text"],
        buckets={"count": 10, **buckets},
        keep=[{"bucket": "ensemble", "min": 3}],
        max_chars=2000,
    )


def _bucket_run(stage: Classify, scored: pa.Table, tmp_path: Path, n_shards: int) -> dict[str, dict]:
    """The global step over the scored documents split into ``n_shards`` map outputs, then ``apply``
    on each shard: each document's bucket columns and verdict, by id."""
    files, bounds = [], np.linspace(0, scored.num_rows, n_shards + 1).astype(int)
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    for s in range(n_shards):
        path = folder / f"{s}.parquet"
        pq.write_table(scored.slice(bounds[s], bounds[s + 1] - bounds[s]).drop_columns(["text"]), path)
        files.append(str(path))
    inputs = ParquetReduceInputs(files, list(range(n_shards)), str(folder))
    (step,) = stage.steps()
    assert step.decide([], inputs).num_rows == 0  # apply decides
    assert step.state is not None
    state = step.state([], inputs)
    got: dict[str, dict] = {}
    for s in range(n_shards):
        part = pq.read_table(files[s])
        mine = state.filter(pa.compute.equal(state["shard"], s))
        out, decision = stage.apply(part, row_keys(s, 0, part.num_rows), mine)
        for row, reason, detail in zip(out.to_pylist(), decision.reason.to_pylist(), decision.detail.to_pylist()):
            got[row["id"]] = {**row, "reason": reason, "detail": detail}
    return got


def test_rank_buckets_are_equal_sized_with_ties_and_independent_of_order() -> None:
    rng = np.random.default_rng(1)
    n = 5003
    scores = np.where(rng.random(n) < 0.3, 1.0, rng.random(n)).astype(np.float32)  # 30% tied at 1.0
    groups = rng.integers(0, 3, n)
    ids = [f"doc{i}" for i in range(n)]
    keys = bk.sort_keys(scores, bk.tie_keys(ids))
    got = bk.rank_buckets(keys, groups, 20)
    for g in range(3):
        sizes = np.bincount(got[groups == g], minlength=20)
        assert sizes.max() - sizes.min() <= 1, sizes
    # a higher score never gets a lower bucket within a group
    for g in range(3):
        m = groups == g
        order = np.argsort(scores[m], kind="stable")
        assert (np.diff(got[m][order]) >= 0).sum() >= len(order) - 1 - (scores[m] == 1.0).sum()
        assert got[m][scores[m] < 0.5].max() <= got[m][scores[m] == 1.0].min()
    perm = rng.permutation(n)  # another sharding or worker count: the same bucket per document
    again = bk.rank_buckets(bk.sort_keys(scores[perm], bk.tie_keys([ids[i] for i in perm])), groups[perm], 20)
    assert (again == got[perm]).all()
    assert (bk.rank_buckets(keys, np.where(groups == 0, -1, groups), 20)[groups == 0] == -1).all()


def test_ensemble_rules() -> None:
    b = np.array([[3, 5], [19, 0], [-1, 4], [7, 7]])
    assert bk.combine(b, "max").tolist() == [5, 19, -1, 7]
    assert bk.combine(b, "mean").tolist() == [4, 9, -1, 7]
    assert bk.combine(b, "weighted", [0.75, 0.25]).tolist() == [3, 14, -1, 7]
    assert bk.weight_problems({"qa": 0.5, "qb": 0.6}, ["qa", "qb"]) == [("weights", "the weights sum to 1.1; they must sum to 1")]
    assert [k for k, _ in bk.weight_problems({"qa": 1.0, "zz": 0.0}, ["qa", "qb"])] == ["weights.zz", "weights"]


def test_buckets_of_two_real_models_equal_per_group_and_the_same_over_one_or_two_shards(models: Path, tmp_path: Path) -> None:
    stage = Classify(_options(models), StageContext(".", "."))
    stage.setup()
    assert Classify.global_for(stage.options)
    docs = _docs()
    scored = stage.compute(docs)
    one = _bucket_run(stage, scored, tmp_path, 1)
    two = _bucket_run(stage, scored, tmp_path, 2)
    assert one == two  # buckets, reasons and details do not depend on the sharding
    kinds = dict(zip(docs["id"].to_pylist(), docs["kind"].to_pylist()))
    for kind in ("text", "web"):
        rows = [r for i, r in one.items() if kinds[i] == kind]
        for col in ("bucket_qa", "bucket_qb"):
            sizes = np.bincount([r[col] for r in rows], minlength=10)
            assert sizes.max() - sizes.min() <= 1, (kind, col, sizes)  # 120 or 240 documents in 10 buckets
            # the bucket follows the score
            by_score = sorted(rows, key=lambda r: (r[col.replace("bucket_", "cls_") + "_hq"], r[col]))  # ties may split
            assert [r[col] for r in by_score] == sorted(r[col] for r in by_score)
        for r in rows:
            assert r["bucket_ensemble"] == max(r["bucket_qa"], r["bucket_qb"])
            dropped = r["bucket_ensemble"] < 3
            assert (r["reason"] == "classifier_bucket:ensemble") == dropped
            if dropped:
                assert r["detail"] == (
                    f"bucket_ensemble={r['bucket_ensemble']} < 3 (max of bucket_qa={r['bucket_qa']} "
                    f"cls_qa_hq={r['cls_qa_hq']:.4f}, bucket_qb={r['bucket_qb']} cls_qb_hq={r['cls_qb_hq']:.4f}; "
                    f"10 buckets of lang=zh kind={kind})"
                )
    # weighted: half of each, rounded down
    weighted = Classify(_options(models, ensemble="weighted", weights={"qa": 0.5, "qb": 0.5}), StageContext(".", "."))
    weighted.setup()
    w = _bucket_run(weighted, scored, tmp_path, 1)
    assert all(r["bucket_ensemble"] == (r["bucket_qa"] + r["bucket_qb"]) // 2 for r in w.values())
    # rank_ensemble: the maximum ranked again, equal-sized per group and ordered by (max, mean)
    ranked = Classify(_options(models, rank_ensemble=True), StageContext(".", "."))
    ranked.setup()
    r1 = _bucket_run(ranked, scored, tmp_path, 1)
    for kind in ("text", "web"):
        rows = [r for i, r in r1.items() if kinds[i] == kind]
        sizes = np.bincount([r["bucket_ensemble"] for r in rows], minlength=10)
        assert sizes.max() - sizes.min() <= 1, sizes
        value = [(max(r["bucket_qa"], r["bucket_qb"]), r["bucket_qa"] + r["bucket_qb"]) for r in rows]
        order = sorted(range(len(rows)), key=lambda i: (value[i], rows[i]["bucket_ensemble"]))  # ties may split
        assert [rows[i]["bucket_ensemble"] for i in order] == sorted(r["bucket_ensemble"] for r in rows)
    assert any("(ranked max of" in (r["detail"] or "") for r in r1.values())


def _pipeline(tmp_path: Path, models: Path, classify: dict) -> Path:
    src = [{"name": "s", "kind": "web", "paths": [str(shared_path("corpus", "zh_oiwiki.jsonl"))]}]
    classify = {"models": {"qa": {"path": str(models / "qa.bin")}, "qb": {"path": str(models / "qb.bin")}}, **classify}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "sources": src, "stages": [{"classify": classify}]}))
    return path


@pytest.mark.parametrize(
    ("classify", "key", "message"),
    [
        (
            {"buckets": {}, "keep": [{"bucket": "nope", "min": 2}]},
            "keep[0].bucket",
            "'nope' is not a bucket; allowed: qa, qb, ensemble",
        ),
        ({"keep": [{"bucket": "qa", "min": 2}]}, "keep[0].bucket", "a bucket rule needs buckets"),
        ({"buckets": {"count": 10}, "keep": [{"bucket": "qa", "min": 10}]}, "keep[0].min", "past the last bucket, 9"),
        ({"buckets": {"count": 1}}, "buckets.count", "greater than or equal to 2"),
        (
            {"buckets": {"ensemble": "weighted", "weights": {"qa": 0.7, "qb": 0.7}}},
            "buckets.weights",
            "the weights sum to 1.4; they must sum to 1",
        ),
        ({"buckets": {"ensemble": "weighted", "weights": {"qa": 1, "qc": 0}}}, "buckets.weights.qc", "'qc' is not a model"),
        ({"buckets": {"ensemble": "weighted"}}, "buckets.weights", "ensemble: weighted needs weights"),
        ({"buckets": {"name": "qa"}}, "buckets.name", "also a model's name"),
        ({"buckets": {}, "keep": [{"bucket": "qa", "min_percentile": 10}]}, "keep[0]", "a bucket is a percentile already"),
        ({"keep": [{"score": "cls_qa_hq", "min": 1.5}]}, "keep[0]", "a score rule's bounds are probabilities"),
        ({"buckets": {}, "models": {"qa": {"path": "MODEL", "bucket_label": "good"}}}, "models.qa.bucket_label", "'good'"),
    ],
)
def test_config_errors_name_the_key(models: Path, tmp_path: Path, classify: dict, key: str, message: str) -> None:
    if "models" in classify:
        classify = {**classify, "models": {"qa": {**classify["models"]["qa"], "path": str(models / "qa.bin")}}}
    with pytest.raises(ConfigError) as info:
        load_pipeline(_pipeline(tmp_path, models, classify))
    assert any(p.startswith(f"stages[0].classify.{key}") and message in p for p in info.value.problems), info.value.problems


def test_a_run_records_buckets_explains_keep_by_bucket_and_reports_them(models: Path, tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    lines = shared_path("corpus", "zh_oiwiki.jsonl").read_text(encoding="utf-8").splitlines()[-60:]
    data.write_text("".join(json.dumps({"text": json.loads(x)["text"][:3000]}, ensure_ascii=False) + "\n" for x in lines))
    classify = {"buckets": {"count": 5}, "kinds": ["web"], "keep": [{"bucket": "ensemble", "min": 2}]}
    path = _pipeline(tmp_path, models, classify)
    spec = yaml.safe_load(path.read_text())
    spec["sources"][0]["paths"] = [str(data)]
    spec["stages"].insert(0, {"langid": {"keep": ["zh"]}})
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    run_pipeline(load_pipeline(path), output=out, show_progress=False, log=lambda m: None, in_process=True)

    from datapipe.audit.sql import run_query

    rows = run_query(out, "select id, status, reason, bucket_qa, bucket_qb, bucket_ensemble from documents").to_pylist()
    scored = [r for r in rows if r["bucket_qa"] is not None]
    assert len(scored) >= 50
    sizes = np.bincount([r["bucket_qa"] for r in scored], minlength=5)
    assert sizes.max() - sizes.min() <= 1
    dropped = [r for r in scored if r["status"] == "rejected"]
    kept = [r for r in scored if r["status"] == "kept"]
    assert dropped and kept
    assert all(r["reason"] == "classifier_bucket:ensemble" and r["bucket_ensemble"] < 2 for r in dropped)
    assert all(r["bucket_ensemble"] >= 2 for r in kept)
    for r, verdict in ((dropped[0], "FAIL"), (kept[0], "ok  ")):
        text = CliRunner().invoke(main, ["explain", str(out), r["id"]]).output
        want = (
            f"{verdict} bucket_ensemble={r['bucket_ensemble']}  (>= 2 of 5 buckets; "
            f"max of bucket_qa={r['bucket_qa']}, bucket_qb={r['bucket_qb']})"
        )
        assert want in text, text
        assert f"bucket_qa                    {r['bucket_qa']}" in text
    page = tmp_path / "r.html"
    assert CliRunner().invoke(main, ["report", str(out), "--html", str(page)]).exit_code == 0
    html = page.read_text(encoding="utf-8")
    assert "Classifier buckets" in html and "<code>bucket_ensemble</code>" in html
    assert "<th>bucket</th><th>zh</th><th>documents</th><th>kept</th>" in html


def test_score_and_bucket_rules_together_the_first_failing_one_names_the_drop(models: Path, tmp_path: Path) -> None:
    scored = Classify(_options(models), StageContext(".", "."))
    scored.setup()
    docs = scored.compute(_docs(60))
    floor = round(float(np.quantile(docs["cls_qa_hq"].to_numpy(), 0.3)), 4)  # a threshold some documents fail
    keep = [
        {"score": "cls_qa_hq", "min": floor},
        {"bucket": "ensemble", "min": 5},
        {"score": "cls_qb_hq", "min_percentile": 50},
    ]
    stage = Classify(_options(models).model_copy(update={"keep": [KeepRule(**k) for k in keep]}), StageContext(".", "."))
    stage.setup()
    got = _bucket_run(stage, docs, tmp_path, 2)
    reasons = {r["reason"] for r in got.values()}
    assert {"classifier:cls_qa_hq", "classifier_bucket:ensemble", None} <= reasons, reasons
    for r in got.values():
        if r["cls_qa_hq"] < floor:
            assert r["reason"] == "classifier:cls_qa_hq"
        elif r["bucket_ensemble"] < 5:
            assert r["reason"] == "classifier_bucket:ensemble"
        else:
            assert r["reason"] in (None, "classifier:cls_qb_hq")
