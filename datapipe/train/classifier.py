"""`datapipe train-classifier`: a fastText quality classifier from positive and negative examples.

Examples come from files (JSONL, Parquet, or text with one example per line) or from SQL over
a run's audit database (``kept_docs``/``rejected_docs`` have the text). Each example gets a
language (its ``lang`` field, else the project's langid stage with lid.176), and the classes
are balanced per language: for every language with both classes, the same number of
positives and negatives, chosen by a seeded hash of their ids (not file order). A share of
each (language, class) is held out, never trained on, and the model is evaluated on it.

Reproducible: the choice and order of examples depend only on the seed and the ids, and
fastText runs with ``thread=1`` (with several threads its Hogwild updates race, so two runs
give different weights). Same inputs and seed give the same model bytes.

Writes beside each other: ``NAME.bin`` (the model), ``NAME.meta.json`` (featuriser, labels,
sources, counts, parameters), ``NAME.eval.json`` (precision, recall, F1, AUC per language on
the held-out share) and ``NAME.heldout.jsonl`` (the held-out examples' ids, so anyone can
check the numbers).
"""

from __future__ import annotations

import glob
import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.classify.features import CJK_V1, featuriser
from datapipe.classify.fit import fasttext_args, train_in_fresh_process
from datapipe.classify.metrics import binary_metrics
from datapipe.errors import InputNotFound, UsageError
from datapipe.readers.streams import json_records
from datapipe.storage.atomic import atomic_path, temp_path_for


@dataclass(frozen=True)
class Example:
    id: str
    text: str
    lang: str | None
    file: str | None = None  # where it came from (files only), for the held-out list
    line: int | None = None  # 1-based line (JSONL/text) or row (Parquet, 0-based)


@dataclass(frozen=True)
class TrainParams:
    """fastText supervised settings; ``thread`` is fixed at 1 (see the module doc)."""

    dim: int = 64
    epoch: int = 5
    lr: float = 0.1
    word_ngrams: int = 2  # with the cjk featuriser: Han character bigrams and Latin word bigrams
    min_count: int = 2
    bucket: int = 200_000  # hashed n-gram rows: dim x bucket floats (51 MB at the defaults)
    loss: str = "softmax"


@dataclass(frozen=True)
class TrainOptions:
    name: str
    out_dir: Path
    positive_label: str = "hq"
    negative_label: str = "lq"
    text_field: str = "text"
    lang_field: str = "lang"
    langs: tuple[str, ...] = ()  # only these languages (default: every language with both classes)
    max_per_class: int | None = None  # per language and class
    heldout_frac: float = 0.1
    seed: int = 0
    max_chars: int = 100_000
    featuriser: str = CJK_V1
    params: TrainParams = field(default_factory=TrainParams)


@dataclass
class TrainResult:
    model: Path
    meta: dict[str, Any]
    evaluation: dict[str, Any]


def is_sql(spec: str) -> bool:
    """A query starts with SELECT/WITH/FROM and a space; ``selected/*.jsonl`` is a glob."""
    return re.match(r"\s*(select|with|from)\s", spec, re.IGNORECASE) is not None


def _unit(seed: int, salt: str, key: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{salt}:{key}".encode(), digest_size=8).digest(), "big")


def _glob_base(pattern: str) -> Path:
    """The part of a glob before its first wildcard: ids are relative to it, so moving the data keeps them."""
    parts = Path(pattern).parts
    fixed = [p for p in parts[: next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), len(parts))]]
    base = Path(*fixed) if fixed else Path(".")
    return base.parent if base.is_file() or not any(c in pattern for c in "*?[") else base


