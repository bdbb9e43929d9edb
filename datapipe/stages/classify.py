"""Model-based quality scoring: fastText classifiers given by path, one score column per model and label.

Signals: ``cls_<model>_<label>`` (float32), the probability the model gives the label, for
every label of the model (or the ones listed under ``labels``). Texts are featurised as the
model was trained (``datapipe.classify.features``; ``plain`` for a model from elsewhere).

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

Without a percentile rule the stage is an ordinary per-document stage (no extra phase).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from datapipe.classify.model import Classifier, column_name, meta_path, predict_all, read_meta
from datapipe.stages.base import CheckContext, Decision, Problem, ResourceFile, Resources, StageOptions, kinds_problems
from datapipe.stages.columns import set_column
from datapipe.stages.global_stage import CombineStep, GlobalStage, GlobalStep, ReduceInputs

_NULL = pa.scalar(None, pa.string())
LOAD_LABELS_MAX_BYTES = 64 << 20  # validation reads a model's labels by loading it only below this size


class ModelSpec(StageOptions):
    path: str = Field(description="fastText model file (.bin or .ftz), relative to the pipeline file.")
    featuriser: Literal["auto", "plain", "cjk-v1"] = Field(
        "auto", description="How texts become tokens: auto reads the model's NAME.meta.json (plain without one)."
    )
    labels: list[str] | None = Field(None, description="Labels to record a score column for (default: all).")


class KeepRule(StageOptions):
    score: str = Field(description="Score column, cls_<model>_<label>.")
    min: float | None = Field(None, ge=0.0, le=1.0, description="Drop documents scoring below this.")
    max: float | None = Field(None, ge=0.0, le=1.0, description="Drop documents scoring above this.")
    min_percentile: float | None = Field(
        None, gt=0.0, lt=100.0, description="Drop documents below this percentile of their group's scores."
    )
    per: list[Literal["lang", "kind", "source"]] = Field(
        ["lang", "kind"], description="Columns whose values form the groups of min_percentile."
    )

    @model_validator(mode="after")
    def _one_bound(self) -> KeepRule:
        if self.min is None and self.max is None and self.min_percentile is None:
            raise ValueError("give min, max and/or min_percentile")
        return self


class ClassifyOptions(StageOptions):
    models: dict[str, ModelSpec] = Field(min_length=1, description="Name (in column names) -> model.")
    keep: list[KeepRule] = Field([], description="Keep rules on score columns; none: score only.")
    kinds: list[str] = Field(["web", "paper", "text"], description="Source kinds the stage applies to.")
    max_chars: int = Field(100_000, ge=100, description="Characters of each document the models read.")
    bins: int = Field(10_000, ge=10, le=1_000_000, description="Histogram buckets per group for percentiles.")

    @model_validator(mode="after")
    def _names(self) -> ClassifyOptions:
        bad = [n for n in self.models if not re.fullmatch(r"[a-z0-9_]+", n)]
        if bad:
            raise ValueError(f"model names name columns: use a-z, 0-9 and _ only ({', '.join(bad)})")
        return self


def _resolve(path: str, base: Path | str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base) / p


def model_labels(path: Path) -> list[str] | None:
    """A model's labels from its meta file, else by loading it when small; None when not known cheaply."""
    meta = read_meta(path)
    if meta and isinstance(meta.get("labels"), list):
        return [str(x) for x in meta["labels"]]
    if path.stat().st_size <= LOAD_LABELS_MAX_BYTES:  # loaded and let go: validation must not hold models
        import fasttext

        from datapipe.classify.model import LABEL_PREFIX

        fasttext.FastText.eprint = lambda *a, **k: None
        return [lab.removeprefix(LABEL_PREFIX) for lab in fasttext.load_model(str(path)).get_labels()]
    return None


