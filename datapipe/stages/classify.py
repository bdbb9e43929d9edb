"""Model-based quality scoring: fastText classifiers or Hugging Face models given by path, one score
column per model and label.

Signals: ``cls_<model>_<label>`` (float32), the probability the model gives the label, for
every label of the model (or the ones listed under ``labels``); a transformers regression model's
one output is ``cls_<model>_score``. fastText texts are featurised as the model was trained
(``datapipe.classify.features``; ``plain`` for a model from elsewhere); a transformers model (a
folder, ``datapipe.classify.transformer``) has its own tokenizer, and runs on a GPU where the worker
has one (its map tasks then ask Ray for ``num_gpus``: ``Classify.task_resources``).

Keep rules, checked in order, the first failing one names the drop (reason
``classifier:<column>``):

- ``min`` / ``max``: a fixed threshold on the score (a per-document decision);
- ``min_percentile: P``: keep a document whose score is at least the P-th percentile of the
  scores of its group (``per``: lang and kind by default) over the whole run. That needs the
  whole run's scores first, so with such a rule the stage is global: the map phase computes
  the scores, the reduce builds one histogram of ``bins`` buckets per group and rule (memory:
  groups x bins counts, whatever the corpus size) and turns it into cut-offs, then drops what
  is below them. The cut-off is the lower edge of the bucket holding the percentile, so
  at most P% of a group is dropped (less by at most that bucket's share).

With ``buckets`` (several models, Nemotron-CC style) each model's score of its ``bucket_label``
becomes a corpus-wide percentile bucket per group, ``bucket_<model>`` (int16, 0 .. count-1, exact
ranks: ``datapipe.classify.buckets``), and an ensemble rule gives one more, ``bucket_<name>``; keep
rules with ``bucket:`` bound them (reason ``classifier_bucket:<name>``). The stage is then global:
the combine step ranks the scores and judges every rule, and ``apply`` adds the bucket columns and
drops what failed, so kept and dropped documents alike carry their buckets.

Without a percentile rule or buckets the stage is an ordinary per-document stage (no extra phase).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from datapipe.classify import buckets as bk
from datapipe.classify import transformer as tfm
from datapipe.classify.fit import REGRESSOR, SCORE, output_scores
from datapipe.classify.model import Classifier, column_name, meta_path, predict_all, read_meta
from datapipe.stages import classify_report
from datapipe.stages.base import CheckContext, Decision, Problem, ResourceFile, Resources, StageOptions, kinds_problems
from datapipe.stages.classify_train import Trained, TrainError, TrainSpec, fit_in_run, score_file
from datapipe.stages.columns import set_column
from datapipe.stages.global_stage import (
    CombineStep,
    GlobalStage,
    GlobalStep,
    MayBeGlobal,
    ReduceInputs,
    no_drops,
    state_rows,
)
from datapipe.stages.report_section import Aggregate, ReportSection
from datapipe.stages.row_keys import row_keys as make_row_keys

_NULL = pa.scalar(None, pa.string())
LOAD_LABELS_MAX_BYTES = 64 << 20  # validation reads a model's labels by loading it only below this size


class ModelSpec(StageOptions):
    path: str | None = Field(
        None,
        description="A fastText model file (.bin or .ftz) or a Hugging Face model folder "
        "(config.json, weights, tokenizer), relative to the pipeline file.",
    )
    train: TrainSpec | None = Field(
        None,
        description="Instead of path: a fastText model trained in the run, on the labels of an earlier stage's column "
        "(the annotate -> train -> classify recipe; makes the stage global).",
    )
    kind: Literal["auto", "fasttext", "transformers"] = Field(
        "auto", description="The model's kind: auto takes a folder for transformers and a file for fastText."
    )
    featuriser: Literal["auto", "plain", "cjk-v1"] = Field(
        "auto", description="fastText: how texts become tokens: auto reads the model's NAME.meta.json (plain without one)."
    )
    labels: list[str] | None = Field(
        None, description="Labels to record a score column for (default: all; a regression model's one is score)."
    )
    bucket_label: str = Field(
        "hq",
        description="With buckets: the label whose score is ranked into this model's bucket_<model> (a regressor's "
        "score whatever this says).",
    )
    max_tokens: int | None = Field(
        None, ge=2, description="transformers: tokens of each text the model reads, special tokens included (default 512)."
    )
    batch_size: int | None = Field(None, ge=1, le=4096, description="transformers: texts per forward pass (default 32).")
    device: Literal["auto", "cpu", "cuda"] | None = Field(
        None, description="transformers: auto (default: a GPU where the node has one), cpu, or cuda (a GPU or an error)."
    )

    @model_validator(mode="after")
    def _path_or_train(self) -> ModelSpec:
        if (self.path is None) == (self.train is None):
            raise ValueError("give path (a model file or folder) or train (a model trained in the run), one of them")
        if self.train is not None and self.kind == "transformers":
            raise ValueError("train makes a fastText model; kind: transformers needs a path")
        return self

    def model_kind(self, pipeline_dir: Path | str) -> str:
        """fasttext or transformers: ``kind``, or with auto what the path is: a folder is a transformers
        model, a file a fastText one; a missing path by its name (.bin or .ftz: fastText); a model
        trained in the run is a fastText one."""
        if self.kind != "auto":
            return self.kind
        if self.path is None:
            return "fasttext"
        path = _resolve(self.path, pipeline_dir)
        if path.exists():
            return "transformers" if path.is_dir() else "fasttext"
        return "fasttext" if path.suffix in (".bin", ".ftz") else "transformers"

    def spec_problems(self, key: str, pipeline_dir: Path | str) -> list[Problem]:
        """Options given to the wrong kind of model (key: ``models.<name>``)."""
        if self.model_kind(pipeline_dir) == "transformers":
            return [(f"{key}.featuriser", "is for fastText models; a transformers model has its tokenizer")] * (
                self.featuriser != "auto"
            )
        return [
            (f"{key}.{k}", f"is for transformers models; {self.path or 'a trained model'} is a fastText model (kind: fasttext)")
            for k in ("max_tokens", "batch_size", "device")
            if getattr(self, k) is not None
        ]


class KeepRule(StageOptions):
    score: str | None = Field(None, description="Score column, cls_<model>_<label> (or give bucket).")
    bucket: str | None = Field(None, description="Instead of score: a bucket, a model's name or the ensemble's (needs buckets).")
    min: float | None = Field(
        None, description="Drop documents scoring below this (a probability or a regression score; with bucket, a bucket number)."
    )
    max: float | None = Field(
        None, description="Drop documents scoring above this (a probability or a regression score; with bucket, a bucket number)."
    )
    min_percentile: float | None = Field(
        None, gt=0.0, lt=100.0, description="Drop documents below this percentile of their group's scores."
    )
    per: list[Literal["lang", "kind", "source"]] = Field(
        ["lang", "kind"], description="Columns whose values form the groups of min_percentile."
    )

    @model_validator(mode="after")
    def _one_bound(self) -> KeepRule:
        if (self.score is None) == (self.bucket is None):
            raise ValueError("give score (a score column) or bucket (a bucket name), one of them")
        if self.min is None and self.max is None and self.min_percentile is None:
            raise ValueError("give min, max and/or min_percentile")
        # A score rule's bounds are checked against its column in Classify.check: a probability is
        # 0 to 1, a regression model's score any number.
        if self.bucket is not None:
            if self.min_percentile is not None:
                raise ValueError("min_percentile is for score rules; a bucket is a percentile already: use min")
            for key, v in (("min", self.min), ("max", self.max)):
                if v is not None and (v < 0 or not float(v).is_integer()):
                    raise ValueError(f"{key}: {v:g} is not a bucket number; buckets are 0, 1, ... count-1")
        return self


class BucketOptions(StageOptions):
    count: int = Field(20, ge=2, le=10_000, description="Buckets per model: percentiles 0 .. count-1 of each group.")
    per: list[Literal["lang", "kind", "source"]] = Field(
        ["lang", "kind"], description="Columns whose values form the groups ranked separately."
    )
    ensemble: Literal["max", "mean", "weighted"] = Field(
        "max", description="How the models' buckets make the ensemble bucket: the highest, the mean or weights."
    )
    weights: dict[str, float] | None = Field(
        None, description="With ensemble: weighted: model name -> weight, one for every model, summing to 1."
    )
    name: str = Field("ensemble", description="The ensemble's name: its column is bucket_<name>.")
    rank_ensemble: bool = Field(
        False,
        description="Rank the ensemble's value into equal percentile buckets per group (else: rounded down).",
    )


class ClassifyOptions(StageOptions):
    models: dict[str, ModelSpec] = Field(min_length=1, description="Name (in column names) -> model.")
    keep: list[KeepRule] = Field([], description="Keep rules on score columns or buckets; none: score only.")
    kinds: list[str] = Field(["web", "paper", "text"], description="Source kinds the stage applies to.")
    max_chars: int = Field(100_000, ge=100, description="Characters of each document the models read.")
    bins: int = Field(10_000, ge=10, le=1_000_000, description="Histogram buckets per group for percentiles.")
    buckets: BucketOptions | None = Field(
        None, description="Corpus-wide percentile buckets per model and an ensemble bucket (makes the stage global)."
    )
    num_gpus: float = Field(
        1.0, gt=0.0, le=8.0, description="With a transformers model on a GPU: GPUs each task asks Ray for (0.25: four share one)."
    )

    run_settings: ClassVar[frozenset[str]] = frozenset({"num_gpus"})  # where the work runs, not what it computes

    @model_validator(mode="after")
    def _names(self) -> ClassifyOptions:
        bad = [n for n in self.models if not re.fullmatch(r"[a-z0-9_]+", n)]
        if bad:
            raise ValueError(f"model names name columns: use a-z, 0-9 and _ only ({', '.join(bad)})")
        return self


def bucket_column(name: str) -> str:
    return f"bucket_{name}"


def bucket_problems(o: ClassifyOptions) -> list[Problem]:
    """Problems of the buckets section and of the bucket keep rules, each with its key path."""
    problems: list[Problem] = []
    b = o.buckets
    names = [*o.models, b.name] if b is not None else []
    if b is not None:
        if not re.fullmatch(r"[a-z0-9_]+", b.name):
            problems.append(("buckets.name", f"{b.name!r} names a column: use a-z, 0-9 and _ only"))
        if b.name in o.models:
            problems.append(("buckets.name", f"{b.name!r} is also a model's name; the ensemble needs its own"))
        if b.ensemble == "weighted":
            if b.weights is None:
                problems.append(("buckets.weights", "ensemble: weighted needs weights, model name -> weight"))
            else:
                problems += [(f"buckets.{k}", m) for k, m in bk.weight_problems(b.weights, list(o.models))]
        elif b.weights is not None:
            problems.append(("buckets.weights", f"weights are for ensemble: weighted (this is {b.ensemble})"))
    for i, rule in enumerate(o.keep):
        if rule.bucket is None:
            continue
        if b is None:
            problems.append((f"keep[{i}].bucket", "a bucket rule needs buckets (buckets: {count: 20})"))
        elif rule.bucket not in names:
            problems.append((f"keep[{i}].bucket", f"{rule.bucket!r} is not a bucket; allowed: {', '.join(names)}"))
        else:
            for key, v in (("min", rule.min), ("max", rule.max)):
                if v is not None and v > b.count - 1:
                    problems.append((f"keep[{i}].{key}", f"{v:g} is past the last bucket, {b.count - 1}"))
    return problems


def _train_problems(o: ClassifyOptions, context: CheckContext) -> list[Problem]:
    """A trained model's label column must be one an earlier stage writes (where their columns are known)."""
    trained = {name: spec.train for name, spec in o.models.items() if spec.train is not None}
    if not trained:
        return []
    from datapipe.schema import BASE_SCHEMA
    from datapipe.stages import STAGES  # late: the registry imports this module

    known: set[str] = set(BASE_SCHEMA.names)
    for kind, before in context.before:
        cols = STAGES[kind].output_columns(before, context)
        if cols is None:
            return []  # a stage whose columns cannot be known: any name may be right
        known |= cols
    return [
        (
            f"models.{name}.train.column",
            f"{t.column!r} is no column an earlier stage writes; known: {', '.join(sorted(known)) or 'none'} "
            f"(an annotate stage before classify writes <prefix>_<property>)",
        )
        for name, t in trained.items()
        if t.column not in known
    ]


