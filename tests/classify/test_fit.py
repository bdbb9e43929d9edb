"""Fitting a model to one label per document (datapipe.classify.fit): bins, the task from the
label's type, the errors, and the classify stage's `train:` model spec at validation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from datapipe.classify.fit import FitParams, expected_values, fit, make_bins, spearman, task_of
from datapipe.errors import UsageError
from datapipe.pipeline.load import ConfigError, load_pipeline
from tests.support.shared_data import shared_path


def test_task_follows_the_labels_type() -> None:
    assert task_of([0, 3, None, 5]) == "regressor"
    assert task_of([0.5, 1]) == "regressor"
    assert task_of([True, False]) == "classifier"  # a bool is an int in Python, but a class here
    assert task_of(["a", "b"]) == "classifier"


def test_grade_bins_merge_sparse_grades_into_their_neighbour() -> None:
    labels = np.array([0] * 40 + [1] * 20 + [2] * 6 + [3] * 2 + [4] * 1 + [5] * 1, np.float64)
    names, edges, centres = make_bins(labels, FitParams(min_per_class=5))
    which = np.digitize(labels, edges, right=True)
    counts = np.bincount(which)
    assert len(names) == len(centres) == 3 and counts.min() >= 5, (edges, counts)
    assert list(centres[:2]) == [0.0, 1.0]  # the common grades keep their own bin
    assert centres[2] == pytest.approx(labels[labels >= 2].mean())  # 2, 3, 4, 5: one bin, their mean
    # continuous labels: quantile bins, each centred on its labels' mean
    x = np.linspace(0, 1, 100)
    names, edges, centres = make_bins(x, FitParams(bins=4))
    assert len(names) == 4 and np.all(np.diff(centres) > 0)


def test_expected_value_and_spearman() -> None:
    probs = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 2.0]])  # rows are renormalised
    assert list(expected_values(probs, np.array([0.0, 4.0]))) == [0.0, 2.0, 4.0]
    assert spearman(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == pytest.approx(1.0)
    assert spearman(np.array([1, 2, 3]), np.array([5, 5, 5])) is None


def _wiki(n: int) -> list[str]:
    with open(shared_path("corpus", "en_wikipedia.jsonl"), encoding="utf-8") as fh:
        return [json.loads(next(fh))["text"] for _ in range(n)]


def test_fit_refuses_too_few_labels_and_two_labels_for_one_id(tmp_path: Path) -> None:
    texts = _wiki(12)
    ids = [f"d{i}" for i in range(12)]
    with pytest.raises(UsageError, match=r"too few labels.*true: 1"):
        fit(ids, texts, [False] * 11 + [True], tmp_path / "m.bin", FitParams(heldout_frac=0.0), "t")
    with pytest.raises(UsageError, match="id 'd0' has more than one label"):
        fit(["d0", *ids[1:], "d0"], [*texts, texts[0]], [0] * 13, tmp_path / "m.bin", FitParams(), "t")
    assert not (tmp_path / "m.bin").exists()


def test_fitted_classifier_learns_words_and_is_deterministic(tmp_path: Path) -> None:
    texts = _wiki(120)
    labels = ["born" in t for t in texts]  # a label the words say
    ids = [f"d{i}" for i in range(len(texts))]
    small = FitParams(heldout_frac=0.25, dim=16, bucket=20_000)
    a = fit(ids, texts, labels, tmp_path / "a.bin", small, "t")
    b = fit(ids, texts, labels, tmp_path / "b.bin", small, "t")
    assert a.meta["task"] == "classifier" and sorted(a.meta["labels"]) == ["false", "true"]
    assert a.meta["model_sha256"] == b.meta["model_sha256"]
    assert a.evaluation["heldout"] == 30 and a.evaluation["accuracy"] > 0.7, a.evaluation
    assert json.loads((tmp_path / "a.eval.json").read_text())["heldout_ids"] == a.evaluation["heldout_ids"]


def test_validation_names_a_train_column_no_stage_writes(tmp_path: Path) -> None:
    src = [{"name": "s", "kind": "web", "paths": [str(shared_path("corpus", "zh_oiwiki.jsonl"))]}]
    annotate = {
        "model": "m",
        "endpoint": "http://127.0.0.1:9/v1",
        "prompt": "{{text}}",
        "output_schema": {"type": "object", "properties": {"edu_score": {"type": "integer"}}, "required": ["edu_score"]},
    }
    stages = [
        {"annotate": annotate},
        {
            "classify": {
                "models": {"edu": {"train": {"column": "llm_edu_scor"}}, "both": {"path": "x.bin", "train": {"column": "x"}}}
            }
        },
    ]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "sources": src, "stages": stages}))
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    text = "\n".join(info.value.problems)
    assert "models.both" in text and "give path (a model file or folder) or train" in text, text
    stages[1] = {"classify": {"models": {"edu": {"train": {"column": "llm_edu_scor"}}}}}
    path.write_text(yaml.safe_dump({"name": "t", "sources": src, "stages": stages}))
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert any(
        p.startswith("stages[1].classify.models.edu.train.column: 'llm_edu_scor' is no column an earlier stage writes")
        and "llm_edu_score" in p
        for p in info.value.problems
    ), info.value.problems
    stages[1] = {"classify": {"models": {"edu": {"train": {"column": "llm_edu_score"}}}}}
    path.write_text(yaml.safe_dump({"name": "t", "sources": src, "stages": stages}))
    assert load_pipeline(path).name == "t"  # the annotation column: valid, with no model file yet