class Classify(GlobalStage):
    name = "classify"
    Options = ClassifyOptions
    resources = Resources(num_cpus=1, memory_mb=500)
    is_global = False  # only with a percentile rule: see global_for
    repeatable = True

    @classmethod
    def global_for(cls, options: Any) -> bool:
        return any(r.min_percentile is not None for r in options.keep)

    @classmethod
    def check(cls, options: Any, context: CheckContext) -> list[Problem]:
        o: ClassifyOptions = options
        problems = kinds_problems(o.kinds)
        columns: dict[str, set[str] | None] = {}  # model name -> its score columns (None: unknown)
        for name, spec in o.models.items():
            key = f"models.{name}.path"
            path = _resolve(spec.path, context.pipeline_dir)
            if not path.is_file():
                problems.append((key, f"file not found: {path}"))
                continue
            try:
                labels = model_labels(path)
            except Exception as exc:  # fastText raises ValueError or RuntimeError on a bad file
                problems.append((key, f"cannot load {path} as a fastText model: {exc}"))
                continue
            if labels is None:
                columns[name] = None
                continue
            for i, lab in enumerate(spec.labels or []):
                if lab.removeprefix("__label__") not in labels:
                    problems.append(
                        (f"models.{name}.labels[{i}]", f"{lab!r} is not a label of {path.name}; its labels: {', '.join(labels)}")
                    )
            wanted = [lab.removeprefix("__label__") for lab in spec.labels] if spec.labels else labels
            columns[name] = {column_name(name, lab) for lab in wanted}
        for i, rule in enumerate(o.keep):
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
        return problems

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        out: set[str] = set()
        for name, spec in options.models.items():
            path = _resolve(spec.path, context.pipeline_dir)
            meta = read_meta(path) if path.is_file() else None
            labels = spec.labels or (meta or {}).get("labels")
            if not labels:
                return None
            out |= {column_name(name, lab) for lab in labels}
        return out

    @classmethod
    def resource_files(cls, options: Any, pipeline_dir: Path) -> list[ResourceFile]:
        files = []
        for name, spec in options.models.items():
            path = _resolve(spec.path, pipeline_dir)
            files.append(ResourceFile(path, "model", key=name, content=False))
            if meta_path(path).is_file():  # its featuriser decides the tokens: part of the run's identity
                files.append(ResourceFile(meta_path(path), "model_meta", key=name))
        return files

    def prepare(self) -> None:
        for name, spec in self.options.models.items():
            path = _resolve(spec.path, self.context.pipeline_dir)
            if not path.is_file():
                raise FileNotFoundError(f"classify: model {name}: file not found: {path}")

    def setup(self) -> None:
        self._classifiers: list[tuple[str, Classifier, list[tuple[int, str]]]] = []
        for name, spec in self.options.models.items():
            clf = Classifier.load(_resolve(spec.path, self.context.pipeline_dir), spec.featuriser)
            wanted = [lab.removeprefix("__label__") for lab in spec.labels] if spec.labels else clf.labels
            missing = [lab for lab in wanted if lab not in clf.labels]
            if missing:
                raise ValueError(
                    f"classify: models.{name}.labels: {', '.join(missing)} not labels of {clf.path.name}; "
                    f"its labels: {', '.join(clf.labels)}"
                )
            cols = [(clf.labels.index(lab), column_name(name, lab)) for lab in wanted]
            self._classifiers.append((name, clf, cols))
        # A model too big to load at validation is checked here: a rule on a column no model writes
        # would otherwise keep everything without a word.
        produced = {col for _, _, cols in self._classifiers for _, col in cols}
        for i, rule in enumerate(self.options.keep):
            if rule.score not in produced:
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
        featurised: dict[str, list[str]] = {}  # models sharing a featuriser share its output
        for _, clf, cols in self._classifiers:
            if clf.featuriser not in featurised:
                featurised[clf.featuriser] = clf.featurise(texts)
            scores = predict_all(clf.model, featurised[clf.featuriser], clf.labels)
            for j, col in cols:
                batch = set_column(batch, col, pa.array(scores[:, j], pa.float32()))
        return batch

    def decide(self, batch: pa.Table) -> Decision:
        """Thresholds only: percentile rules make the stage global, and then ``reduce`` decides."""
        reason = pa.nulls(batch.num_rows, pa.string())
        detail = pa.nulls(batch.num_rows, pa.string())
        for rule in reversed(self.options.keep):  # the first failing rule wins: apply the others first
            if rule.score not in batch.column_names:
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
        """One combine task over every shard's scores: a percentile is of the whole corpus."""
        return (CombineStep(self._combine),)

    def _combine(self, partition_outputs: list[str], inputs: ReduceInputs) -> pa.Table:
        return self.reduce(inputs)

    def reduce(self, inputs: ReduceInputs) -> pa.Table:
        """Percentile cut-offs per group from histograms (pass 1), then every rule per document (pass 2)."""
        o: ClassifyOptions = self.options
        cutoffs = percentile_cutoffs(inputs, o.keep, o.bins)
        out: list[pa.Table] = []
        for path, shard in zip(inputs.files, inputs.shards):
            table = _read(path, o.keep)
            reason = np.full(table.num_rows, None, dtype=object)
            detail = np.full(table.num_rows, None, dtype=object)
            for i, rule in reversed(list(enumerate(o.keep))):  # first failing rule wins
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


def _read(path: str, rules: list[KeepRule]) -> pa.Table:
    names = set(pq.read_schema(path).names)
    wanted = ["id", "kind", "lang", "source", *(r.score for r in rules)]
    return pq.read_table(path, columns=[c for c in dict.fromkeys(wanted) if c in names])


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
    inputs: ReduceInputs, rules: list[KeepRule], bins: int
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
    for path in inputs.files:
        table = _read(path, rules)
        for i in hists:
            rule = rules[i]
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
