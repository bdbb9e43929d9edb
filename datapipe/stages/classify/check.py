"""What validation checks of a classify stage's options against the world: model files and their
labels, the columns of trained models, keep rules against the score columns; cheap, no big model loaded."""

from __future__ import annotations

from pathlib import Path

from datapipe.classify import transformer as tfm
from datapipe.classify.fit import REGRESSOR, SCORE
from datapipe.classify.model import column_name, read_meta
from datapipe.stages.base import CheckContext, Problem, kinds_problems
from datapipe.stages.classify.options import ClassifyOptions, ModelSpec, bucket_problems, resolve

LOAD_LABELS_MAX_BYTES = 64 << 20  # validation reads a model's labels by loading it only below this size


def check(options: ClassifyOptions, context: CheckContext) -> list[Problem]:
    """Everything of the options a run would only find out later: models, labels, columns, bounds."""
    o = options
    problems = kinds_problems(o.kinds)
    columns: dict[str, set[str] | None] = {}  # model name -> its score columns (None: unknown)
    regression: set[str] = set()  # score columns that are not probabilities
    problems += _train_problems(o, context)
    for name, spec in o.models.items():
        key = f"models.{name}"
        if spec.path is None:
            problems += spec.spec_problems(key, context.pipeline_dir)
            continue  # trained in the run: its labels are known once it is (_train_problems)
        path = resolve(spec.path, context.pipeline_dir)
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
                problems.append((f"{key}.labels[{i}]", f"{lab!r} is not a label of {path.name}; its labels: {', '.join(labels)}"))
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
                    f"{rule.score!r} is not a score column of model {owner}; allowed: {', '.join(sorted(columns[owner] or []))}",
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
                    problems.append((f"keep[{i}].{bound}", f"{v:g} is not 0 to 1; a score rule's bounds are probabilities here"))
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
