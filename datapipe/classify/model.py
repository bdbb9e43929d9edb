"""Loading a fastText classifier with its metadata, and scoring texts with it in one batched call.

A model file ``NAME.bin`` (or ``.ftz``) may have ``NAME.meta.json`` beside it (written by
``datapipe train-classifier``): its ``featuriser`` says how texts were turned into tokens at
training time, and scoring uses the same one. A model without it (downloaded from elsewhere)
is given ``plain`` text, as fastText's own tools would.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.classify.features import PLAIN, featuriser
from datapipe.runtime.process_cache import process_cache

LABEL_PREFIX = "__label__"
_MODELS: dict[str, Any] = process_cache({})  # one loaded model per worker process and path


def meta_path(model_path: Path) -> Path:
    """``x.bin`` / ``x.ftz`` -> ``x.meta.json`` (any other name: the name plus ``.meta.json``)."""
    name = model_path.name
    stem = name[: -len(model_path.suffix)] if model_path.suffix in (".bin", ".ftz") else name
    return model_path.with_name(stem + ".meta.json")


def read_meta(model_path: Path) -> dict[str, Any] | None:
    path = meta_path(model_path)
    if not path.is_file():
        return None
    meta = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(meta, dict):
        raise ValueError(f"{path} is not a JSON object")
    return meta


def label_slug(label: str) -> str:
    """A label as it appears in a column name: lower case, runs of other characters as one ``_``."""
    return re.sub(r"[^0-9a-z]+", "_", label.removeprefix(LABEL_PREFIX).lower()).strip("_") or "label"


def column_name(model_name: str, label: str) -> str:
    return f"cls_{model_name}_{label_slug(label)}"


def load_fasttext(path: Path) -> Any:
    key = str(path)
    if key not in _MODELS:
        import fasttext

        fasttext.FastText.eprint = lambda *a, **k: None  # silence its load-time warning
        _MODELS[key] = fasttext.load_model(key)
    return _MODELS[key]


@dataclass
class Classifier:
    """A loaded model: its labels (without ``__label__``) and the featuriser its texts need."""

    path: Path
    model: Any
    featuriser: str
    labels: list[str]

    @classmethod
    def load(cls, path: Path, featuriser_name: str = "auto") -> Classifier:
        model = load_fasttext(path)
        if featuriser_name == "auto":
            meta = read_meta(path)
            featuriser_name = str(meta.get("featuriser", PLAIN)) if meta else PLAIN
        featuriser(featuriser_name)  # unknown names fail here, on the driver
        labels = [lab.removeprefix(LABEL_PREFIX) for lab in model.get_labels()]
        return cls(path, model, featuriser_name, labels)

    def featurise(self, texts: list[str]) -> list[str]:
        fn = featuriser(self.featuriser)
        return [fn(t) for t in texts]

    def scores(self, texts: list[str]) -> np.ndarray:
        """Probability of every label for every text: float32 array (len(texts), len(labels))."""
        return predict_all(self.model, self.featurise(texts), self.labels)


def predict_all(model: Any, lines: list[str], labels: list[str]) -> np.ndarray:
    """All labels' probabilities for featurised one-line texts, in ``labels`` order.

    Calls fastText's batched C++ predict directly: ``FastText.predict`` checks and copies each
    string in Python first, which the featurisers already guarantee (no newline).
    """
    out = np.zeros((len(lines), len(labels)), dtype=np.float32)
    if not lines:
        return out
    index = {LABEL_PREFIX + lab: j for j, lab in enumerate(labels)}
    all_labels, all_probs = model.f.multilinePredict([t + "\n" for t in lines], -1, 0.0, "replace")
    for i, (labs, probs) in enumerate(zip(all_labels, all_probs)):
        for lab, p in zip(labs, probs):
            out[i, index[lab]] = p
    np.minimum(out, 1.0, out=out)  # softmax in float can round to just above 1
    return out
