"""A model2vec-layout static-embedding model built from texts (no hub, no download): the semantic
stage's tests and ``bench/gpu/gpu_checks.py`` embed real documents with it."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np


def build_static_model(texts: list[str], folder: Path, dim: int = 128, seed: int = 0) -> Path:
    """model2vec layout: model.safetensors (embeddings, weights) + tokenizer.json (words, single Han characters)."""
    from safetensors.numpy import save_file
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

    pre = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Split(Regex("[\u3400-\u9fff]"), "isolated")])
    df: Counter[str] = Counter()
    for t in texts:
        df.update({w for w, _ in pre.pre_tokenize_str(re.sub(r"[^\w\s]", " ", t.lower()))})
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(sorted(df))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    # punctuation is not a token (as a stop-word list would do): the copies are re-punctuated
    tok.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.Replace(Regex(r"[^\w\s]"), " ")])
    tok.pre_tokenizer = pre
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    emb = np.random.default_rng(seed).standard_normal((len(vocab), dim)).astype(np.float32)
    weights = np.array([math.log((1 + len(texts)) / (1 + df.get(w, 0))) for w in vocab], np.float32)
    save_file({"embeddings": emb, "weights": weights}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "model2vec", "normalize": True, "hidden_dim": dim}))
    return folder
