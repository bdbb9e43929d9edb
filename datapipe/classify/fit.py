"""A fastText model fitted to one label per document: a classifier for string or boolean labels, a
regressor for numbers. Used by ``datapipe train-classifier --labels`` and by the classify stage's
``train:`` models (which fit on the run's own annotated documents).

fastText has no regression loss, so a regressor is a classifier over label *bins* whose output is
the expected value of the bins' centres under the predicted probabilities:
``score = sum_k p_k * centre_k``. An integer label with at most ``max_classes`` distinct values (an
LLM's 0-5 grade) gets one bin per value, other numbers ``bins`` quantile bins; a bin with fewer than
``min_per_class`` training documents is merged into its neighbour, and each bin is centred on the mean
label of its training documents (a lone grade's bin: the grade itself). The expected value is
continuous, so it ranks documents (percentile buckets) more finely than the arg-max class, and it
stays in the labels' range and units. Its quality on the held-out share is recorded as Spearman's
rank correlation and the mean absolute error, beside those of always predicting the training mean.

Reproducible as ``train-classifier`` is: the held-out share and the training order come from a
seeded hash of the ids, and fastText trains with one thread in a fresh process
(``train_in_fresh_process``), so the same rows and seed give the same model bytes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.classify.features import CJK_V1, featuriser
from datapipe.classify.model import LABEL_PREFIX, Classifier, label_slug, meta_path
from datapipe.errors import UsageError
from datapipe.storage.atomic import atomic_path, temp_path_for

REGRESSOR, CLASSIFIER = "regressor", "classifier"
SCORE = "score"  # a regressor's one output: column cls_<model>_score


@dataclass(frozen=True)
class FitParams:
    """What decides the model besides its rows; recorded in its meta file."""

    seed: int = 0
    heldout_frac: float = 0.1
    min_per_class: int = 5  # training documents each class (or bin) needs at least
    bins: int = 5  # quantile bins of a regressor whose labels are not a few integers
    max_classes: int = 11  # integer labels with at most this many values: one bin each (0-10 grades)
    max_chars: int = 100_000
    featuriser: str = CJK_V1
    dim: int = 64
    epoch: int = 25
    lr: float = 0.5
    word_ngrams: int = 2
    min_count: int = 1
    bucket: int = 200_000


@dataclass
class FitResult:
    model: Path
    meta: dict[str, Any]
    evaluation: dict[str, Any]


def task_of(values: list[Any]) -> str:
    """Numbers (not booleans) are regressed; strings and booleans are classes."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return REGRESSOR
    return CLASSIFIER


