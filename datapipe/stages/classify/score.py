"""Scoring documents with the configured models in a worker: fastText models loaded at setup, a
transformers model on its first batch, one float32 column per model and scored label."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from datapipe.classify import transformer as tfm
from datapipe.classify.fit import REGRESSOR, SCORE, output_scores
from datapipe.classify.model import Classifier, column_name, predict_all, read_meta
from datapipe.stages.classify.options import ClassifyOptions, ModelSpec, bucket_problems, resolve
from datapipe.stages.columns import set_column


@dataclass
class TransformerModel:
    """A configured transformers model in a worker, loaded on its first batch (once per process:
    ``datapipe.classify.transformer``)."""

    path: Path
    spec: ModelSpec
    labels: list[str]

    def scores(self, texts: list[str]) -> np.ndarray:
        model = tfm.TransformerClassifier.load(self.path, self.spec.device or "auto")
        max_tokens = self.spec.max_tokens or tfm.default_max_tokens(tfm.read_config(self.path))
        return model.scores(texts, max_tokens, self.spec.batch_size or tfm.DEFAULT_BATCH_SIZE)


@dataclass
class Scorers:
    """The models of one stage, each with the (label index, column) pairs it writes."""

    models: list[tuple[str, Classifier | TransformerModel, list[tuple[int, str]]]] = field(default_factory=list)
    regressors: dict[str, dict[str, Any]] = field(default_factory=dict)  # model name -> meta, models trained as regressors

    @classmethod
    def load(cls, options: ClassifyOptions, pipeline_dir: str) -> Scorers:
        """The configured models (those trained in the run come with the combine step). fastText models
        load here; a transformers model on its first batch (``TransformerModel.scores``), so the phases
        that only apply this stage's decisions or rank its scores load no network onto a GPU."""
        out = cls()
        for name, spec in options.models.items():
            if spec.path is None:
                continue  # trained in the combine step
            path = resolve(spec.path, pipeline_dir)
            scorer: Classifier | TransformerModel
            if spec.model_kind(pipeline_dir) == "transformers":
                scorer = TransformerModel(path, spec, tfm.model_labels(tfm.read_config(path)))
            else:
                scorer = Classifier.load(path, spec.featuriser)
                meta = read_meta(scorer.path)
                if (meta or {}).get("task") == REGRESSOR:
                    out.regressors[name] = meta or {}
                    out.models.append((name, scorer, [(0, column_name(name, SCORE))]))
                    continue
            wanted = [lab.removeprefix("__label__") for lab in spec.labels] if spec.labels else scorer.labels
            missing = [lab for lab in wanted if lab not in scorer.labels]
            if missing:
                raise ValueError(
                    f"classify: models.{name}.labels: {', '.join(missing)} not labels of {path.name}; "
                    f"its labels: {', '.join(scorer.labels)}"
                )
            cols = [(scorer.labels.index(lab), column_name(name, lab)) for lab in wanted]
            out.models.append((name, scorer, cols))
        out.check_columns(options)
        return out

    def check_columns(self, options: ClassifyOptions) -> None:
        """A model too big to load at validation is checked here: a rule on a column no model writes
        would otherwise keep everything without a word."""
        produced = {col for _, _, cols in self.models for _, col in cols}
        problems = bucket_problems(options)
        if problems:
            raise ValueError(f"classify: {problems[0][0]}: {problems[0][1]}")
        for name, spec in options.models.items():
            if spec.path is None or name in self.regressors:
                continue
            if options.buckets is not None and column_name(name, spec.bucket_label) not in produced:
                raise ValueError(
                    f"classify: models.{name}.bucket_label: {spec.bucket_label!r} is not a scored label; "
                    f"scored: {', '.join(sorted(produced))}"
                )
        trained = tuple(f"cls_{n}_" for n, spec in options.models.items() if spec.path is None)
        for i, rule in enumerate(options.keep):
            if rule.score is not None and rule.score not in produced and not rule.score.startswith(trained or ("\0",)):
                raise ValueError(
                    f"classify: keep[{i}].score: {rule.score!r} is not a score column of this stage; "
                    f"allowed: {', '.join(sorted(produced))}"
                )

    def unscored(self, batch: pa.Table) -> pa.Table:
        """The batch with every score column null (a kind the stage does not apply to)."""
        n = batch.num_rows
        for _, _, cols in self.models:
            for _, col in cols:
                batch = set_column(batch, col, pa.nulls(n, pa.float32()))
        return batch

    def score(self, batch: pa.Table, texts: list[str]) -> pa.Table:
        """The batch with every model's score columns of ``texts`` (its texts, cut to max_chars)."""
        featurised: dict[str, list[str]] = {}  # fastText models sharing a featuriser share its output
        for name, clf, cols in self.models:
            if isinstance(clf, TransformerModel):
                scores = clf.scores(texts)
            else:
                if clf.featuriser not in featurised:
                    featurised[clf.featuriser] = clf.featurise(texts)
                scores = predict_all(clf.model, featurised[clf.featuriser], clf.labels)
                if name in self.regressors:
                    scores = output_scores(self.regressors[name], clf.labels, scores)
            for j, col in cols:
                batch = set_column(batch, col, pa.array(scores[:, j], pa.float32()))
        return batch
