"""classify with Hugging Face models from a local folder: scores equal ``transformers`` called directly,
buckets and keep rules with a transformer in an ensemble with fastText, config errors naming the key,
GPU requests. The models are tiny BERTs with seeded random weights and a WordPiece tokenizer trained
here on real zh/en text (tests/support/tiny_transformer.py); nothing is downloaded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

pytest.importorskip("transformers", reason="the transformers extra is not installed")

from datapipe.audit.sql import run_query  # noqa: E402
from datapipe.classify import buckets as bk  # noqa: E402
from datapipe.classify import transformer as tfm  # noqa: E402
from datapipe.cli import main  # noqa: E402
from datapipe.engine.executors.ray.executor import fit_gpus  # noqa: E402
from datapipe.engine.phases import Phase, plan_phases  # noqa: E402
from datapipe.engine.plan import make_spec  # noqa: E402
from datapipe.engine.runner import run_pipeline  # noqa: E402
from datapipe.errors import PipelineError  # noqa: E402
from datapipe.pipeline.load import ConfigError, load_pipeline  # noqa: E402
from datapipe.stages.base import StageContext  # noqa: E402
from datapipe.stages.classify import Classify, ClassifyOptions  # noqa: E402
from tests.support.shared_data import shared_path  # noqa: E402
from tests.support.tiny_transformer import corpus_texts, save_model  # noqa: E402

MAX_TOKENS = 48
MAX_CHARS = 1500


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cls/ (labels lq, hq), reg/ (a regression head) and ft.bin (fastText, trained on real zh text)."""
    out = tmp_path_factory.mktemp("models")
    texts = corpus_texts(shared_path("corpus"), per_file=150)
    save_model(out / "cls", texts, ["lq", "hq"], seed=1, init_range=0.3)
    save_model(out / "reg", texts, None, seed=2, init_range=0.3)
    _centre_regressor(out / "reg", texts)
    corpus = shared_path("corpus")
    args = ["train-classifier", "--name", "ft", "--out-dir", str(out), "--dim", "8", "--epoch", "2", "--bucket", "5000"]
    args += ["--max-per-class", "60", "--heldout-frac", "0.1"]
    args += ["--positive", str(corpus / "zh_wikipedia.jsonl"), "--negative", str(corpus / "zh_oiwiki.jsonl")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return out


def _centre_regressor(folder: Path, texts: list[str]) -> None:
    """Shift the random regressor's bias so its median score on real text is 0: the pipeline's
    documents then score on both sides of 0 whatever the seeded weights give (negatives must be ranked)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    median = float(np.median(_direct(folder, texts[::5], regression=True)[:, 0]))
    with torch.no_grad():
        model.classifier.bias -= median
    model.save_pretrained(str(folder))


def _direct(folder: Path, texts: list[str], regression: bool) -> np.ndarray:
    """The model called through transformers on each text alone: no batching, no padding."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            logits = model(**tokenizer(text, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")).logits
            out.append((logits if regression else torch.softmax(logits, -1))[0].numpy())
    return np.array(out)


def _pipeline(tmp_path: Path, models: Path, classify: dict, docs: int = 24) -> Path:
    """Real documents, zh web (OI-wiki) and en text (Wikipedia's end, not the tokenizer's training head)."""
    sources = []
    for name, file, kind in (("zh", "zh_oiwiki.jsonl", "web"), ("en", "en_wikipedia.jsonl", "text")):
        lines = shared_path("corpus", file).read_text(encoding="utf-8").splitlines()[-docs:]
        data = tmp_path / f"{name}.jsonl"
        # every third text short (a few to ~40 tokens): batches mix lengths, so padding is masked for real
        cut = [4000 if i % 3 else 10 + 5 * i for i in range(len(lines))]
        data.write_text(
            "".join(json.dumps({"text": json.loads(x)["text"][:c]}, ensure_ascii=False) + "\n" for x, c in zip(lines, cut))
        )
        sources.append({"name": name, "kind": kind, "paths": [str(data)]})
    classify = {
        "models": {
            "tc": {"path": str(models / "cls"), "max_tokens": MAX_TOKENS, "batch_size": 5, "device": "auto"},
            "tr": {"path": str(models / "reg"), "max_tokens": MAX_TOKENS, "bucket_label": "score"},
            "ft": {"path": str(models / "ft.bin")},
        },
        "kinds": ["web", "text"],
        "max_chars": MAX_CHARS,
        **classify,
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "sources": sources, "stages": [{"classify": classify}]}))
    return path