def examples_from_files(pattern: str, text_field: str = "text", lang_field: str = "lang") -> Iterator[Example]:
    paths = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    if not paths:
        raise InputNotFound(f"no files match {pattern}")
    base = _glob_base(pattern)
    for path in paths:
        key = path.relative_to(base).as_posix() if path.is_relative_to(base) else path.as_posix()
        name = path.name.lower()
        if name.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".json.gz")):
            for n, rec in json_records(path):
                text = rec.get(text_field)
                if isinstance(text, str) and text.strip():
                    lang = rec.get(lang_field)
                    yield Example(f"{key}#L{n}", text, lang if isinstance(lang, str) else None, str(path), n)
        elif name.endswith(".parquet"):
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                table = pq.read_table(path)
            except (OSError, pa.ArrowException) as exc:
                raise UsageError(f"cannot read {path}: {exc}") from None
            if text_field not in table.column_names:
                raise UsageError(f"{path} has no column {text_field!r} (columns: {', '.join(table.column_names)})")
            langs = table[lang_field].to_pylist() if lang_field in table.column_names else [None] * table.num_rows
            for n, (text, lang) in enumerate(zip(table[text_field].to_pylist(), langs)):
                if isinstance(text, str) and text.strip():
                    yield Example(f"{key}#{n}", text, lang, str(path), n)
        else:  # plain text: one example per non-empty line
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if line.strip():
                    yield Example(f"{key}#L{n}", line, None, str(path), n)


def examples_from_sql(run_dir: Path, query: str, text_field: str = "text", lang_field: str = "lang") -> Iterator[Example]:
    """Rows of one read-only query over the run (the confined audit connection of ``datapipe sql``)."""
    from datapipe.audit.sql import run_query

    table = run_query(run_dir, query)
    if text_field not in table.column_names:
        raise UsageError(
            f"the query returns no {text_field!r} column (columns: {', '.join(table.column_names)}); "
            f"select the text, e.g. select id, text, lang from kept_docs where ..."
        )
    ids = table["id"].to_pylist() if "id" in table.column_names else [f"row{i}" for i in range(table.num_rows)]
    langs = table[lang_field].to_pylist() if lang_field in table.column_names else [None] * table.num_rows
    for doc_id, text, lang in zip(ids, table[text_field].to_pylist(), langs):
        if isinstance(text, str) and text.strip():
            yield Example(str(doc_id), text, lang)


def load_examples(spec: str, run_dir: Path | None, options: TrainOptions) -> list[Example]:
    if is_sql(spec):
        if run_dir is None:
            raise UsageError(f"{spec!r} is SQL: give the run it reads with --run RUN")
        return list(examples_from_sql(run_dir, spec, options.text_field, options.lang_field))
    return list(examples_from_files(spec, options.text_field, options.lang_field))


def identify_languages(examples: list[Example], batch: int = 512) -> list[Example]:
    """Fill in missing languages with the project's langid stage (lid.176 and the CJK script rules)."""
    missing = [i for i, e in enumerate(examples) if not e.lang]
    if not missing:
        return examples
    import pyarrow as pa

    from datapipe.stages.base import StageContext
    from datapipe.stages.langid import LangId, LangIdOptions
    from datapipe.storage.cache import cache_dir

    stage = LangId(LangIdOptions(line_fractions=False, script=False), StageContext(".", str(cache_dir())))
    stage.prepare()
    stage.setup()
    out = list(examples)
    for lo in range(0, len(missing), batch):
        idx = missing[lo : lo + batch]
        langs = stage.compute(pa.table({"text": [examples[i].text for i in idx]}))["lang"].to_pylist()
        for i, lang in zip(idx, langs):
            e = out[i]
            out[i] = Example(e.id, e.text, lang or "unknown", e.file, e.line)
    return out


