"""The ready recipe pipelines/annotate_train_classify.yaml end to end, with the test server
(tests/support/openai_server.py, on 127.0.0.1) standing in for the LLM: annotate grades a seeded
sample of real documents (the server grades by topic words, ``edu_answer``), classify fits a
fastText regressor to the grades inside the run, scores every document and buckets the scores per
language and kind. Then ``datapipe train-classifier --labels`` fits models from SQL over the run.

The stages are the file's own; only the sources (a slice of the shared corpus, 400 documents) and
the annotate sample's fraction (a larger share of fewer documents) are changed. In process, ~10 s.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from datapipe.classify.fit import output_scores, spearman
from datapipe.classify.metrics import auc
from datapipe.classify.model import Classifier, read_meta
from datapipe.cli import main
from datapipe.stages.base import CheckContext, StageContext
from datapipe.stages.classify import Classify, ClassifyOptions
from tests.support.openai_server import FakeOpenAI, edu_answer
from tests.support.shared_data import PROJECT_ROOT, shared_path

RECIPE = PROJECT_ROOT / "pipelines" / "annotate_train_classify.yaml"
SLICES = {  # source -> (corpus file, kind, documents)
    "zh_wiki": ("zh_wikipedia.jsonl", "text", 120),
    "zh_docs": ("zh_pingcap_docs.jsonl", "web", 80),
    "en_wiki": ("en_wikipedia.jsonl", "text", 200),
}
FRACTION = 0.5


def _slice(src: Path, dest: Path, n: int) -> None:
    with open(src, encoding="utf-8") as fh:
        dest.write_text("".join(next(fh) for _ in range(n)), encoding="utf-8")


def recipe_on_slices(folder: Path) -> Path:
    """The recipe file with its stages unchanged but for the sample fraction, over slices of the corpus."""
    config = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
    sources = []
    for name, (file, kind, n) in SLICES.items():
        _slice(shared_path("corpus", file), folder / f"{name}.jsonl", n)
        sources.append({"name": name, "kind": kind, "paths": [f"{name}.jsonl"]})
    config["sources"] = sources
    config.pop("output")
    annotate = next(s["annotate"] for s in config["stages"] if "annotate" in s)
    annotate["sample"]["fraction"] = FRACTION
    annotate["max_chars"] = 1_000_000  # the server grades the text it is given: whole texts, so the test knows the grade
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def documents(out: Path) -> list[dict[str, Any]]:
    return [r for p in sorted((out / "docs").rglob("*.parquet")) for r in pq.read_table(p).to_pylist()]


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FakeOpenAI]:
    folder = tmp_path_factory.mktemp("recipe")
    pipeline = recipe_on_slices(folder)
    with FakeOpenAI(folder / "server") as server, pytest.MonkeyPatch.context() as mp:
        mp.setenv("DATAPIPE_LLM_ENDPOINT", server.url)
        res = CliRunner().invoke(main, ["run", str(pipeline), "--output", str(folder / "out"), "--in-process", "--no-progress"])
        assert res.exit_code == 0, res.output
    return folder / "out", server


def test_recipe_annotates_trains_and_buckets_the_corpus(recipe_run: tuple[Path, FakeOpenAI]) -> None:
    out, server = recipe_run
    docs = documents(out)
    assert len(docs) > 350  # langid keeps zh and en: nearly all of the 400
    # 1. annotate: the sampled documents carry the server's grade, the others say not_sampled
    sampled = [d for d in docs if d["llm_error"] != "not_sampled"]
    assert 0.4 < len(sampled) / len(docs) < 0.6
    for d in sampled:
        assert d["llm_error"] is None, (d["id"], d["llm_error_detail"])
        assert d["llm_edu_score"] == edu_answer(d["text"])["edu_score"], d["id"]
    assert all(d["llm_edu_score"] is None for d in docs if d["llm_error"] == "not_sampled")
    assert len({r["doc"] for r in server.rows()}) <= len(sampled)  # only the sample was asked
    # 2. the model: fitted in the run from the sampled grades, recorded in run.json
    model = out / "models" / "stage03-classify" / "edu.bin"
    meta = read_meta(model)
    assert meta is not None and meta["task"] == "regressor" and meta["source"] == "column llm_edu_score"
    assert meta["counts"]["labelled"] == len(sampled)
    recorded = json.loads((out / "run.json").read_text())["models"]["models/stage03-classify/edu.bin"]
    assert recorded["model_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    print("in-run model, held-out:", recorded["eval"])
    assert recorded["eval"]["spearman"] > 0.3, recorded["eval"]
    # 3. every document scored; the grades it never saw (the unsampled documents) are predicted
    scores = np.array([d["cls_edu_score"] for d in docs], np.float64)
    assert np.all((scores >= 0) & (scores <= 5))
    unseen = [d for d in docs if d["llm_error"] == "not_sampled"]
    rho = spearman(np.array([d["cls_edu_score"] for d in unseen]), np.array([edu_answer(d["text"])["edu_score"] for d in unseen]))
    print("in-run model, unsampled documents: Spearman", rho)
    assert rho is not None and rho > 0.4, rho
    # 4. buckets: per language and kind, 10 equal shares ordered by the score
    groups: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for d in docs:
        groups[(d["lang"], d["kind"])].append((d["cls_edu_score"], d["bucket_edu"]))
    assert set(groups) == {("zh", "text"), ("zh", "web"), ("en", "text")}, set(groups)
    for key, rows in groups.items():
        counts = Counter(b for _, b in rows)
        assert sorted(counts) == list(range(10)), (key, counts)
        assert max(counts.values()) - min(counts.values()) <= 1, (key, counts)
        ordered = [b for _, b in sorted(rows, key=lambda r: r[0])]
        assert ordered == sorted(ordered), key  # a higher score never has a lower bucket
    assert all(d["bucket_ensemble"] == d["bucket_edu"] for d in docs)  # one model: the ensemble is it


def test_train_classifier_from_labels_of_the_run(recipe_run: tuple[Path, FakeOpenAI], tmp_path: Path) -> None:
    out, _ = recipe_run
    docs = documents(out)
    unseen = [d for d in docs if d["llm_error"] == "not_sampled"]
    truth = np.array([edu_answer(d["text"])["edu_score"] for d in unseen])
    runner = CliRunner()
    small = [
        "--run",
        str(out),
        "--out-dir",
        str(tmp_path),
        "--epoch",
        "25",
        "--lr",
        "0.5",
        "--min-count",
        "1",
        "--heldout-frac",
        "0.2",
    ]
    # a number: a regressor, the same kind of model as the run's own
    res = runner.invoke(
        main,
        [
            "train-classifier",
            *small,
            "--name",
            "edu",
            "--labels",
            "select id, llm_edu_score from documents where llm_error is null",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "a regressor of llm_edu_score" in res.output and "Spearman" in res.output
    # the same rows, seed and settings as the run's own model: the same bytes (fitting is deterministic)
    assert (
        read_meta(tmp_path / "edu.bin")["model_sha256"]
        == read_meta(out / "models" / "stage03-classify" / "edu.bin")["model_sha256"]
    )  # type: ignore[index]
    clf = Classifier.load(tmp_path / "edu.bin")
    meta = read_meta(tmp_path / "edu.bin")
    pred = output_scores(meta, clf.labels, clf.scores([d["text"] for d in unseen]))[:, 0]
    rho = spearman(pred, truth)
    print("train-classifier --labels: regressor Spearman on unsampled documents", rho)
    assert rho is not None and rho > 0.4, rho
    # the classify stage with that file as its path reads from the meta that it is a regressor
    stage = Classify(ClassifyOptions(models={"edu": {"path": str(tmp_path / "edu.bin")}}), StageContext(".", "."))
    assert stage.output_columns(stage.options, CheckContext(tmp_path, frozenset())) == {"cls_edu_score"}
    stage.setup()
    batch = pa.table({"text": [d["text"] for d in unseen], "kind": [d["kind"] for d in unseen]})
    assert stage.compute(batch)["cls_edu_score"].to_pylist() == pytest.approx(list(pred), abs=1e-5)
    # a boolean: a classifier (true/false)
    res = runner.invoke(
        main,
        [
            "train-classifier",
            *small,
            "--name",
            "good",
            "--labels",
            "select id, llm_edu_score >= 1 as good from documents where llm_error is null",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "a classifier of good" in res.output
    clf = Classifier.load(tmp_path / "good.bin")
    assert sorted(clf.labels) == ["false", "true"]
    p_true = clf.scores([d["text"] for d in unseen])[:, clf.labels.index("true")]
    area = auc(p_true, truth >= 1)
    print("train-classifier --labels: classifier AUC on unsampled documents", area)
    assert area is not None and area > 0.7, area
    # mistakes, each named
    for query, says in (
        ("select llm_edu_score from documents", "no id column"),
        ("select id, llm_edu_score, lang from documents", "2 columns besides id"),
        ("select id, llm_edu_scor from documents", "SQL error"),
        (
            "select id, llm_edu_score from documents where llm_edu_score = 5 or llm_edu_score = 0 and lang = 'zh' limit 6",
            "too few labels",
        ),
    ):
        res = runner.invoke(main, ["train-classifier", *small, "--name", "bad", "--labels", query])
        assert res.exit_code != 0 and says in res.output, (query, res.output)


def test_a_resumed_combine_step_reuses_the_fitted_model(recipe_run: tuple[Path, FakeOpenAI]) -> None:
    out, server = recipe_run
    model = out / "models" / "stage03-classify" / "edu.bin"
    before = (model.stat().st_mtime_ns, documents(out))
    asked = len(server.rows())
    shutil.rmtree(out / "_work" / "markers" / "reduce0")  # as if the run had stopped before classify's combine step ended
    res = CliRunner().invoke(
        main, ["run", str(out.parent / "recipe.yaml"), "--output", str(out), "--in-process", "--no-progress"]
    )
    assert res.exit_code == 0, res.output
    assert (model.stat().st_mtime_ns, documents(out)) == before  # not fitted again; the same scores and buckets
    assert len(server.rows()) == asked  # and nothing asked again