def _hash(seed: int, salt: str, key: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{salt}:{key}".encode(), digest_size=8).digest(), "big")


def class_name(value: Any) -> str:
    """A label value as a fastText class: booleans as true/false, the rest as text without whitespace."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "_".join(str(value).split()) or "_"


def make_bins(train_labels: np.ndarray, p: FitParams) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(bin names, upper edges for np.digitize, centres) of a regressor, from its training labels only.

    A few integer values (a 0-5 grade) get a bin each, other numbers ``bins`` quantile bins; then a bin
    with fewer than ``min_per_class`` documents is merged into its smaller neighbour (few documents get
    the top grade), and each centre is the mean label of its bin's documents."""
    values = np.unique(train_labels)
    if len(values) <= p.max_classes and np.all(values == np.round(values)):
        edges = list((values[:-1] + values[1:]) / 2.0)
    else:
        edges = list(np.unique(np.quantile(train_labels, np.linspace(0, 1, p.bins + 1)[1:-1])))
    while edges:
        counts = np.bincount(np.digitize(train_labels, edges, right=True), minlength=len(edges) + 1)
        k = int(np.argmin(counts))
        if counts[k] >= p.min_per_class:
            break
        # merge bin k with its smaller neighbour: drop the edge between them
        left = counts[k - 1] if k > 0 else np.inf
        right = counts[k + 1] if k < len(edges) else np.inf
        del edges[k - 1 if left <= right else k]
    which = np.digitize(train_labels, edges, right=True)
    centres = np.array([train_labels[which == k].mean() for k in range(len(edges) + 1)])
    return [f"b{i}" for i in range(len(edges) + 1)], np.array(edges), centres


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rank correlation (ties get their average rank); None when either side is constant."""
    if len(a) < 2:
        return None
    ra, rb = _ranks(np.asarray(a, np.float64)), _ranks(np.asarray(b, np.float64))
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), np.float64)
    sx = x[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sx)) + 1]
    ends = np.r_[starts[1:], len(x)]
    for lo, hi in zip(starts, ends):
        ranks[order[lo:hi]] = (lo + hi - 1) / 2.0
    return ranks


def expected_values(probs: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """A regressor's score: the probability-weighted mean of its bins' centres (rows renormalised)."""
    total = probs.sum(axis=1, keepdims=True)
    total[total == 0] = 1.0
    return ((probs / total) @ centres).astype(np.float32)


_TRAIN_IN_CHILD = """
import ctypes, json, sys
import fasttext
try:  # large allocations as fresh, zeroed mappings (see train_in_fresh_process)
    ctypes.CDLL("libc.so.6").mallopt(-3, 4096)
except (OSError, AttributeError):
    pass
args = json.loads(sys.argv[1])
fasttext.FastText.eprint = lambda *a, **k: None
fasttext.train_supervised(**args["params"]).save_model(args["out"])
"""


def train_in_fresh_process(params: dict[str, Any], out: Path) -> None:
    """``fasttext.train_supervised(**params)`` saved to ``out``, in a new Python process.

    With ``thread=1`` fastText (0.9.x and the fasttext-numpy2 build) initialises only part of its
    input matrix (``DenseMatrix::uniform`` fills one block per thread) and leaves the rest as the
    allocator hands it over. Fresh pages are zero, but memory reused within a process is not: in
    a long-lived process (a test session, a notebook) the same call gave different model bytes or
    failed with "Encountered NaN". A new process whose large allocations are fresh mappings
    (glibc's ``M_MMAP_THRESHOLD`` fixed at one page) starts the matrix from zeros every time, so
    training is reproducible wherever it is called from.
    """
    proc = subprocess.run(
        [sys.executable, "-c", _TRAIN_IN_CHILD, json.dumps({"params": params, "out": str(out)})], capture_output=True, text=True
    )
    if proc.returncode != 0:
        lines = (proc.stderr or "").strip().splitlines()
        raise RuntimeError(f"fastText training failed: {lines[-1] if lines else f'exit code {proc.returncode}'}")


def fasttext_args(
    train_file: Path, *, dim: int, epoch: int, lr: float, word_ngrams: int, min_count: int, bucket: int, seed: int, loss: str
) -> dict[str, Any]:
    """fastText's ``train_supervised`` arguments for every datapipe classifier (a stage's model fitted in
    a run, ``datapipe train-classifier``): one thread, so a seed gives the same model bytes; no
    character n-grams, which the featuriser makes itself; quiet."""
    return {
        "input": str(train_file),
        "dim": dim,
        "epoch": epoch,
        "lr": lr,
        "wordNgrams": word_ngrams,
        "minCount": min_count,
        "bucket": bucket,
        "loss": loss,
        "minn": 0,
        "maxn": 0,
        "thread": 1,
        "seed": seed,
        "verbose": 0,
    }


def fasttext_params(p: FitParams, train_file: Path) -> dict[str, Any]:
    return fasttext_args(
        train_file,
        dim=p.dim,
        epoch=p.epoch,
        lr=p.lr,
        word_ngrams=p.word_ngrams,
        min_count=p.min_count,
        bucket=p.bucket,
        seed=p.seed,
        loss="softmax",
    )


def rows_key(ids: list[str], labels: list[Any], p: FitParams, source: str) -> str:
    """What a fitted model depends on, hashed: a model whose meta records this key is the same model."""
    h = hashlib.sha256(json.dumps({"params": asdict(p), "source": source}, sort_keys=True).encode())
    for i, v in sorted(zip(ids, labels), key=lambda r: r[0]):
        h.update(json.dumps([i, v]).encode() + b"\n")
    return h.hexdigest()


def fit(
    ids: list[str], texts: list[str], labels: list[Any], out: Path, p: FitParams, source: str, what: str = "labels"
) -> FitResult:
    """Fit a classifier or regressor to (id, text, label) rows and write ``out`` (the model) with its
    ``.meta.json`` and ``.eval.json`` beside it. ``what`` names the labels in error messages."""
    keep = [i for i, v in enumerate(labels) if v is not None and isinstance(texts[i], str) and texts[i].strip()]
    ids, texts, labels = [ids[i] for i in keep], [texts[i] for i in keep], [labels[i] for i in keep]
    if len(set(ids)) != len(ids):
        dup = next(i for i, n in Counter(ids).items() if n > 1)
        raise UsageError(f"{what}: id {dup!r} has more than one label; give each document one row")
    task = task_of(labels)
    order = sorted(range(len(ids)), key=lambda i: _hash(p.seed, "heldout", ids[i]))
    n_held = int(round(len(ids) * p.heldout_frac))
    held, train = sorted(order[:n_held]), order[n_held:]
    train.sort(key=lambda i: ids[i])
    rng = np.random.default_rng(p.seed)
    train = [train[i] for i in rng.permutation(len(train))]  # fastText learns in file order: a seeded one
    if task == REGRESSOR:
        y = np.array(labels, np.float64)
        names, edges, centres = make_bins(y[train], p)
        classes = [names[k] for k in np.digitize(y, edges, right=True)]
    else:
        classes = [class_name(v) for v in labels]
        names = sorted(set(classes[i] for i in train))
        centres = np.zeros(0)
    counts = Counter(classes[i] for i in train)
    small = {c: n for c, n in counts.items() if n < p.min_per_class}
    if len(counts) < 2 or small:
        units = "bins" if task == REGRESSOR else "classes"
        shown = ", ".join(f"{c}: {n}" for c, n in sorted(small.items() or counts.items(), key=lambda cn: (cn[1], cn[0]))[:8])
        more = f" and {len(small) - 8} more" if len(small) > 8 else ""
        raise UsageError(
            f"{what}: too few labels to learn from: {len(counts)} {units} in {len(train)} training documents, "
            f"{len(small)} with fewer than {p.min_per_class} ({shown or 'none'}{more}); at least two are needed, "
            f"each with {p.min_per_class} or more",
            hint="label more documents (a larger annotate sample), or merge rare values in the query (CASE WHEN ...); "
            "a free-text answer is no label",
        )
    slugs: dict[str, str] = {}
    for c in sorted(counts):
        other = slugs.setdefault(label_slug(c), c)
        if other != c:
            raise UsageError(
                f"{what}: labels {other!r} and {c!r} would name the same score column, cls_<model>_{label_slug(c)}; "
                f"column names keep a-z, 0-9 and _ only",
                hint="map the labels to distinct ASCII names in the query (CASE WHEN ... THEN 'history' ...)",
            )
    featurise = featuriser(p.featuriser)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    train_file = temp_path_for(out.with_name(out.name + ".train.txt"))
    try:
        with open(train_file, "w", encoding="utf-8") as f:
            for i in train:
                f.write(f"{LABEL_PREFIX}{classes[i]} {featurise(texts[i][: p.max_chars])}\n")
        with atomic_path(out) as tmp:
            train_in_fresh_process(fasttext_params(p, train_file), tmp)
    finally:
        train_file.unlink(missing_ok=True)
    clf = load_uncached(out, p.featuriser)
    meta: dict[str, Any] = {
        "name": out.stem,
        "model": out.name,
        "model_sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
        "task": task,
        "featuriser": p.featuriser,
        "labels": clf.labels,
        "source": source,
        "rows_key": rows_key(ids, labels, p, source),
        "counts": {"labelled": len(ids), "train": len(train), "heldout": n_held, "per_class": dict(sorted(counts.items()))},
        "params": asdict(p),
    }
    if task == REGRESSOR:
        meta["centres"] = {names[k]: float(c) for k, c in enumerate(centres)}
        meta["edges"] = [float(e) for e in edges]
    held_texts = [texts[i][: p.max_chars] for i in held]
    probs = clf.scores(held_texts)
    evaluation = evaluate(
        task,
        probs,
        clf.labels,
        [labels[i] for i in held],
        meta,
        float(np.mean([labels[i] for i in train])) if task == REGRESSOR else None,
    )
    evaluation["heldout_ids"] = [ids[i] for i in held]
    meta["eval"] = {k: v for k, v in evaluation.items() if k != "heldout_ids"}
    write_json(meta_path(out), meta)
    write_json(out.with_name(out.stem + ".eval.json"), evaluation)
    return FitResult(out, meta, evaluation)


def evaluate(
    task: str, probs: np.ndarray, labels: list[str], truth: list[Any], meta: dict[str, Any], train_mean: float | None
) -> dict[str, Any]:
    """Held-out quality: Spearman and MAE (with the constant-mean baseline's MAE) for a regressor,
    accuracy and macro F1 for a classifier."""
    n = len(truth)
    if task == REGRESSOR:
        centres = np.array([meta["centres"][lab] for lab in labels])
        pred = expected_values(probs, centres) if n else np.zeros(0)
        y = np.array(truth, np.float64)
        argmax = centres[probs.argmax(axis=1)] if n else np.zeros(0)
        return {
            "task": task,
            "heldout": n,
            "spearman": spearman(pred, y),
            "mae": float(np.abs(pred - y).mean()) if n else None,
            "mae_argmax_bin": float(np.abs(argmax - y).mean()) if n else None,
            "mae_train_mean": float(np.abs(train_mean - y).mean()) if n and train_mean is not None else None,
        }
    y_cls = [class_name(v) for v in truth]
    pred_cls = [labels[j] for j in probs.argmax(axis=1)] if n else []
    f1s = []
    for c in sorted(set(y_cls) | set(pred_cls)):
        tp = sum(1 for a, b in zip(y_cls, pred_cls) if a == b == c)
        fp = sum(1 for a, b in zip(y_cls, pred_cls) if b == c and a != c)
        fn = sum(1 for a, b in zip(y_cls, pred_cls) if a == c and b != c)
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return {
        "task": task,
        "heldout": n,
        "accuracy": sum(a == b for a, b in zip(y_cls, pred_cls)) / n if n else None,
        "macro_f1": float(np.mean(f1s)) if f1s else None,
    }


def load_uncached(path: Path, featuriser_name: str) -> Classifier:
    """A fitted model loaded afresh: the per-process model cache is keyed by path, and a model fitted
    again at the same path (another sample) must not be served from it."""
    import fasttext

    fasttext.FastText.eprint = lambda *a, **k: None
    model = fasttext.load_model(str(path))
    return Classifier(path, model, featuriser_name, [lab.removeprefix(LABEL_PREFIX) for lab in model.get_labels()])


def model_outputs(meta: dict[str, Any] | None, labels: list[str]) -> list[str]:
    """The score columns' label parts of a model: ``score`` for a regressor, else its labels."""
    return [SCORE] if meta and meta.get("task") == REGRESSOR else list(labels)


def output_scores(meta: dict[str, Any] | None, labels: list[str], probs: np.ndarray) -> np.ndarray:
    """The model's outputs from its label probabilities, in ``model_outputs`` order."""
    if meta and meta.get("task") == REGRESSOR:
        centres = np.array([float(meta["centres"][lab]) for lab in labels])
        return expected_values(probs, centres)[:, None]
    return probs


def write_json(path: Path, data: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
