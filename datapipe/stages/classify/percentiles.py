"""The classify stage's corpus-wide step: percentile cut-offs of the scores per group, each model's
bucket of every document, models trained on the run's labels, and every keep rule judged per
document (see the package's docstring for the rules)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datapipe.classify import buckets as bk
from datapipe.classify.fit import REGRESSOR, SCORE
from datapipe.classify.model import column_name, read_meta
from datapipe.stages.classify.options import ClassifyOptions, KeepRule, bucket_column, resolve
from datapipe.stages.classify.train import Trained, TrainError, fit_in_run, score_file
from datapipe.stages.columns import set_column
from datapipe.stages.global_stage import ReduceInputs, state_rows
from datapipe.stages.row_keys import row_keys as make_row_keys


def percentile_decisions(o: ClassifyOptions, inputs: ReduceInputs) -> pa.Table:
    """Percentile cut-offs per group from histograms (pass 1), then every rule per document (pass 2)."""
    cutoffs = percentile_cutoffs(inputs, o.keep, o.bins)
    out: list[pa.Table] = []
    for path, shard in zip(inputs.files, inputs.shards):
        table = _read(path, o.keep)
        reason, detail = judge(o, table, cutoffs)
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


def judge(
    o: ClassifyOptions,
    table: pa.Table,
    cutoffs: dict[int, dict[tuple[str | None, ...], tuple[int, int]]],
    buckets: dict[str, np.ndarray] | None = None,
    rank_columns: list[str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Every keep rule on one shard's documents: (reason, detail) object arrays, None where kept.
    ``buckets``: name -> each document's bucket (-1: not bucketed), for the bucket rules, with the
    score column each model's bucket ranks (``rank_columns``, in model order)."""
    reason = np.full(table.num_rows, None, dtype=object)
    detail = np.full(table.num_rows, None, dtype=object)
    for i, rule in reversed(list(enumerate(o.keep))):  # first failing rule wins
        if rule.bucket is not None:
            assert buckets is not None and rank_columns is not None  # a bucket rule needs buckets: bucket_problems
            _judge_bucket(o, table, rule, buckets, reason, detail, rank_columns)
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
    o: ClassifyOptions,
    table: pa.Table,
    rule: KeepRule,
    buckets: dict[str, np.ndarray],
    reason: np.ndarray,
    detail: np.ndarray,
    rank_columns: list[str],
) -> None:
    """A bucket rule: drops with reason ``classifier_bucket:<name>``; the detail has the bucket, the
    bound, every model's bucket and score and the group (text made for the dropped documents only)."""
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


def rank_column(o: ClassifyOptions, pipeline_dir: str, name: str, trained: dict[str, Trained]) -> str:
    """The score column a model's bucket ranks: a regressor's score, else its bucket_label's."""
    spec = o.models[name]
    t = trained.get(name)
    meta = t.meta if t is not None else read_meta(resolve(spec.path or "", pipeline_dir))
    if (meta or {}).get("task") == REGRESSOR:
        return column_name(name, SCORE)
    col = column_name(name, spec.bucket_label)
    if t is not None and col not in t.columns:
        raise TrainError(
            f"classify: models.{name}.bucket_label: {spec.bucket_label!r} is not a label of the model trained "
            f"on {spec.train.column if spec.train else '?'}; its labels: {', '.join(t.clf.labels)}"
        )
    return col


def fit_models(o: ClassifyOptions, inputs: ReduceInputs) -> dict[str, Trained]:
    """The models with ``train``, fitted to the labelled documents of the run (or found fitted)."""
    out = {}
    for name, spec in o.models.items():
        if spec.train is not None:
            if not inputs.outputs_dir:
                raise TrainError(f"classify: models.{name}.train: this engine gives the stage no folder for the model")
            out[name] = fit_in_run(name, spec.train, inputs.files, o.kinds, o.max_chars, inputs.outputs_dir)
    return out


def bucket_state(o: ClassifyOptions, pipeline_dir: str, inputs: ReduceInputs) -> pa.Table:
    """Every document's trained models' scores, buckets and the verdict of every rule, for ``apply``.

    Models with ``train`` are fitted first and score every document (``train.py``). Pass 1
    ranks each model's scores within their groups over the whole corpus (exact:
    ``datapipe.classify.buckets``), pass 2 reads each shard again and judges its documents."""
    b = o.buckets
    trained = fit_models(o, inputs)
    # the trained models' scores, per shard (float32: 4 bytes per document and column)
    extra = [score_file(f, list(trained.values()), o.kinds, o.max_chars) for f in inputs.files] if trained else None
    names = list(o.models)
    cols = [rank_column(o, pipeline_dir, n, trained) for n in names]
    cutoffs = percentile_cutoffs(inputs, o.keep, o.bins, extra)
    ranked = np.zeros((0, len(names)), np.int64)
    ensemble = np.zeros(0, np.int64)
    sizes = [pq.read_metadata(path).num_rows for path in inputs.files]
    if b is not None:
        ranked, ensemble = rank(o, inputs, names, cols, extra)
    out = []
    start = 0
    for i, (path, shard, n) in enumerate(zip(inputs.files, inputs.shards, sizes)):
        table = _with(_read(path, o.keep, cols), extra[i] if extra else None)
        by_name: dict[str, np.ndarray] | None = None
        if b is not None:
            by_name = {name: ranked[start : start + n, j] for j, name in enumerate(names)}
            by_name[b.name] = ensemble[start : start + n]
        start += n
        reason, detail = judge(o, table, cutoffs, by_name, cols)
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


def rank(
    o: ClassifyOptions, inputs: ReduceInputs, names: list[str], cols: list[str], extra: list[dict[str, np.ndarray]] | None
) -> tuple[np.ndarray, np.ndarray]:
    """Each model's bucket of every document (documents x models) and the ensemble's, in file order."""
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