def balance(
    positives: list[Example], negatives: list[Example], options: TrainOptions
) -> tuple[dict[str, dict[str, list[Example]]], dict[str, dict[str, int]], list[str]]:
    """Per language: the same number of each class, picked by a seeded hash of the id.

    Returns ({lang: {label: examples}}, {lang: {label: available}}, warnings).
    """
    by_lang: dict[str, dict[str, list[Example]]] = defaultdict(lambda: {"pos": [], "neg": []})
    for cls, items in (("pos", positives), ("neg", negatives)):
        seen: set[str] = set()
        for e in items:
            if e.id in seen:  # the same document given twice in one class counts once
                continue
            seen.add(e.id)
            by_lang[e.lang or "unknown"][cls].append(e)
    available = {lang: {c: len(v) for c, v in d.items()} for lang, d in sorted(by_lang.items())}
    chosen: dict[str, dict[str, list[Example]]] = {}
    warnings = []
    for lang, d in sorted(by_lang.items()):
        if options.langs and lang not in options.langs:
            continue
        n = min(len(d["pos"]), len(d["neg"]))
        if options.max_per_class is not None:
            n = min(n, options.max_per_class)
        if n == 0:
            if options.langs or len(d["pos"]) + len(d["neg"]) >= 10:
                warnings.append(
                    f"language {lang}: {len(d['pos'])} positive and {len(d['neg'])} negative "
                    f"examples; a language needs both classes, so it is left out"
                )
            continue
        chosen[lang] = {c: sorted(v, key=lambda e: _unit(options.seed, "pick", e.id))[:n] for c, v in d.items()}
    for lang in options.langs:
        if lang not in by_lang:
            warnings.append(f"language {lang}: no examples")
    return chosen, available, warnings


def split_heldout(
    chosen: dict[str, dict[str, list[Example]]], options: TrainOptions
) -> tuple[list[tuple[str, Example]], list[tuple[str, Example]]]:
    """(train, held-out) as (class, example); an exact share of each language and class is held out."""
    train, heldout = [], []
    for d in chosen.values():
        for cls, items in d.items():
            ordered = sorted(items, key=lambda e: _unit(options.seed, "heldout", e.id))
            k = int(round(len(ordered) * options.heldout_frac))
            heldout += [(cls, e) for e in ordered[:k]]
            train += [(cls, e) for e in ordered[k:]]
    # a seeded order: fastText (one thread) learns in file order, so the order is part of the model
    train.sort(key=lambda ce: ce[1].id)
    rng = np.random.default_rng(options.seed)
    train = [train[i] for i in rng.permutation(len(train))]
    return train, heldout


