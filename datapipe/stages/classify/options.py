"""The options of the classify stage: its models, keep rules and buckets, and their own checks."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from datapipe.classify import buckets as bk
from datapipe.stages.base import Problem, StageOptions
from datapipe.stages.classify.train import TrainSpec


def resolve(path: str, base: Path | str) -> Path:
    """A model path of the options: absolute, or relative to the pipeline file's folder."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base) / p


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
        path = resolve(self.path, pipeline_dir)
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
