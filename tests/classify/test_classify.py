"""The classify stage and `datapipe train-classifier`, in process, on real text from ../shared/data.

A small model (dim 16, 3 epochs, a few hundred documents per class) is trained once per module
through the CLI; the tests check what it prints and saves against an independent evaluation,
that retraining gives the same bytes, and that the stage's scores are fastText's own.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from datapipe.classify.features import cjk_v1, plain
from datapipe.cli import main
from datapipe.engine.plan import make_spec
from datapipe.engine.tasks.reduce_inputs import ParquetReduceInputs
from datapipe.pipeline.load import ConfigError, load_pipeline
from datapipe.stages.base import StageContext
from datapipe.stages.classify import Classify, ClassifyOptions
from tests.support.shared_data import shared_path

SMALL = ["--dim", "16", "--epoch", "3", "--bucket", "20000", "--max-per-class", "250", "--heldout-frac", "0.2"]


def _train_args(out: Path, name: str, seed: int = 0) -> list[str]:
    corpus, en = shared_path("corpus"), shared_path("en")
    return [
        "train-classifier",
        "--name",
        name,
        "--out-dir",
        str(out),
        "--seed",
        str(seed),
        *SMALL,
        "--positive",
        str(corpus / "zh_wikipedia.jsonl"),
        "--positive",
        str(corpus / "en_wikipedia.jsonl"),
        "--negative",
        str(corpus / "zh_pingcap_docs.jsonl"),
        # no lang field in these: the langid model labels them
        "--negative",
        str(en / "datajuicer_redpajama-*.jsonl"),
        "--negative",
        str(en / "datajuicer_demo-*.jsonl"),
    ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("models")
    result = CliRunner().invoke(main, _train_args(out, "q"))
    assert result.exit_code == 0, result.output
    return out, result.output


def test_cjk_featuriser_splits_han_into_characters_and_lowercases_words() -> None:
    assert cjk_v1("数据管道，Hello World!\nＡＢＣ１２３") == "数 据 管 道 , hello world ! abc123"
    assert cjk_v1("中文𠀀字") == "中 文 𠀀 字"  # supplementary-plane Han too
    assert plain("A line\nand Another\tone") == "A line and Another\tone"  # only the newline goes


def test_training_writes_model_meta_eval_and_prints_the_saved_numbers(trained: tuple[Path, str]) -> None:
    out, printed = trained
    meta = json.loads((out / "q.meta.json").read_text())
    evaluation = json.loads((out / "q.eval.json").read_text())
    assert meta["featuriser"] == "cjk-v1" and sorted(meta["labels"]) == ["hq", "lq"]
    assert meta["params"]["thread"] == 1 and meta["seed"] == 0
    assert set(meta["counts"]) == {"zh", "en"}  # en negatives got their language from lid.176
    for lang, by_label in meta["counts"].items():  # balanced per language
        assert by_label["hq"]["train"] == by_label["lq"]["train"] > 0, lang
        assert by_label["hq"]["heldout"] == by_label["lq"]["heldout"] > 0, lang
    assert meta["counts"]["zh"]["hq"]["train"] + meta["counts"]["zh"]["hq"]["heldout"] == 250
    for lang, m in evaluation["per_lang"].items():
        line = next(x for x in printed.splitlines() if x.split()[:1] == [lang])
        shown = [float(v) for v in line.split()[3:7]]
        assert shown == pytest.approx([m["precision"], m["recall"], m["f1"], m["auc"]], abs=6e-4), line
    zh = evaluation["per_lang"]["zh"]
    assert zh["precision"] > 0.9 and zh["recall"] > 0.8 and zh["auc"] > 0.95  # Wikipedia vs TiDB docs: easy


def _record_text(file: str, line: int) -> str:
    with open(file, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            if n == line:
                return json.loads(raw)["text"]
    raise AssertionError(f"{file} has no line {line}")


def test_saved_model_reaches_the_saved_numbers_on_the_saved_heldout_ids(trained: tuple[Path, str]) -> None:
    """Independent of the trainer: fastText's own single-text predict, metrics by hand, AUC by pairs."""
    import fasttext

    out, _ = trained
    evaluation = json.loads((out / "q.eval.json").read_text())
    rows = [json.loads(x) for x in (out / "q.heldout.jsonl").read_text().splitlines()]
    model = fasttext.load_model(str(out / "q.bin"))
    by_lang: dict[str, list[tuple[float, bool]]] = {}
    for r in rows:
        labels, probs = model.predict(cjk_v1(_record_text(r["file"], r["line"])[:100_000]), k=-1)
        p = min(1.0, float(dict(zip(labels, probs))["__label__hq"]))
        by_lang.setdefault(r["lang"], []).append((p, r["label"] == "hq"))
    assert set(by_lang) == set(evaluation["per_lang"])
    for lang, pairs in by_lang.items():
        tp = sum(p >= 0.5 and y for p, y in pairs)
        fp = sum(p >= 0.5 and not y for p, y in pairs)
        fn = sum(p < 0.5 and y for p, y in pairs)
        pos = [p for p, y in pairs if y]
        neg = [p for p, y in pairs if not y]
        auc = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))
        saved = evaluation["per_lang"][lang]
        assert (saved["tp"], saved["fp"], saved["fn"]) == (tp, fp, fn), lang
        if tp + fp:
            assert saved["precision"] == pytest.approx(tp / (tp + fp))
        assert saved["recall"] == pytest.approx(tp / (tp + fn))
        assert saved["auc"] == pytest.approx(auc)