def train_classifier(
    positive_specs: list[str], negative_specs: list[str], run_dir: Path | None, options: TrainOptions, log: Any = print
) -> TrainResult:
    import fasttext

    positives = [e for s in positive_specs for e in load_examples(s, run_dir, options)]
    negatives = [e for s in negative_specs for e in load_examples(s, run_dir, options)]
    if not positives or not negatives:
        raise UsageError(f"need positive and negative examples; got {len(positives)} positive, {len(negatives)} negative")
    positives, negatives = identify_languages(positives), identify_languages(negatives)
    chosen, available, warnings = balance(positives, negatives, options)
    if not chosen:
        raise UsageError("no language has both positive and negative examples: " + "; ".join(warnings))
    train, heldout = split_heldout(chosen, options)
    featurise = featuriser(options.featuriser)
    label = {"pos": options.positive_label, "neg": options.negative_label}
    out_dir = Path(options.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / f"{options.name}.bin"
    p = options.params
    train_file = temp_path_for(out_dir / f"{options.name}.train.txt")
    try:
        with open(train_file, "w", encoding="utf-8") as f:
            for cls, e in train:
                f.write(f"__label__{label[cls]} {featurise(e.text[: options.max_chars])}\n")
        params = fasttext_args(
            train_file,
            dim=p.dim,
            epoch=p.epoch,
            lr=p.lr,
            word_ngrams=p.word_ngrams,
            min_count=p.min_count,
            bucket=p.bucket,
            seed=options.seed,
            loss=p.loss,
        )
        with atomic_path(model_path) as tmp:
            train_in_fresh_process(params, tmp)
    finally:
        train_file.unlink(missing_ok=True)  # the examples are recorded by id; the featurised copy is not kept
    fasttext.FastText.eprint = lambda *a, **k: None
    model = fasttext.load_model(str(model_path))
    sha = hashlib.sha256(model_path.read_bytes()).hexdigest()

    counts = {
        lang: {
            label[c]: {
                "available": available[lang][c],
                "train": sum(1 for cc, e in train if cc == c and (e.lang or "unknown") == lang),
                "heldout": sum(1 for cc, e in heldout if cc == c and (e.lang or "unknown") == lang),
            }
            for c in ("pos", "neg")
        }
        for lang in chosen
    }
    meta = {
        "name": options.name,
        "model": model_path.name,
        "model_sha256": sha,
        "featuriser": options.featuriser,
        "labels": [lab.removeprefix("__label__") for lab in model.get_labels()],
        "positive_label": options.positive_label,
        "negative_label": options.negative_label,
        "sources": {"positive": positive_specs, "negative": negative_specs, "run": str(run_dir) if run_dir else None},
        "counts": counts,
        "skipped_languages": {lang: {label[c]: n for c, n in d.items()} for lang, d in available.items() if lang not in chosen},
        "seed": options.seed,
        "heldout_frac": options.heldout_frac,
        "max_chars": options.max_chars,
        "max_per_class": options.max_per_class,
        "params": {**asdict(p), "thread": 1},
        "fasttext": _fasttext_version(),
        "warnings": warnings,
    }
    _write_json(out_dir / f"{options.name}.meta.json", meta)
    with atomic_path(out_dir / f"{options.name}.heldout.jsonl") as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for cls, e in heldout:
                f.write(
                    json.dumps(
                        {"id": e.id, "label": label[cls], "lang": e.lang or "unknown", "file": e.file, "line": e.line},
                        ensure_ascii=False,
                    )
                    + "\n"
                )
    evaluation = evaluate(model_path, heldout, options)
    _write_json(out_dir / f"{options.name}.eval.json", evaluation)
    for w in warnings:
        log(f"warning: {w}")
    return TrainResult(model_path, meta, evaluation)


def evaluate(model_path: Path, heldout: list[tuple[str, Example]], options: TrainOptions) -> dict[str, Any]:
    """Metrics per language (and over all) of the saved model on the held-out examples, as a pipeline
    would score them: the classify stage's own loading, featurising and prediction."""
    from datapipe.classify.model import Classifier

    clf = Classifier.load(model_path)
    pos = clf.labels.index(options.positive_label)
    texts = [e.text[: options.max_chars] for _, e in heldout]
    scores = clf.scores(texts)[:, pos] if texts else np.zeros(0)
    is_pos = np.array([c == "pos" for c, _ in heldout], dtype=bool)
    langs = np.array([e.lang or "unknown" for _, e in heldout], dtype=object)
    per_lang = {lang: binary_metrics(scores[langs == lang], is_pos[langs == lang]) for lang in sorted(set(langs))}
    return {
        "model": model_path.name,
        "positive_label": options.positive_label,
        "threshold": 0.5,
        "heldout_file": f"{options.name}.heldout.jsonl",
        "per_lang": per_lang,
        "all": binary_metrics(scores, is_pos),
    }


def report_lines(evaluation: dict[str, Any]) -> list[str]:
    def f(v: Any) -> str:
        return "   -  " if v is None else f"{v:6.3f}"

    lines = [
        f"held-out evaluation (positive = {evaluation['positive_label']}, score >= {evaluation['threshold']}):",
        f"  {'lang':<8} {'pos':>6} {'neg':>6} {'precision':>9} {'recall':>6} {'F1':>6} {'AUC':>6}",
    ]
    rows = [*evaluation["per_lang"].items(), ("all", evaluation["all"])]
    for lang, m in rows:
        lines.append(
            f"  {lang:<8} {m['n_pos']:>6} {m['n_neg']:>6}    {f(m['precision'])} {f(m['recall'])} {f(m['f1'])} {f(m['auc'])}"
        )
    return lines


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def _fasttext_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("fasttext-numpy2", "fasttext", "fasttext-wheel"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return None


def labels_from_run(run_dir: Path, query: str) -> tuple[list[str], list[str], list[Any], str]:
    """(ids, texts, labels, label column) of a ``--labels`` query over the run's audit database.

    The query returns ``id`` and one label column (an annotation column such as ``llm_edu_score``,
    or any expression of it); the texts of those ids come from the run's kept and rejected files,
    through the same confined connection as ``datapipe sql`` and ``explain``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from datapipe.audit.sql import reading, run_query

    table = run_query(run_dir, query)
    cols = table.column_names
    if "id" not in cols:
        raise UsageError(f"--labels: the query returns no id column (columns: {', '.join(cols)}); select id and one label")
    others = [c for c in cols if c != "id"]
    if len(others) != 1:
        raise UsageError(
            f"--labels: the query returns {len(others)} columns besides id ({', '.join(others) or 'none'}); "
            f"select id and exactly one label column, e.g. select id, llm_edu_score from documents where llm_error is null"
        )
    label = others[0]
    column = table[label]
    kind = column.type
    if pa.types.is_decimal(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
        column = pc.cast(column, pa.float64() if not pa.types.is_integer(kind) else pa.int64())
    elif not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_boolean(kind)):
        raise UsageError(
            f"--labels: column {label!r} is {kind}; a label is a number (a regressor), a string or a boolean (a classifier)"
        )
    ids = [str(i) for i in table["id"].to_pylist()]
    if not ids:
        raise UsageError("--labels: the query returned no rows")
    texts: dict[str, str] = {}
    wanted = pa.table({"id": pa.array(sorted(set(ids)), pa.string())})
    with reading(run_dir, text_views=True) as con:
        con.register("_labelled", wanted)
        for view in ("kept_docs", "rejected_docs"):
            for doc_id, text in con.execute(f"SELECT v.id, v.text FROM {view} v JOIN _labelled USING (id)").fetchall():
                texts.setdefault(doc_id, text)
    missing = [i for i in ids if i not in texts]
    if missing:
        raise UsageError(
            f"--labels: {len(missing)} of {len(ids)} ids are no document of {run_dir} (the first: {missing[0]!r}); "
            f"select the ids from documents, kept_docs or rejected_docs"
        )
    return ids, [texts[i] for i in ids], column.to_pylist(), label


def fit_labels(run_dir: Path, query: str, out: Path, params: Any) -> Any:
    """``train-classifier --labels``: a classifier or regressor (``datapipe.classify.fit``) from a query's labels."""
    from datapipe.classify.fit import fit

    ids, texts, labels, column = labels_from_run(run_dir, query)
    return fit(ids, texts, labels, out, params, source=f"{column} of {run_dir}: {query}", what="--labels")


def fit_report_lines(evaluation: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}"

    counts = meta["counts"]
    per = ", ".join(f"{k} {n}" for k, n in counts["per_class"].items())
    lines = [f"trained on {counts['train']} of {counts['labelled']} labelled documents ({per}); {counts['heldout']} held out"]
    if evaluation["task"] == "regressor":
        centres = ", ".join(f"{k}={v:.3g}" for k, v in meta["centres"].items())
        lines.append(f"  bins (centres): {centres}")
        lines.append(
            f"  held-out: Spearman {f(evaluation['spearman'])}, MAE {f(evaluation['mae'])} "
            f"(arg-max bin {f(evaluation['mae_argmax_bin'])}, training mean {f(evaluation['mae_train_mean'])})"
        )
    else:
        lines.append(f"  held-out: accuracy {f(evaluation['accuracy'])}, macro F1 {f(evaluation['macro_f1'])}")
    return lines