def _resolve(path: str, base: Path | str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base) / p


def model_labels(path: Path) -> list[str] | None:
    """A fastText model's labels from its meta file, else by loading it when small; None when not known cheaply."""
    meta = read_meta(path)
    if meta and isinstance(meta.get("labels"), list):
        return [str(x) for x in meta["labels"]]
    if path.stat().st_size <= LOAD_LABELS_MAX_BYTES:  # loaded and let go: validation must not hold models
        import fasttext

        from datapipe.classify.model import LABEL_PREFIX

        fasttext.FastText.eprint = lambda *a, **k: None
        return [lab.removeprefix(LABEL_PREFIX) for lab in fasttext.load_model(str(path)).get_labels()]
    return None


def _transformer_labels(key: str, spec: ModelSpec, path: Path) -> tuple[list[str] | None, list[Problem]]:
    """A transformers model's score labels from its config.json, and the problems of its folder and options."""
    problem = tfm.folder_problem(path)
    if problem is not None:
        return None, [(f"{key}.path", problem)]
    try:
        config = tfm.read_config(path)
    except (ValueError, tfm.TransformerModelError) as exc:
        return None, [(f"{key}.path", f"cannot read {path / 'config.json'}: {exc}")]
    problems: list[Problem] = []
    longest = tfm.max_positions(config)
    if longest is not None and spec.max_tokens is not None and spec.max_tokens > longest:
        problems.append((f"{key}.max_tokens", f"{spec.max_tokens} is past the model's {longest} positions"))
    return tfm.model_labels(config), problems