def test_same_seed_same_model_bytes(trained: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = trained
    again = CliRunner().invoke(main, _train_args(tmp_path, "q"))
    assert again.exit_code == 0, again.output
    assert (tmp_path / "q.bin").read_bytes() == (out / "q.bin").read_bytes()
    assert (tmp_path / "q.heldout.jsonl").read_text() == (out / "q.heldout.jsonl").read_text()
    other = CliRunner().invoke(main, _train_args(tmp_path, "q_seed1", seed=1))
    assert other.exit_code == 0, other.output
    assert (tmp_path / "q_seed1.bin").read_bytes() != (out / "q.bin").read_bytes()


def _stage(model: Path, **options) -> Classify:
    stage = Classify(ClassifyOptions(models={"q": {"path": str(model)}}, **options), StageContext(".", "."))
    stage.setup()
    return stage


def test_stage_scores_are_fasttexts_own_on_the_featurised_text(trained: tuple[Path, str], tmp_path: Path) -> None:
    import fasttext

    out, _ = trained
    lines = shared_path("corpus", "zh_oiwiki.jsonl").read_text(encoding="utf-8").splitlines()[:40]
    texts = [json.loads(x)["text"] for x in lines]
    texts += [json.loads(x)["text"] for x in shared_path("en", "datajuicer_arxiv.jsonl").read_text().splitlines()]
    batch = pa.table({"text": texts, "kind": ["web"] * len(texts)})
    scored = _stage(out / "q.bin", max_chars=3000).compute(batch)
    model = fasttext.load_model(str(out / "q.bin"))
    for label in ("hq", "lq"):
        direct = [min(1.0, float(dict(zip(*model.predict(cjk_v1(t[:3000]), k=-1)))[f"__label__{label}"])) for t in texts]
        assert scored[f"cls_q_{label}"].to_pylist() == pytest.approx(direct, abs=1e-6)
    # the same file without its meta: a model from elsewhere, given plain text
    shutil.copy(out / "q.bin", tmp_path / "foreign.bin")
    stage = _stage(tmp_path / "foreign.bin")
    assert stage.scorers["q"].featuriser == "plain"
    got = stage.compute(batch)["cls_q_hq"].to_pylist()
    direct = [min(1.0, float(dict(zip(*model.predict(t.replace("\n", " "), k=-1)))["__label__hq"])) for t in texts]
    assert got == pytest.approx(direct, abs=1e-6)
    # kinds outside `kinds` are left unscored (global mode sees every kind)
    code = _stage(out / "q.bin").compute(pa.table({"text": ["x = 1"], "kind": ["code"]}))
    assert code["cls_q_hq"].to_pylist() == [None]


def test_threshold_decision_names_the_column_and_value() -> None:
    stage = Classify.__new__(Classify)
    stage.options = ClassifyOptions(
        models={"q": {"path": "m.bin"}}, keep=[{"score": "cls_q_hq", "min": 0.5}, {"score": "cls_q_lq", "max": 0.9}]
    )
    batch = pa.table(
        {"cls_q_hq": pa.array([0.7, 0.2, 0.6, None], pa.float32()), "cls_q_lq": pa.array([0.3, 0.95, 0.95, None], pa.float32())}
    )
    d = stage.decide(batch)
    assert d.reason.to_pylist() == [None, "classifier:cls_q_hq", "classifier:cls_q_lq", None]  # first rule wins
    assert d.detail.to_pylist()[1] == "cls_q_hq=0.2 < 0.5" and d.detail.to_pylist()[2].endswith("> 0.9")


def test_percentile_reduce_cuts_per_language_and_kind(tmp_path: Path) -> None:
    """Global step: histogram cut-offs per (lang, kind), applied with the threshold rules."""
    rng = np.random.default_rng(0)
    n = 1000
    scores = rng.random(n).astype(np.float32)
    lang = np.where(np.arange(n) % 4 == 0, "en", "zh")
    files = []
    for i in range(2):  # two shards
        sl = slice(i * n // 2, (i + 1) * n // 2)
        path = tmp_path / f"s{i}.parquet"
        pq.write_table(
            pa.table(
                {
                    "id": [f"d{j}" for j in range(n)][sl],
                    "kind": ["web"] * (n // 2),
                    "lang": lang[sl].tolist(),
                    "cls_q_hq": scores[sl],
                }
            ),
            path,
        )
        files.append(str(path))
    stage = Classify.__new__(Classify)
    stage.options = ClassifyOptions(
        models={"q": {"path": "m.bin"}}, keep=[{"score": "cls_q_hq", "max": 0.99}, {"score": "cls_q_hq", "min_percentile": 30}]
    )
    assert Classify.global_for(stage.options)
    out = stage.reduce(ParquetReduceInputs(files, [0, 1], str(tmp_path)))
    dropped = dict(zip(out["id"].to_pylist(), out["reason"].to_pylist()))
    details = dict(zip(out["id"].to_pylist(), out["detail"].to_pylist()))
    for code in ("zh", "en"):
        group = np.flatnonzero(lang == code)
        cut = np.quantile(scores[group].astype(np.float64), 0.30)
        below = {f"d{j}" for j in group if scores[j] < cut - 1e-4}  # histogram cut-off: within one bucket
        above = {f"d{j}" for j in group if scores[j] >= cut and scores[j] <= 0.99}
        assert below <= set(dropped) and not (above & set(dropped)), code
        share = sum(1 for j in group if f"d{j}" in dropped and scores[j] <= 0.99) / len(group)
        assert 0.29 <= share <= 0.30
    top = next(f"d{j}" for j in range(n) if scores[j] > 0.99)
    assert details[top].startswith("cls_q_hq=") and details[top].endswith("> 0.99")
    low = next(i for i in dropped if "p30" in details[i])
    assert re.search(r"< 0\.\d{4} \(p30 of lang=(zh|en) kind=web, (250|750) docs\)", details[low])
    assert out["shard"].to_pylist() == sorted(out["shard"].to_pylist())


def test_validation_reports_missing_models_and_unknown_score_columns(trained: tuple[Path, str], tmp_path: Path) -> None:
    import yaml

    out, _ = trained
    src = [{"name": "s", "kind": "web", "paths": [str(shared_path("corpus", "zh_oiwiki.jsonl"))]}]
    stages = [
        {"langid": {"keep": ["zh"]}},
        {
            "classify": {
                "models": {"quality": {"path": "nope/quality.bin"}, "ok": {"path": str(out / "q.bin")}},
                "keep": [{"score": "cls_ok_good", "min": 0.5}, {"score": "cls_other_hq", "min": 0.5}],
            }
        },
    ]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "sources": src, "stages": stages}))
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    found = info.value.problems
    assert f"stages[1].classify.models.quality.path: file not found: {tmp_path / 'nope' / 'quality.bin'}" in found
    assert any(
        p.startswith(
            "stages[1].classify.keep[0].score: 'cls_ok_good' is not a score column of model ok; allowed: cls_ok_hq, cls_ok_lq"
        )
        for p in found
    ), found
    assert any(p.startswith("stages[1].classify.keep[1].score: 'cls_other_hq'") for p in found), found


