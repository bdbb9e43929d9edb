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

The package: the stage here; its options (``options.py``) and what validation checks of them
(``check.py``); the models scoring a batch in a worker (``score.py``); the corpus-wide step, cut-offs,
buckets and the rules judged per document (``percentiles.py``); models trained on the run's labels
(``train.py``); its report sections and aggregates (``report.py``); its lines in ``datapipe explain``
(``explain.py``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datapipe.classify import transformer as tfm
from datapipe.classify.fit import REGRESSOR, SCORE
from datapipe.classify.model import Classifier, column_name, meta_path, read_meta
from datapipe.stages.base import CheckContext, Decision, Problem, ResourceFile, Resources
from datapipe.stages.classify import report
from datapipe.stages.classify.check import check as check_options
from datapipe.stages.classify.explain import explain as explain_document
from datapipe.stages.classify.options import BucketOptions, ClassifyOptions, KeepRule, ModelSpec, bucket_column, resolve
from datapipe.stages.classify.percentiles import bucket_state, percentile_decisions
from datapipe.stages.classify.score import Scorers, TransformerModel
from datapipe.stages.columns import set_column
from datapipe.stages.explain_section import ExplainSection, RecordedRun, Threshold, threshold_if_set
from datapipe.stages.global_stage import CombineStep, GlobalStage, GlobalStep, MayBeGlobal, ReduceInputs, no_drops
from datapipe.stages.report_section import Aggregate, ReportSection

__all__ = ["BucketOptions", "Classify", "ClassifyOptions", "KeepRule", "ModelSpec"]


class Classify(MayBeGlobal, GlobalStage):
    name = "classify"
    summary = "fastText quality classifiers, with thresholds or percentiles; `datapipe train-classifier`"
    signals = "`cls_<model>_<label>` per model and label (probability)"
    reasons = ("classifier:<column>",)
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
        return check_options(options, context)

    @classmethod
    def aggregates(cls, columns: set[str]) -> list[Aggregate]:
        return report.aggregates(columns)

    @classmethod
    def report_sections(cls, columns: set[str]) -> list[ReportSection]:
        return report.report_sections(columns)

    @classmethod
    def explain(cls, row: dict[str, Any], run: RecordedRun) -> list[ExplainSection]:
        return explain_document(row, run)

    @classmethod
    def thresholds(cls, options: dict[str, Any], run: RecordedRun) -> list[Threshold]:
        out: list[Threshold] = []
        for rule in options.get("keep") or []:  # score rules only: a bucket rule bounds a bucket number
            if isinstance(rule, dict) and rule.get("score"):
                score = str(rule["score"])
                out += threshold_if_set(score, rule.get("min"), "min", f"classify keep {score}.min")
                out += threshold_if_set(score, rule.get("max"), "max", f"classify keep {score}.max")
        return out

    @classmethod
    def output_columns(cls, options: Any, context: CheckContext) -> set[str] | None:
        out: set[str] = set()
        for name, spec in options.models.items():
            if spec.path is None:
                return None  # trained in the run: its labels are not known before
            path = resolve(spec.path, context.pipeline_dir)
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
            path = resolve(spec.path, pipeline_dir)
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
            path = resolve(spec.path, self.context.pipeline_dir)
            if spec.model_kind(self.context.pipeline_dir) == "transformers":
                problem = tfm.folder_problem(path)
                if problem is not None:
                    raise tfm.TransformerModelError(f"classify: models.{name}.path: {problem}")
            elif not path.is_file():
                raise FileNotFoundError(f"classify: model {name}: file not found: {path}")

    def setup(self) -> None:
        self._scorers = Scorers.load(self.options, self.context.pipeline_dir)

    @property
    def scorers(self) -> dict[str, Classifier | TransformerModel]:
        """The loaded model of each configured name (after ``setup``; models trained by the run are not)."""
        return {name: scorer for name, scorer, _ in self._scorers.models}

    def applies_to(self, kind: str) -> bool:
        return kind in self.options.kinds

    def compute(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        kind = batch["kind"][0].as_py() if n and "kind" in batch.column_names else None
        if kind is not None and not self.applies_to(kind):  # global mode sees every kind: leave them unscored
            return self._scorers.unscored(batch)
        text = pc.utf8_slice_codeunits(pc.fill_null(batch["text"], ""), 0, self.options.max_chars)
        return self._scorers.score(batch, text.to_pylist())

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
        return percentile_decisions(self.options, inputs)

    def _bucket_state(self, partition_outputs: list[str], inputs: ReduceInputs) -> pa.Table:
        """Every document's trained models' scores, buckets and the verdict of every rule, for ``apply``."""
        return bucket_state(self.options, self.context.pipeline_dir, inputs)

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