def test_scores_equal_direct_transformers_and_an_ensemble_with_fasttext_buckets_and_keeps(models: Path, tmp_path: Path) -> None:
    # The score cut sits inside the random classifier's own range on these documents (its 85th
    # percentile, from transformers called directly), so some documents are over it whatever the weights.
    _pipeline(tmp_path, models, {})
    texts = [
        json.loads(line)["text"][:MAX_CHARS]
        for name in ("zh", "en")
        for line in (tmp_path / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    cut = float(np.quantile(_direct(models / "cls", texts, regression=False)[:, 1], 0.85))
    keep = [{"score": "cls_tc_hq", "max": cut}, {"bucket": "ensemble", "min": 1}]
    path = _pipeline(tmp_path, models, {"buckets": {"count": 4, "per": ["kind"], "ensemble": "mean"}, "keep": keep})
    out = tmp_path / "out"
    run_pipeline(load_pipeline(path), output=out, show_progress=False, log=lambda m: None, in_process=True)
    rows = run_query(
        out,
        "select d.id, d.kind, d.status, d.reason, d.cls_tc_hq, d.cls_tc_lq, d.cls_tr_score, d.cls_ft_hq, "
        "d.bucket_tc, d.bucket_tr, d.bucket_ft, d.bucket_ensemble from documents d order by d.id",
    ).to_pylist()
    assert len(rows) == 48
    ordered = [_text_of(r["id"], tmp_path) for r in rows]
    cls = _direct(models / "cls", ordered, regression=False)
    reg = _direct(models / "reg", ordered, regression=True)
    np.testing.assert_allclose([[r["cls_tc_lq"], r["cls_tc_hq"]] for r in rows], cls, atol=1e-5, rtol=0)
    np.testing.assert_allclose([r["cls_tr_score"] for r in rows], reg[:, 0], atol=1e-5, rtol=0)
    # the scores differ (the buckets rank something), and a regression score may be negative
    assert np.ptp(reg[:, 0]) > 0.1 and np.ptp(cls[:, 1]) > 0.05 and len({r["cls_ft_hq"] for r in rows}) > 24
    assert reg[:, 0].min() < 0

    for kind in ("web", "text"):
        group = [r for r in rows if r["kind"] == kind]
        for model, score in (("tc", "cls_tc_hq"), ("tr", "cls_tr_score"), ("ft", "cls_ft_hq")):
            sizes = np.bincount([r[f"bucket_{model}"] for r in group], minlength=4)
            assert sizes.max() - sizes.min() <= 1, (model, kind, sizes)
            ranked = sorted(group, key=lambda r: r[score])
            assert [r[f"bucket_{model}"] for r in ranked] == sorted(r[f"bucket_{model}"] for r in group)
    for r in rows:
        assert r["bucket_ensemble"] == (r["bucket_tc"] + r["bucket_tr"] + r["bucket_ft"]) // 3
        want = (
            "classifier:cls_tc_hq" if r["cls_tc_hq"] > cut else "classifier_bucket:ensemble" if r["bucket_ensemble"] < 1 else None
        )
        assert r["reason"] == want and r["status"] == ("kept" if want is None else "rejected"), r
    assert {r["reason"] for r in rows} == {"classifier:cls_tc_hq", "classifier_bucket:ensemble", None}
    # the report's histogram of the regression score spans its range (it may leave 0-1), every document in it
    page = tmp_path / "r.html"
    assert CliRunner().invoke(main, ["report", str(out), "--html", str(page)]).exit_code == 0
    section = page.read_text(encoding="utf-8").split("<code>cls_tr_score</code>")[1].split("<h3>")[0]
    lo, hi = min(r["cls_tr_score"] for r in rows), max(r["cls_tr_score"] for r in rows)
    assert f"<td>{lo:.2f}-" in section and f"-{hi:.2f}</td>" in section, section


def _text_of(doc_id: str, tmp_path: Path) -> str:
    """The text a document id names (``<source>/<file>#L<line>``, the JSONL reader's ids), cut as the stage cuts it."""
    source, _, line = doc_id.partition("/")[2].rpartition("#L")
    lines = (tmp_path / source).read_text(encoding="utf-8").splitlines()
    return json.loads(lines[int(line) - 1])["text"][:MAX_CHARS]


def test_buckets_rank_negative_regression_scores_in_order() -> None:
    scores = np.array([-3.0, -1.0, -2.5, 0.5, -0.0, 2.0, -5.0, 1.0, -1e-30, 0.0], np.float32)
    keys = bk.sort_keys(scores, bk.tie_keys([str(i) for i in range(len(scores))]))
    got = bk.rank_buckets(keys, np.zeros(len(scores), np.int64), 5)
    # two per bucket, by score: -5 -3 | -2.5 -1 | -1e-30 and one of the zeros (-0.0 ties 0.0) | 0.5 | 1 2
    assert got.tolist() in ([0, 1, 1, 3, 2, 4, 0, 4, 2, 3], [0, 1, 1, 3, 3, 4, 0, 4, 2, 2])


def test_one_load_per_process_and_regression_thresholds_may_be_negative(models: Path) -> None:
    a = tfm.TransformerClassifier.load(models / "reg", "cpu")
    b = tfm.TransformerClassifier.load(models / "reg", "auto" if not _has_cuda() else "cpu")
    assert a.model is b.model and a.labels == ["score"] and a.regression
    stage = Classify(
        ClassifyOptions(models={"r": {"path": str(models / "reg")}}, keep=[{"score": "cls_r_score", "min": -0.5}]),
        StageContext(".", "."),
    )
    stage.setup()
    import pyarrow as pa

    texts = [json.loads(x)["text"] for x in shared_path("corpus", "zh_wikipedia.jsonl").read_text().splitlines()[-6:]]
    batch = stage.compute(pa.table({"id": [str(i) for i in range(6)], "text": texts, "kind": ["web"] * 6}))
    reason = stage.decide(batch).reason.to_pylist()
    assert reason == ["classifier:cls_r_score" if s < -0.5 else None for s in batch["cls_r_score"].to_pylist()]


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.parametrize(
    ("model", "classify", "key", "message"),
    [
        ("missing", {}, "models.x.path", "model folder not found"),
        ("no_config", {}, "models.x.path", "has no config.json"),
        ("no_tokenizer", {}, "models.x.path", "has no tokenizer"),
        ("cls", {"featuriser": "cjk-v1"}, "models.x.featuriser", "is for fastText models"),
        ("ft.bin", {"max_tokens": 64}, "models.x.max_tokens", "is for transformers models"),
        ("ft.bin", {"device": "cuda"}, "models.x.device", "is for transformers models"),
        ("cls", {"max_tokens": 4096}, "models.x.max_tokens", "past the model's 128 positions"),
        ("cls", {"labels": ["good"]}, "models.x.labels[0]", "'good' is not a label of cls; its labels: lq, hq"),
        ("cls", {"device": "tpu"}, "models.x.device", "'auto', 'cpu' or 'cuda'"),
        ("reg", {"keep": [{"score": "cls_x_score", "min_percentile": 20}]}, "keep[0].min_percentile", "regression score"),
        ("cls", {"keep": [{"score": "cls_x_hq", "min": 1.5}]}, "keep[0].min", "bounds are probabilities"),
        ("cls", {"keep": [{"score": "cls_x_score", "min": 1}]}, "keep[0].score", "allowed: cls_x_hq, cls_x_lq"),
    ],
)
def test_config_errors_name_the_key(models: Path, tmp_path: Path, model: str, classify: dict, key: str, message: str) -> None:
    (tmp_path / "no_config").mkdir()
    (tmp_path / "no_tokenizer").mkdir()
    (tmp_path / "no_config" / "model.safetensors").write_bytes(b"")
    (tmp_path / "no_tokenizer" / "config.json").write_text((models / "cls" / "config.json").read_text())
    folder = models / model if (models / model).exists() else tmp_path / model
    keep = classify.pop("keep", [])
    config = {"models": {"x": {"path": str(folder), **classify}}, "keep": keep}
    path = tmp_path / "p.yaml"
    src = [{"name": "s", "kind": "web", "paths": [str(shared_path("corpus", "zh_oiwiki.jsonl"))]}]
    path.write_text(yaml.safe_dump({"name": "t", "sources": src, "stages": [{"classify": config}]}))
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert any(p.startswith(f"stages[0].classify.{key}") and message in p for p in info.value.problems), info.value.problems


def test_without_transformers_the_error_names_the_extra(models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    monkeypatch.setattr(tfm, "_LOADED", {})
    with pytest.raises(tfm.TransformerModelError) as info:
        tfm.TransformerClassifier.load(models / "cls", "cpu")
    assert "pip install 'datapipe[transformers]'" in (info.value.hint or "")


def test_gpu_requests(models: Path, tmp_path: Path) -> None:
    def stage(device: str | None) -> Classify:
        spec = {"path": str(models / "cls"), **({"device": device} if device else {})}
        return Classify(ClassifyOptions(models={"x": spec, "f": {"path": str(models / "ft.bin")}}), StageContext(".", "."))

    assert stage("cpu").task_resources().num_gpus == 0
    auto = stage(None).task_resources()
    assert (auto.num_gpus, auto.gpus_required) == (1.0, False)
    cuda = stage("cuda").task_resources()
    assert (cuda.num_gpus, cuda.gpus_required) == (1.0, True)

    # in a run: the map phase that scores asks for the GPU; the one applying the buckets' decisions does not
    path = _pipeline(tmp_path, models, {"buckets": {"count": 4}, "num_gpus": 0.5})
    phases = {p.name: p for p in plan_phases(make_spec(load_pipeline(path), tmp_path / "out", tmp_path / "cache"))}
    assert phases["map0"].resources["num_gpus"] == 0.5 and not phases["map0"].gpus_required
    assert "num_gpus" not in phases["map1"].resources and "num_gpus" not in phases["reduce0"].resources

    def phase(required: bool) -> Phase:
        return Phase("map_0", lambda: {}, (), {"num_cpus": 1, "num_gpus": 0.5}, "shards", required)

    assert fit_gpus(phase(False), 0) == {"num_cpus": 1}  # device: auto on a CPU cluster: CPU tasks
    assert fit_gpus(phase(False), 2) == {"num_cpus": 1, "num_gpus": 0.5}
    with pytest.raises(PipelineError, match="need a GPU"):
        fit_gpus(phase(True), 0)
    if not _has_cuda():
        with pytest.raises(tfm.TransformerModelError, match="device: cuda, but torch sees no GPU"):
            tfm.TransformerClassifier.load(models / "cls", "cuda")