def test_a_percentile_rule_makes_the_stage_global_a_threshold_does_not(trained: tuple[Path, str], tmp_path: Path) -> None:
    import yaml

    out, _ = trained
    src = [{"name": "s", "kind": "web", "paths": [str(shared_path("corpus", "zh_oiwiki.jsonl"))]}]
    for keep, n_segments in (([{"score": "cls_q_hq", "min": 0.5}], 1), ([{"score": "cls_q_hq", "min_percentile": 10}], 2)):
        path = tmp_path / "p.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": "t",
                    "sources": src,
                    "stages": [{"classify": {"models": {"q": {"path": str(out / "q.bin")}}, "keep": keep}}],
                }
            )
        )
        spec = make_spec(load_pipeline(path), tmp_path / "out", tmp_path / "cache")
        assert len(spec.segments) == n_segments


def test_examples_from_parquet_text_and_jsonl_files_with_ids_relative_to_the_glob(tmp_path: Path) -> None:
    from datapipe.train.classifier import examples_from_files

    (tmp_path / "d").mkdir()
    pq.write_table(
        pa.table({"body": ["维基百科是一部自由的百科全书。", None, "  "], "lang": ["zh", "zh", "zh"]}),
        tmp_path / "d" / "a.parquet",
    )
    (tmp_path / "d" / "b.txt").write_text("first line\n\nsecond line\n")
    (tmp_path / "d" / "c.jsonl").write_text(json.dumps({"body": "x", "lang": "en"}) + "\nnot json\n")
    got = list(examples_from_files(str(tmp_path / "d" / "*"), text_field="body"))
    assert [(e.id, e.text, e.lang, e.line) for e in got] == [
        ("a.parquet#0", "维基百科是一部自由的百科全书。", "zh", 0),
        ("b.txt#L1", "first line", None, 1),
        ("b.txt#L3", "second line", None, 3),
        ("c.jsonl#L1", "x", "en", 1),
    ]
    with pytest.raises(FileNotFoundError):
        list(examples_from_files(str(tmp_path / "nothing*.jsonl")))
