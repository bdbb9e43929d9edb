"""Classify models trained inside the run: ``models.<name>.train`` (the annotate -> train -> classify recipe).

A model with ``train: {column: llm_edu_score}`` has no file before the run: the classify stage is
then global, and its combine step, with every shard's documents and their annotation columns in
hand, first fits a fastText model to the documents that have a label in that column (the annotate
stage's seeded sample; null elsewhere), then scores every document with it. A numeric column gives
a regressor (one score column ``cls_<model>_score``, the expected label), a string or boolean column
a classifier (``cls_<model>_<label>`` per class): ``datapipe.classify.fit``.

The model, its ``.meta.json`` (task, labels, bins, counts, held-out quality, the hash of the rows it
was fitted to) and ``.eval.json`` are written to the stage's folder of the run folder
(``<run>/models/stageNN-classify/<name>.bin``) and listed in run.json. Fitting is deterministic
(seeded, one thread, a fresh process), and a resumed run whose combine step runs again finds the
model there with the same rows' hash and reuses it instead of fitting again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field

from datapipe.classify.fit import FitParams, fit, load_uncached, model_outputs, output_scores, rows_key
from datapipe.classify.model import Classifier, column_name, read_meta
from datapipe.errors import DatapipeError, UsageError
from datapipe.stages.base import StageOptions


class TrainError(DatapipeError, ValueError):
    """A trained classify model cannot be fitted: its column is missing or has too few labels."""


class TrainSpec(StageOptions):
    column: str = Field(
        description="The column with each document's label, e.g. an annotation column llm_edu_score; documents "
        "where it is null (not sampled, no valid answer) are not trained on. Numbers train a regressor, "
        "strings and booleans a classifier."
    )
    seed: int = Field(0, description="Seed of the held-out choice and the training order (same rows and seed: same model).")
    heldout_frac: float = Field(
        0.1, ge=0.0, le=0.5, description="Share of the labelled documents held out and evaluated on, never trained on."
    )
    min_per_class: int = Field(
        5, ge=1, description="Training documents each class (or regressor bin) needs; a sparser bin is merged into its neighbour."
    )
    bins: int = Field(5, ge=2, le=100, description="A regressor's quantile bins for labels that are not a few integers.")
    featuriser: Literal["cjk-v1", "plain"] = Field("cjk-v1", description="How texts become fastText tokens.")
    dim: int = Field(64, ge=2, description="fastText vector size.")
    epoch: int = Field(25, ge=1, description="fastText passes over the training documents (small samples need many).")
    lr: float = Field(0.5, gt=0.0, description="fastText learning rate.")
    word_ngrams: int = Field(2, ge=1, description="fastText word n-grams (with cjk-v1: Han character bigrams too).")
    min_count: int = Field(1, ge=1, description="fastText: tokens seen fewer times are ignored.")
    bucket: int = Field(200_000, ge=1000, description="fastText hashed n-gram rows (memory: dim x bucket floats).")

    def params(self, max_chars: int) -> FitParams:
        return FitParams(
            seed=self.seed,
            heldout_frac=self.heldout_frac,
            min_per_class=self.min_per_class,
            bins=self.bins,
            max_chars=max_chars,
            featuriser=self.featuriser,
            dim=self.dim,
            epoch=self.epoch,
            lr=self.lr,
            word_ngrams=self.word_ngrams,
            min_count=self.min_count,
            bucket=self.bucket,
        )


@dataclass
class Trained:
    """A model fitted in the run: where it is, its meta, and the score columns it gives."""

    name: str
    clf: Classifier
    meta: dict[str, Any]
    columns: list[str]  # cls_<name>_<output>, in model_outputs order


def fit_in_run(name: str, spec: TrainSpec, files: list[str], kinds: list[str], max_chars: int, outputs_dir: str) -> Trained:
    """The model ``name`` fitted to the labelled documents of the map outputs ``files`` (or found fitted)."""
    key = f"models.{name}.train.column"
    ids: list[str] = []
    texts: list[str] = []
    labels: list[Any] = []
    for path in files:
        names = pq.read_schema(path).names
        if spec.column not in names:
            continue  # a shard without it (no document of a kind the annotate stage asks about)
        table = pq.read_table(path, columns=[c for c in ("id", "text", "kind", spec.column) if c in names])
        mask = pc.is_valid(table[spec.column])
        if "kind" in names:
            mask = pc.and_(mask, pc.is_in(table["kind"], value_set=pa.array(kinds)))
        table = table.filter(mask)
        ids += [str(i) for i in table["id"].to_pylist()]
        texts += [t or "" for t in table["text"].to_pylist()]
        labels += table[spec.column].to_pylist()
    if not labels:
        raise TrainError(
            f"classify: {key}: no document has a value in {spec.column!r} to train on",
            hint="an annotate stage before classify fills it (its sample: sample.fraction, sample.max_docs); "
            'check `datapipe sql RUN "select llm_error, count(*) from documents group by 1"` of an earlier run',
        )
    params = spec.params(max_chars)
    out = Path(outputs_dir) / f"{name}.bin"
    source = f"column {spec.column}"
    meta = read_meta(out) if out.is_file() else None
    if not (meta and meta.get("rows_key") == rows_key(ids, labels, params, source) and _sha(out) == meta.get("model_sha256")):
        try:
            meta = fit(ids, texts, labels, out, params, source=source, what=f"classify: {key}").meta
        except UsageError as exc:  # too few labels, one label per id: the user's to fix
            raise TrainError(str(exc), hint=exc.hint) from None
    clf = load_uncached(out, params.featuriser)
    return Trained(name, clf, meta, [column_name(name, o) for o in model_outputs(meta, clf.labels)])


def score_file(path: str, trained: list[Trained], kinds: list[str], max_chars: int) -> dict[str, np.ndarray]:
    """Every trained model's score columns for one shard's documents (NaN where the kind is not scored)."""
    names = pq.read_schema(path).names
    table = pq.read_table(path, columns=[c for c in ("text", "kind") if c in names])
    n = table.num_rows
    scored = np.ones(n, bool)
    if "kind" in names:
        scored = pc.fill_null(pc.is_in(table["kind"], value_set=pa.array(kinds)), False).to_numpy(zero_copy_only=False)
    idx = np.flatnonzero(scored)
    texts = pc.utf8_slice_codeunits(pc.fill_null(table["text"], ""), 0, max_chars).to_pylist()
    texts = [texts[i] for i in idx]
    out: dict[str, np.ndarray] = {}
    for t in trained:
        values = output_scores(t.meta, t.clf.labels, t.clf.scores(texts)) if len(idx) else np.zeros((0, len(t.columns)))
        for j, col in enumerate(t.columns):
            full = np.full(n, np.nan, np.float32)
            full[idx] = values[:, j]
            out[col] = full
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