@dataclass
class _TransformerModel:
    """A configured transformers model in a worker, loaded on its first batch (once per process:
    ``datapipe.classify.transformer``)."""

    path: Path
    spec: ModelSpec
    labels: list[str]

    def scores(self, texts: list[str]) -> np.ndarray:
        model = tfm.TransformerClassifier.load(self.path, self.spec.device or "auto")
        max_tokens = self.spec.max_tokens or tfm.default_max_tokens(tfm.read_config(self.path))
        return model.scores(texts, max_tokens, self.spec.batch_size or tfm.DEFAULT_BATCH_SIZE)


class Classify(MayBeGlobal, GlobalStage):
    name = "classify"
    Options = ClassifyOptions
    resources = Resources(num_cpus=1, memory_mb=500)
    repeatable = True

    @classmethod
    def global_for(cls, options: Any) -> bool:
        """Global for percentiles, buckets and a model trained on the run; per document otherwise."""
        return (
            options.buckets is not None
            or any(r.min_percentile is not None for r in options.keep)
            or any(spec.train is not None for spec in options.models.values())
        )

    def task_resources(self) -> Resources:
        """A GPU per task (``num_gpus``) where a transformers model may run on one: required with
        ``device: cuda``, with ``auto`` only where the Ray cluster has GPUs."""
        devices = {
            spec.device or "auto"
            for spec in self.options.models.values()
            if spec.model_kind(self.context.pipeline_dir) == "transformers"
        }
        devices.discard("cpu")
        if not devices:
            return self.resources
        return replace(self.resources, num_gpus=self.options.num_gpus, gpus_required="cuda" in devices)

    @classmethod
    def check(cls, options: Any, context: CheckContext) -> list[Problem]:
        o: ClassifyOptions = options
        problems = kinds_problems(o.kinds)
        columns: dict[str, set[str] | None] = {}  # model name -> its score columns (None: unknown)
        regression: set[str] = set()  # score columns that are not probabilities
        problems += _train_problems(o, context)
        for name, spec in o.models.items():
            key = f"models.{name}"
            if spec.path is None:
                problems += spec.spec_problems(key, context.pipeline_dir)
                continue  # trained in the run: its labels are known once it is (_train_problems)
            path = _resolve(spec.path, context.pipeline_dir)
            problems += spec.spec_problems(key, context.pipeline_dir)
            if spec.model_kind(context.pipeline_dir) == "transformers":
                labels, found = _transformer_labels(key, spec, path)
                problems += found
                if labels is None:
                    continue
                if labels == [tfm.REGRESSION_LABEL]:
                    regression.add(column_name(name, tfm.REGRESSION_LABEL))
            else:
                if not path.is_file():
                    problems.append((f"{key}.path", f"file not found: {path}"))
                    continue
                try:
                    labels = model_labels(path)
                except Exception as exc:  # fastText raises ValueError or RuntimeError on a bad file
                    problems.append((f"{key}.path", f"cannot load {path} as a fastText model: {exc}"))
                    continue
                if labels is None:
                    columns[name] = None
                    continue
            for i, lab in enumerate(spec.labels or []):
                if lab.removeprefix("__label__") not in labels:
                    problems.append(
                        (f"{key}.labels[{i}]", f"{lab!r} is not a label of {path.name}; its labels: {', '.join(labels)}")
                    )
            if (read_meta(path) or {}).get("task") == REGRESSOR:  # one column, whatever its bins
                columns[name] = {column_name(name, SCORE)}
                regression.add(column_name(name, SCORE))
                continue
            wanted = [lab.removeprefix("__label__") for lab in spec.labels] if spec.labels else labels
            scored = {column_name(name, lab) for lab in wanted}
            columns[name] = scored
            if o.buckets is not None and column_name(name, spec.bucket_label) not in scored:
                problems.append(
                    (
                        f"{key}.bucket_label",
                        f"{spec.bucket_label!r} is not a scored label of {path.name}; scored: {', '.join(wanted)}",
                    )
                )
        problems += bucket_problems(o)
        for i, rule in enumerate(o.keep):
            if rule.score is None:
                continue  # a bucket rule: bucket_problems
            owner = next((n for n in o.models if rule.score.startswith(f"cls_{n}_")), None)
            if owner is None:
                problems.append(
                    (
                        f"keep[{i}].score",
                        f"{rule.score!r} is not a score column of this stage; "
                        f"columns are cls_<model>_<label> for models "
                        f"{', '.join(o.models)}",
                    )
                )
            elif columns.get(owner) is not None and rule.score not in columns[owner]:  # type: ignore[operator]
                problems.append(
                    (
                        f"keep[{i}].score",
                        f"{rule.score!r} is not a score column of model {owner}; "
                        f"allowed: {', '.join(sorted(columns[owner] or []))}",
                    )
                )
            elif rule.score in regression:
                if rule.min_percentile is not None:
                    problems.append(
                        (
                            f"keep[{i}].min_percentile",
                            f"{rule.score} is a regression score, not a probability; rank it with buckets "
                            "(buckets: {count: 20}, bucket_label: score) and a bucket rule",
                        )
                    )
            else:
                for bound, v in (("min", rule.min), ("max", rule.max)):
                    if v is not None and not 0.0 <= v <= 1.0:
                        problems.append(
                            (f"keep[{i}].{bound}", f"{v:g} is not 0 to 1; a score rule's bounds are probabilities here")
                        )
        return problems

    @classmethod
    def aggregates(cls, columns: set[str]) -> list[Aggregate]:
        return classify_report.aggregates(columns)

    @classmethod
    def report_sections(cls, columns: set[str]) -> list[ReportSection]:
        return classify_report.report_sections(columns)

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        out: set[str] = set()
        for name, spec in options.models.items():
            if spec.path is None:
                return None  # trained in the run: its labels are not known before
            path = _resolve(spec.path, context.pipeline_dir)
            if spec.model_kind(context.pipeline_dir) == "transformers":
                labels = spec.labels or (tfm.model_labels(tfm.read_config(path)) if tfm.folder_problem(path) is None else None)
            else:
                meta = read_meta(path) if path.is_file() else None
                labels = [SCORE] if (meta or {}).get("task") == REGRESSOR else spec.labels or (meta or {}).get("labels")
            if not labels:
                return None
            out |= {column_name(name, lab) for lab in labels}
        if options.buckets is not None:
            out |= {bucket_column(n) for n in [*options.models, options.buckets.name]}
        return out

    @classmethod
    def resource_files(cls, options: Any, pipeline_dir: Path) -> list[ResourceFile]:
        files = []
        for name, spec in options.models.items():
            if spec.path is None:
                continue  # trained from the run's own documents: its identity is the options'
            path = _resolve(spec.path, pipeline_dir)
            if spec.model_kind(pipeline_dir) == "transformers":
                # the weights, config and tokenizer decide the scores: each file is part of the run's identity
                files += [
                    ResourceFile(f, "model", key=f"{name}/{f.name}", content=False)
                    for f in sorted(path.iterdir())
                    if f.is_file() and not f.name.startswith(".")
                ]
                continue
            files.append(ResourceFile(path, "model", key=name, content=False))
            if meta_path(path).is_file():  # its featuriser decides the tokens: part of the run's identity
                files.append(ResourceFile(meta_path(path), "model_meta", key=name))
        return files

    def prepare(self) -> None:
        for name, spec in self.options.models.items():
            if spec.path is None:
                continue
            path = _resolve(spec.path, self.context.pipeline_dir)
            if spec.model_kind(self.context.pipeline_dir) == "transformers":
                problem = tfm.folder_problem(path)
                if problem is not None:
                    raise tfm.TransformerModelError(f"classify: models.{name}.path: {problem}")
            elif not path.is_file():
                raise FileNotFoundError(f"classify: model {name}: file not found: {path}")

    def setup(self) -> None:
        # fastText models load here; a transformers model on its first batch (_TransformerModel.scores), so
        # the phases that only apply this stage's decisions or rank its scores load no network onto a GPU.
        self._classifiers: list[tuple[str, Classifier | _TransformerModel, list[tuple[int, str]]]] = []
        self._regressors: dict[str, dict[str, Any]] = {}  # model name -> meta, for the models trained as regressors
        for name, spec in self.options.models.items():
            if spec.path is None:
                continue  # trained in the combine step
            path = _resolve(spec.path, self.context.pipeline_dir)
            scorer: Classifier | _TransformerModel
            if spec.model_kind(self.context.pipeline_dir) == "transformers":
                scorer = _TransformerModel(path, spec, tfm.model_labels(tfm.read_config(path)))
            else:
                scorer = Classifier.load(path, spec.featuriser)
                meta = read_meta(scorer.path)
                if (meta or {}).get("task") == REGRESSOR:
                    self._regressors[name] = meta or {}
                    self._classifiers.append((name, scorer, [(0, column_name(name, SCORE))]))
                    continue
            wanted = [lab.removeprefix("__label__") for lab in spec.labels] if spec.labels else scorer.labels
            missing = [lab for lab in wanted if lab not in scorer.labels]
            if missing:
                raise ValueError(
                    f"classify: models.{name}.labels: {', '.join(missing)} not labels of {path.name}; "
                    f"its labels: {', '.join(scorer.labels)}"
                )
            cols = [(scorer.labels.index(lab), column_name(name, lab)) for lab in wanted]
            self._classifiers.append((name, scorer, cols))
        # A model too big to load at validation is checked here: a rule on a column no model writes
        # would otherwise keep everything without a word.
        produced = {col for _, _, cols in self._classifiers for _, col in cols}
        problems = bucket_problems(self.options)
        if problems:
            raise ValueError(f"classify: {problems[0][0]}: {problems[0][1]}")
        for name, spec in self.options.models.items():
            if spec.path is None or name in self._regressors:
                continue
            if self.options.buckets is not None and column_name(name, spec.bucket_label) not in produced:
                raise ValueError(
                    f"classify: models.{name}.bucket_label: {spec.bucket_label!r} is not a scored label; "
                    f"scored: {', '.join(sorted(produced))}"
                )
        trained = tuple(f"cls_{n}_" for n, spec in self.options.models.items() if spec.path is None)
        for i, rule in enumerate(self.options.keep):
            if rule.score is not None and rule.score not in produced and not rule.score.startswith(trained or ("\0",)):
                raise ValueError(
                    f"classify: keep[{i}].score: {rule.score!r} is not a score column of this stage; "
                    f"allowed: {', '.join(sorted(produced))}"
                )

    def applies_to(self, kind: str) -> bool:
        return kind in self.options.kinds

    def compute(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        kind = batch["kind"][0].as_py() if n and "kind" in batch.column_names else None
        if kind is not None and not self.applies_to(kind):  # global mode sees every kind: leave them unscored
            for _, _, cols in self._classifiers:
                for _, col in cols:
                    batch = set_column(batch, col, pa.nulls(n, pa.float32()))
            return batch
        text = pc.utf8_slice_codeunits(pc.fill_null(batch["text"], ""), 0, self.options.max_chars)
        texts = text.to_pylist()
        featurised: dict[str, list[str]] = {}  # fastText models sharing a featuriser share its output
        for name, clf, cols in self._classifiers:
            if isinstance(clf, _TransformerModel):
                scores = clf.scores(texts)
            else:
                if clf.featuriser not in featurised:
                    featurised[clf.featuriser] = clf.featurise(texts)
                scores = predict_all(clf.model, featurised[clf.featuriser], clf.labels)
                if name in self._regressors:
                    scores = output_scores(self._regressors[name], clf.labels, scores)
            for j, col in cols:
                batch = set_column(batch, col, pa.array(scores[:, j], pa.float32()))
        return batch

    def decide(self, batch: pa.Table) -> Decision:
        """Thresholds only: percentile rules make the stage global, and then ``reduce`` decides."""
        reason = pa.nulls(batch.num_rows, pa.string())
        detail = pa.nulls(batch.num_rows, pa.string())
        for rule in reversed(self.options.keep):  # the first failing rule wins: apply the others first
            if rule.score is None or rule.score not in batch.column_names:
                continue
            score = batch[rule.score]
            for bound, fails, op in ((rule.min, pc.less, "<"), (rule.max, pc.greater, ">")):
                if bound is None:
                    continue
                bad = pc.fill_null(fails(score, bound), False)
                text = pc.binary_join_element_wise(
                    f"{rule.score}=", pc.cast(pc.round(score, 4), pa.string()), f" {op} {bound:g}", ""
                )
                reason = pc.if_else(bad, f"classifier:{rule.score}", reason)
                detail = pc.if_else(bad, text, detail)
        return Decision(reason, detail)

    def steps(self) -> tuple[GlobalStep, ...]:
        """One combine task over every shard's scores: a percentile is of the whole corpus. With buckets
        it decides nothing itself: its state (buckets, reason, detail per document) goes to ``apply``."""
        if self.options.buckets is not None or self._trains():
            return (CombineStep(no_drops, self._bucket_state),)
        return (CombineStep(self._combine),)

    def _trains(self) -> bool:
        return any(spec.train is not None for spec in self.options.models.values())

    def _combine(self, partition_outputs: list[str], inputs: ReduceInputs) -> pa.Table:
        return self.reduce(inputs)

    def reduce(self, inputs: ReduceInputs) -> pa.Table:
        """Percentile cut-offs per group from histograms (pass 1), then every rule per document (pass 2)."""
        o: ClassifyOptions = self.options
        cutoffs = percentile_cutoffs(inputs, o.keep, o.bins)
        out: list[pa.Table] = []
        for path, shard in zip(inputs.files, inputs.shards):
            table = _read(path, o.keep)
            reason, detail = self._judge(table, cutoffs)
            drop = np.flatnonzero(reason != None)  # noqa: E711 (elementwise on an object array)
            if len(drop):
                out.append(
                    pa.table(
                        {
                            "id": table["id"].take(pa.array(drop)),
                            "shard": pa.array(np.full(len(drop), shard, np.int32)),
                            "reason": pa.array(reason[drop].tolist(), pa.string()),
                            "detail": pa.array(detail[drop].tolist(), pa.string()),
                        }
                    )
                )
        if not out:
            return pa.table(
                {
                    "id": pa.array([], pa.string()),
                    "shard": pa.array([], pa.int32()),
                    "reason": pa.array([], pa.string()),
                    "detail": pa.array([], pa.string()),
                }
            )
        return pa.concat_tables(out)

    def _judge(
        self,
        table: pa.Table,
        cutoffs: dict[int, dict[tuple[str | None, ...], tuple[int, int]]],
        buckets: dict[str, np.ndarray] | None = None,
        rank_columns: list[str] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every keep rule on one shard's documents: (reason, detail) object arrays, None where kept.
        ``buckets``: name -> each document's bucket (-1: not bucketed), for the bucket rules, with the
        score column each model's bucket ranks (``rank_columns``, in model order)."""
        o: ClassifyOptions = self.options
        reason = np.full(table.num_rows, None, dtype=object)
        detail = np.full(table.num_rows, None, dtype=object)
        for i, rule in reversed(list(enumerate(o.keep))):  # first failing rule wins
            if rule.bucket is not None:
                assert buckets is not None and rank_columns is not None  # a bucket rule needs buckets: bucket_problems
                self._judge_bucket(table, rule, buckets, reason, detail, rank_columns)
                continue
            assert rule.score is not None
            score = _scores(table, rule.score)
            judged = ~np.isnan(score)
            fails: list[tuple[np.ndarray, np.ndarray]] = []
            for bound, op in ((rule.min, "<"), (rule.max, ">")):
                if bound is not None:
                    bad = judged & ((score < bound) if op == "<" else (score > bound))
                    if bad.any():
                        fails.append((bad, np.array([f"{rule.score}={s:.4f} {op} {bound:g}" for s in score])))
            if rule.min_percentile is not None:
                keys = _group_keys(table, rule.per)
                cut = np.array([cutoffs[i].get(k, (0, 0))[0] for k in keys], dtype=np.int64)
                bad = judged & (_bucket(score, o.bins) < cut)  # compared as buckets: no float edge cases
                if bad.any():
                    text = np.array(
                        [
                            f"{rule.score}={s:.4f} < {c / o.bins:.4f} (p{rule.min_percentile:g} of "
                            f"{_describe(rule.per, k)}, {cutoffs[i].get(k, (0, 0))[1]} docs)"
                            for s, c, k in zip(score, cut, keys)
                        ]
                    )
                    fails.append((bad, text))
            for bad, text in reversed(fails):
                reason[bad] = f"classifier:{rule.score}"
                detail[bad] = text[bad]
        return reason, detail

    def _judge_bucket(
        self,
        table: pa.Table,
        rule: KeepRule,
        buckets: dict[str, np.ndarray],
        reason: np.ndarray,
        detail: np.ndarray,
        rank_columns: list[str],
    ) -> None:
        """A bucket rule: drops with reason ``classifier_bucket:<name>``; the detail has the bucket, the
        bound, every model's bucket and score and the group (text made for the dropped documents only)."""
        o: ClassifyOptions = self.options
        b = o.buckets
        assert b is not None and rule.bucket is not None
        value = buckets[rule.bucket]
        judged = value >= 0
        fails = []
        for bound, op in ((rule.min, "<"), (rule.max, ">")):
            if bound is not None:
                bad = judged & ((value < bound) if op == "<" else (value > bound))
                fails.append((bad, op, bound))
        ranked = dict(zip(o.models, rank_columns))
        scores = {n: _scores(table, ranked[n]) for n in o.models}
        keys = _group_keys(table, b.per)
        how = (f"ranked {b.ensemble} of " if b.rank_ensemble else f"{b.ensemble} of ") if rule.bucket == b.name else ""
        for bad, op, bound in reversed(fails):
            for j in np.flatnonzero(bad):
                models = ", ".join(f"{bucket_column(n)}={buckets[n][j]} {ranked[n]}={scores[n][j]:.4f}" for n in o.models)
                reason[j] = f"classifier_bucket:{rule.bucket}"
                detail[j] = (
                    f"{bucket_column(rule.bucket)}={value[j]} {op} {bound:g} ({how}{models}; "
                    f"{b.count} buckets of {_describe(b.per, keys[j])})"
                )

    def _rank_column(self, name: str, trained: dict[str, Trained]) -> str:
        """The score column a model's bucket ranks: a regressor's score, else its bucket_label's."""
        spec = self.options.models[name]
        t = trained.get(name)
        meta = t.meta if t is not None else read_meta(_resolve(spec.path or "", self.context.pipeline_dir))
        if (meta or {}).get("task") == REGRESSOR:
            return column_name(name, SCORE)
        col = column_name(name, spec.bucket_label)
        if t is not None and col not in t.columns:
            raise TrainError(
                f"classify: models.{name}.bucket_label: {spec.bucket_label!r} is not a label of the model trained "
                f"on {spec.train.column if spec.train else '?'}; its labels: {', '.join(t.clf.labels)}"
            )
        return col

    def _fit(self, inputs: ReduceInputs) -> dict[str, Trained]:
        """The models with ``train``, fitted to the labelled documents of the run (or found fitted)."""
        o: ClassifyOptions = self.options
        out = {}
        for name, spec in o.models.items():
            if spec.train is not None:
                if not inputs.outputs_dir:
                    raise TrainError(f"classify: models.{name}.train: this engine gives the stage no folder for the model")
                out[name] = fit_in_run(name, spec.train, inputs.files, o.kinds, o.max_chars, inputs.outputs_dir)
        return out

    def _bucket_state(self, partition_outputs: list[str], inputs: ReduceInputs) -> pa.Table:
        """Every document's trained models' scores, buckets and the verdict of every rule, for ``apply``.

        Models with ``train`` are fitted first and score every document (``classify_train``). Pass 1
        ranks each model's scores within their groups over the whole corpus (exact:
        ``datapipe.classify.buckets``), pass 2 reads each shard again and judges its documents."""
        o: ClassifyOptions = self.options
        b = o.buckets
        trained = self._fit(inputs)
        # the trained models' scores, per shard (float32: 4 bytes per document and column)
        extra = [score_file(f, list(trained.values()), o.kinds, o.max_chars) for f in inputs.files] if trained else None
        names = list(o.models)
        cols = [self._rank_column(n, trained) for n in names]
        cutoffs = percentile_cutoffs(inputs, o.keep, o.bins, extra)
        ranked = np.zeros((0, len(names)), np.int64)
        ensemble = np.zeros(0, np.int64)
        sizes = [pq.read_metadata(path).num_rows for path in inputs.files]
        if b is not None:
            ranked, ensemble = self._rank(inputs, names, cols, extra)
        out = []
        start = 0
        for i, (path, shard, n) in enumerate(zip(inputs.files, inputs.shards, sizes)):
            table = _with(_read(path, o.keep, cols), extra[i] if extra else None)
            by_name: dict[str, np.ndarray] | None = None
            if b is not None:
                by_name = {name: ranked[start : start + n, j] for j, name in enumerate(names)}
                by_name[b.name] = ensemble[start : start + n]
            start += n
            reason, detail = self._judge(table, cutoffs, by_name, cols)
            scores = {c: pa.array(v, pa.float32(), mask=np.isnan(v)) for c, v in (extra[i] if extra else {}).items()}
            buckets = {bucket_column(k): _bucket_array(v) for k, v in (by_name or {}).items()}
            out.append(
                state_rows(
                    make_row_keys(shard, 0, n),
                    **scores,
                    **buckets,
                    reason=pa.array(reason.tolist(), pa.string()),
                    detail=pa.array(detail.tolist(), pa.string()),
                )
            )
        if not out:
            empty = {bucket_column(k): pa.array([], pa.int16()) for k in [*names, b.name]} if b is not None else {}
            return state_rows(np.empty(0, np.int64), **empty, reason=pa.array([], pa.string()), detail=pa.array([], pa.string()))
        return pa.concat_tables(out)

    def _rank(
        self, inputs: ReduceInputs, names: list[str], cols: list[str], extra: list[dict[str, np.ndarray]] | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each model's bucket of every document (documents x models) and the ensemble's, in file order."""
        o: ClassifyOptions = self.options
        b = o.buckets
        assert b is not None
        groups: dict[tuple[str | None, ...], int] = {}
        keys: list[list[np.ndarray]] = [[] for _ in names]
        codes: list[list[np.ndarray]] = [[] for _ in names]
        all_ties: list[np.ndarray] = []
        for i, path in enumerate(inputs.files):
            table = _with(_read(path, o.keep, cols), extra[i] if extra else None)
            ties = bk.tie_keys(table["id"].to_pylist())
            all_ties.append(ties)
            code = np.array([groups.setdefault(k, len(groups)) for k in _group_keys(table, b.per)], np.int64)
            for j, col in enumerate(cols):
                score = _scores(table, col)
                keys[j].append(bk.sort_keys(np.nan_to_num(score, nan=0.0), ties))
                codes[j].append(np.where(np.isnan(score), -1, code))  # unscored (kinds): in no group
        ranked = np.stack(
            [
                bk.rank_buckets(
                    np.concatenate(k) if k else np.empty(0, np.uint64),
                    np.concatenate(c) if c else np.empty(0, np.int64),
                    b.count,
                )
                for k, c in zip(keys, codes)
            ],
            axis=1,
        )  # models: at least one (ClassifyOptions.models)
        weights = [b.weights[n] for n in names] if b.weights is not None else None
        if b.rank_ensemble:  # the models' groups agree where all scored (the same kinds): take the first's
            group = np.concatenate(codes[0]) if codes[0] else np.empty(0, np.int64)
            tie = np.concatenate(all_ties) if all_ties else np.empty(0, np.uint64)
            ensemble = bk.ranked_ensemble(ranked, b.ensemble, weights, group, tie, b.count)
        else:
            ensemble = bk.combine(ranked, b.ensemble, weights)
        return ranked, ensemble

    def apply(self, batch: pa.Table, row_keys: np.ndarray, state: pa.Table | None) -> tuple[pa.Table, Decision]:
        """With buckets or trained models: each document's trained scores, buckets and the combine step's verdict."""
        o: ClassifyOptions = self.options
        if o.buckets is None and not self._trains():
            return super().apply(batch, row_keys, state)
        n = batch.num_rows
        if state is None or state.num_rows == 0:
            if o.buckets is not None:
                for name in [*o.models, o.buckets.name]:
                    batch = set_column(batch, bucket_column(name), pa.nulls(n, pa.int16()))
            return batch, Decision.keep_all(n)
        keys = state["row_key"].to_numpy()
        order = np.argsort(keys, kind="stable")
        j = np.minimum(np.searchsorted(keys[order], row_keys), len(keys) - 1)
        hit = keys[order][j] == row_keys
        idx = pa.array(np.where(hit, order[j], 0), mask=~hit)
        for col in state.column_names:
            if col not in ("shard", "row_key", "reason", "detail"):  # the trained scores, then the buckets
                batch = set_column(batch, col, _flat(state[col].take(idx)))
        return batch, Decision(_flat(state["reason"].take(idx)), _flat(state["detail"].take(idx)))


def _flat(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _bucket_array(values: np.ndarray) -> pa.Array:
    """int16 buckets, null where -1 (a document no model scored)."""
    return pa.array(values.astype(np.int16), pa.int16(), mask=values < 0)


def _read(path: str, rules: list[KeepRule], extra: Sequence[str] = ()) -> pa.Table:
    names = set(pq.read_schema(path).names)
    wanted = ["id", "kind", "lang", "source", *(r.score for r in rules if r.score is not None), *extra]
    return pq.read_table(path, columns=[c for c in dict.fromkeys(wanted) if c in names])


def _with(table: pa.Table, scores: dict[str, np.ndarray] | None) -> pa.Table:
    """A shard's table with the trained models' scores of it added (NaN: not scored)."""
    for col, values in (scores or {}).items():
        table = set_column(table, col, pa.array(values, pa.float32()))
    return table


def _scores(table: pa.Table, column: str) -> np.ndarray:
    if column not in table.column_names:
        return np.full(table.num_rows, np.nan)
    return pc.fill_null(pc.cast(table[column], pa.float64()), np.nan).to_numpy()


def _group_keys(table: pa.Table, per: Sequence[str]) -> list[tuple[str | None, ...]]:
    cols = [table[c].to_pylist() if c in table.column_names else [None] * table.num_rows for c in per]
    return list(zip(*cols)) if cols else [()] * table.num_rows


def _describe(per: Sequence[str], key: tuple[str | None, ...]) -> str:
    return " ".join(f"{c}={v}" for c, v in zip(per, key)) or "the run"


def _bucket(score: np.ndarray, bins: int) -> np.ndarray:
    return np.clip(np.nan_to_num(score * bins, nan=0.0).astype(np.int64), 0, bins - 1)


def percentile_cutoffs(
    inputs: ReduceInputs, rules: list[KeepRule], bins: int, extra: list[dict[str, np.ndarray]] | None = None
) -> dict[int, dict[tuple[str | None, ...], tuple[int, int]]]:
    """Per percentile rule (by index) and group: (cut-off bucket, documents in the group).

    One histogram of ``bins`` equal buckets over [0, 1] per group: memory is groups x bins, not
    the number of documents. The cut-off is the lower edge of the bucket where the cumulative
    count passes P% of the group, so a document scoring at least that is kept.
    """
    hists: dict[int, dict[tuple[str | None, ...], np.ndarray]] = {
        i: {} for i, r in enumerate(rules) if r.min_percentile is not None
    }
    if not hists:
        return {}
    for f, path in enumerate(inputs.files):
        table = _with(_read(path, rules), extra[f] if extra else None)  # extra: the trained models' scores
        for i in hists:
            rule = rules[i]
            assert rule.score is not None  # a percentile rule is a score rule (KeepRule._one_bound)
            score = _scores(table, rule.score)
            judged = ~np.isnan(score)
            if not judged.any():
                continue
            bucket = _bucket(score[judged], bins)
            keys = [k for k, j in zip(_group_keys(table, rule.per), judged) if j]
            uniq: dict[tuple[str | None, ...], int] = {}
            codes = np.array([uniq.setdefault(k, len(uniq)) for k in keys], dtype=np.int64)
            counts = np.bincount(codes * bins + bucket, minlength=len(uniq) * bins).reshape(len(uniq), bins)
            for k, c in uniq.items():
                h = hists[i].setdefault(k, np.zeros(bins, np.int64))
                h += counts[c]
    out: dict[int, dict[tuple[str | None, ...], tuple[int, int]]] = {}
    for i, groups in hists.items():
        p = rules[i].min_percentile / 100.0  # type: ignore[operator]
        out[i] = {}
        for key, h in groups.items():
            n = int(h.sum())
            cum = np.cumsum(h)
            b = int(np.searchsorted(cum, p * n, side="right"))  # first bucket whose cumulative count passes P%
            out[i][key] = (min(b, bins - 1), n)
    return out
