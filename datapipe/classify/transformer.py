"""Hugging Face sequence-classification and regression models from a local folder, scored in batches.

A model is a folder as ``save_pretrained`` writes it: ``config.json``, the weights
(``model.safetensors`` or ``pytorch_model.bin``) and the tokenizer's files (``tokenizer.json``, or
``tokenizer_config.json`` with a vocabulary). It is read with ``local_files_only`` and the hub
switched off (``HF_HUB_OFFLINE``): a run never downloads, and a missing folder or file is an error
naming it. ``transformers`` (and ``torch``) are imported only when such a model is used: they are
the optional ``transformers`` extra.

Scores: a classification head gives the softmax probability of every label (``config.json``'s
``id2label``, in index order); a regression head (one output, or ``problem_type: regression``) gives
its single logit, under the label ``score``. Texts are truncated to ``max_tokens`` tokens (special
tokens included) and scored ``batch_size`` at a time, ordered by length so that a batch pads little;
a padded position is masked, so each score is the one the model gives the text alone (to float
rounding, tested to 1e-5 against ``transformers`` called directly).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datapipe.errors import UsageError
from datapipe.runtime.process_cache import process_cache

EXTRA = "transformers"  # pip install 'datapipe[transformers]'
REGRESSION_LABEL = "score"
DEFAULT_MAX_TOKENS = 512
DEFAULT_BATCH_SIZE = 32
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_LOADED: dict[tuple[str, str], Any] = process_cache({})  # one loaded model per worker process, folder and device


class TransformerModelError(UsageError):
    """A transformers model folder that cannot be used: missing, incomplete, or the library is not installed."""


def folder_problem(path: Path) -> str | None:
    """What makes ``path`` unusable as a model folder (cheap: files only, nothing loaded), else None."""
    if not path.exists():
        return f"model folder not found: {path}"
    if not path.is_dir():
        return f"{path} is not a folder (a transformers model is a folder with config.json and a tokenizer)"
    if not (path / "config.json").is_file():
        return f"{path} has no config.json: not a folder written by save_pretrained"
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        return f"{path} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): save the tokenizer into the folder too"
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        return f"{path} has no weights ({', '.join(WEIGHT_FILES[::2])})"
    return None


def read_config(path: Path) -> dict[str, Any]:
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise TransformerModelError(f"{path / 'config.json'} is not a JSON object")
    return config


def is_regression(config: dict[str, Any]) -> bool:
    return config.get("problem_type") == "regression" or _num_labels(config) == 1


def model_labels(config: dict[str, Any]) -> list[str]:
    """The score labels of a model's config: ``id2label`` in index order, or ``score`` for regression."""
    if is_regression(config):
        return [REGRESSION_LABEL]
    id2label = config.get("id2label") or {}
    n = _num_labels(config)
    return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(n)]


def _num_labels(config: dict[str, Any]) -> int:
    if isinstance(config.get("id2label"), dict) and config["id2label"]:
        return len(config["id2label"])
    return int(config.get("num_labels", 2))


def default_max_tokens(config: dict[str, Any]) -> int:
    """512 tokens, or fewer where the model has fewer positions."""
    longest = max_positions(config)
    return min(DEFAULT_MAX_TOKENS, longest) if longest else DEFAULT_MAX_TOKENS


def max_positions(config: dict[str, Any]) -> int | None:
    """The longest input the model's position embeddings allow, when its config says."""
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return None


def import_torch_transformers() -> tuple[Any, Any]:
    """torch and transformers, imported offline (never asking the hub), or a clear error naming the extra."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never ask the hub, even for a file that is missing
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise TransformerModelError(
            f"a transformers model needs torch and transformers, which are not installed ({exc})",
            hint=f"pip install 'datapipe[{EXTRA}]' (and torch for your machine)",
        ) from None
    return torch, transformers


def resolve_device(device: str) -> str:
    """``auto``: cuda where this process sees a GPU (a Ray task that asked for one), else cpu."""
    torch, _ = import_torch_transformers()
    has_gpu = bool(torch.cuda.is_available())
    if device == "auto":
        return "cuda" if has_gpu else "cpu"
    if device == "cuda" and not has_gpu:
        raise TransformerModelError(
            "device: cuda, but torch sees no GPU on this node (torch.cuda.is_available() is False)",
            hint="use device: auto (a GPU where there is one, else the CPU) or device: cpu",
        )
    return device


@dataclass
class TransformerClassifier:
    """A loaded model and tokenizer on one device, with the labels its scores have."""

    path: Path
    model: Any
    tokenizer: Any
    device: str
    labels: list[str]
    regression: bool

    @classmethod
    def load(cls, path: Path, device: str = "auto") -> TransformerClassifier:
        """The model of ``path``, loaded once per process and device (later calls return the same one)."""
        problem = folder_problem(path)
        if problem is not None:
            raise TransformerModelError(problem)
        where = resolve_device(device)
        key = (str(path.resolve()), where)
        if key not in _LOADED:
            _LOADED[key] = _load(path, where)
        model, tokenizer = _LOADED[key]
        config = read_config(path)
        return cls(path, model, tokenizer, where, model_labels(config), is_regression(config))

    def scores(self, texts: list[str], max_tokens: int, batch_size: int) -> np.ndarray:
        """float32 (len(texts), len(labels)): label probabilities, or the regression logit."""
        torch, _ = import_torch_transformers()
        out = np.zeros((len(texts), len(self.labels)), dtype=np.float32)
        # Longest first, in batches of similar length: padding is masked, so only speed changes.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                enc = self.tokenizer(
                    [texts[i] for i in rows], padding=True, truncation=True, max_length=max_tokens, return_tensors="pt"
                ).to(self.device)
                logits = self.model(**enc).logits.float()
                values = logits if self.regression else torch.softmax(logits, dim=-1)
                out[rows] = values.cpu().numpy()
        return out


def _load(path: Path, device: str) -> tuple[Any, Any]:
    torch, transformers = import_torch_transformers()
    transformers.utils.logging.disable_progress_bar()  # a bar per load in every worker's log says nothing
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = transformers.AutoModelForSequenceClassification.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:  # a folder transformers cannot read: say which
        raise TransformerModelError(f"cannot load {path} as a sequence-classification model: {exc}") from None
    if tokenizer.pad_token is None:  # GPT-style tokenizers have none; batches need one (masked anyway)
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id  # where a decoder head finds each text's last token
    model.eval()
    model.to(torch.device(device))
    return model, tokenizer
