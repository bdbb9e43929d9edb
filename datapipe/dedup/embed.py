"""Document embeddings for semantic dedup: a static-embedding model folder, or fastText sentence vectors.

Both give one L2-normalised float32 vector per document (a zero row where a document has no token
the model knows), so a cosine is a dot product.

* ``StaticEmbedder``: a model2vec folder (``model.safetensors`` with tensor ``embeddings`` of shape
  (vocabulary, dim), optional ``weights`` (vocabulary,) and ``mapping`` (vocabulary,) as model2vec
  writes them, beside ``tokenizer.json``), or a sentence-transformers ``StaticEmbedding`` export
  (``0_StaticEmbedding/model.safetensors`` with tensor ``embedding.weight`` and
  ``0_StaticEmbedding/tokenizer.json``). A document's vector is the mean of its tokens' rows
  (tokenized without special tokens, the tokenizer's unknown token left out), normalised: what
  ``model2vec.StaticModel.encode(texts, max_length=None, normalize=True)`` returns (tested against
  the package where it is installed). Read here with safetensors and tokenizers, so the stage needs
  no model2vec (and no torch).
* ``FastTextEmbedder``: a fastText unsupervised model trained on the run's own text
  (``train_fasttext``); a document is its normalised tokens (``datapipe.dedup.shingles.tokens``:
  one token per Han/kana character, one per Latin word) joined by spaces, and its vector is
  fastText's sentence vector, normalised.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np


class EmbedError(ValueError):
    """A model folder that cannot be read as a static-embedding model."""


class Embedder(Protocol):
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, each row of norm 1 or all zeros."""
        ...


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to norm 1 (float32); zero rows stay zero."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norm = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norm, out=np.zeros_like(vectors), where=norm > 0)


_LAYOUTS = (  # (safetensors file, tokenizer file, embedding tensor): model2vec, sentence-transformers
    ("model.safetensors", "tokenizer.json", "embeddings"),
    ("0_StaticEmbedding/model.safetensors", "0_StaticEmbedding/tokenizer.json", "embedding.weight"),
)


def static_model_files(folder: Path) -> tuple[Path, Path, str]:
    """The (weights, tokenizer, tensor name) of a static-embedding model folder, or EmbedError."""
    for weights, tokenizer, tensor in _LAYOUTS:
        if (folder / weights).is_file() and (folder / tokenizer).is_file():
            return folder / weights, folder / tokenizer, tensor
    raise EmbedError(
        f"{folder} is not a static-embedding model folder: it needs model.safetensors and tokenizer.json "
        f"(model2vec) or 0_StaticEmbedding/model.safetensors and 0_StaticEmbedding/tokenizer.json (sentence-transformers)"
    )


class StaticEmbedder:
    """Mean of token vectors of a static-embedding model folder (model2vec / sentence-transformers)."""

    def __init__(self, folder: Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        weights_path, tokenizer_path, tensor = static_model_files(Path(folder))
        tensors = load_file(str(weights_path))
        if tensor not in tensors:
            raise EmbedError(f"{weights_path} has no tensor {tensor!r} (it has {', '.join(sorted(tensors))})")
        self.embeddings = np.asarray(tensors[tensor], dtype=np.float32)
        self.weights = tensors.get("weights")  # model2vec's per-token weights (vocabulary quantisation)
        self.mapping = tensors.get("mapping")  # model2vec's token -> row of embeddings
        self.dim = int(self.embeddings.shape[1])
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.unk_id = _unk_token_id(self.tokenizer)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        encodings = self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        for i, enc in enumerate(encodings):
            ids = np.asarray(enc.ids, dtype=np.int64)
            if self.unk_id is not None:
                ids = ids[ids != self.unk_id]
            if len(ids) == 0:
                continue
            rows = self.embeddings[self.mapping[ids] if self.mapping is not None else ids]
            if self.weights is not None:
                rows = rows * self.weights[ids][:, None]
            out[i] = rows.mean(axis=0)
        return normalise(out)


def _unk_token_id(tokenizer: object) -> int | None:
    """The id of the tokenizer's unknown token (left out of the mean, as model2vec does), or None."""
    model = tokenizer.model  # type: ignore[attr-defined]
    if hasattr(model, "unk_token"):
        token = model.unk_token
        return None if token is None else tokenizer.token_to_id(token)  # type: ignore[attr-defined]
    unk = json.loads(tokenizer.to_str())["model"].get("unk_id")  # type: ignore[attr-defined]
    return None if unk is None else int(unk)


def fasttext_line(text: str) -> str:
    """A document as fastText reads it: its normalised tokens joined by single spaces, one line."""
    from datapipe.dedup.shingles import tokens

    return " ".join(tokens(text or ""))


class FastTextEmbedder:
    """Sentence vectors of a fastText unsupervised model, less their mean over the training text
    (``center_path``), normalised.

    Raw fastText sentence vectors of any two documents have cosines of 0.97-0.999 (a mean of word
    vectors is dominated by the directions every text shares); removing the common mean, as SIF
    embeddings do, spreads unrelated documents out (99.9th percentile of 10,000 random pairs of
    English Wikipedia: 0.997 raw, 0.89 centred) while copies stay near 1."""

    def __init__(self, path: Path) -> None:
        import fasttext

        fasttext.FastText.eprint = lambda *a, **k: None  # the load warning goes to stderr otherwise
        self.model = fasttext.load_model(str(path))
        self.dim = int(self.model.get_dimension())
        center = center_path(path)
        self.center = np.load(center) if center.is_file() else np.zeros(self.dim, np.float32)

    def raw(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            line = fasttext_line(text)
            if line:
                out[i] = self.model.get_sentence_vector(line)
        return out

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        raw = self.raw(texts)
        empty = ~raw.any(axis=1)
        out = normalise(raw - self.center)
        out[empty] = 0  # no token: no vector (not minus the mean)
        return out


def center_path(model: Path) -> Path:
    return Path(str(model) + ".center.npy")


_TRAIN_IN_CHILD = """
import ctypes, json, sys
import fasttext
try:  # large allocations as fresh, zeroed mappings (why: train_fasttext)
    ctypes.CDLL("libc.so.6").mallopt(-3, 4096)
except (OSError, AttributeError):
    pass
args = json.loads(sys.argv[1])
fasttext.FastText.eprint = lambda *a, **k: None
fasttext.train_unsupervised(**args["params"]).save_model(args["out"])
"""


def train_fasttext(texts: Sequence[str], out: Path, *, dim: int, epoch: int, seed: int, min_count: int = 2) -> None:
    """Train fastText skip-gram vectors on ``texts`` (in an order drawn from ``seed``), saved to ``out``.

    One thread and a seed make fastText's updates deterministic; it runs in a new Python process
    because with ``thread=1`` fastText leaves part of its input matrix as the allocator hands it
    over, which is only zero in a fresh process (the same reason as
    ``datapipe.train.classifier.train_in_fresh_process``). Character n-grams (2-4) give vectors to
    words seen once, and ``bucket`` is kept small so the model stays tens of MB."""
    import subprocess
    import sys
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        corpus = Path(tmp) / "corpus.txt"
        with open(corpus, "w", encoding="utf-8") as f:
            # train_unsupervised takes no seed: the seed orders the lines instead (fastText learns in file order)
            for i in np.random.default_rng(seed).permutation(len(texts)):
                line = fasttext_line(texts[int(i)])
                if line:
                    f.write(line + "\n")
        params = {
            "input": str(corpus),
            "model": "skipgram",
            "dim": dim,
            "epoch": epoch,
            "minCount": min_count,
            "minn": 2,
            "maxn": 4,
            "bucket": 100_000,
            "thread": 1,
            "verbose": 0,
        }
        model = Path(tmp) / "model.bin"
        proc = subprocess.run(
            [sys.executable, "-c", _TRAIN_IN_CHILD, json.dumps({"params": params, "out": str(model)})],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            lines = (proc.stderr or "").strip().splitlines()
            raise RuntimeError(f"fastText training failed: {lines[-1] if lines else f'exit code {proc.returncode}'}")
        raw = FastTextEmbedder(model).raw(texts)
        center = raw[raw.any(axis=1)].astype(np.float64).mean(axis=0) if raw.any() else np.zeros(dim)
        np.save(Path(tmp) / "center.npy", center.astype(np.float32))
        (Path(tmp) / "center.npy").replace(center_path(out))
        model.replace(out)  # atomic, and last: a model file means its centre is there too


_LOADED: dict[tuple[str, str], Embedder] = {}


def load_embedder(kind: str, path: Path) -> Embedder:
    """The embedder of a model folder (``static``) or fastText file (``fasttext``), loaded once per process."""
    # Keyed by the file's size and time too: a long-lived worker must not keep a model retrained since.
    stat = (static_model_files(Path(path))[0] if kind == "static" else Path(path)).stat()
    key = (kind, f"{path}:{stat.st_size}:{stat.st_mtime_ns}")
    if key not in _LOADED:
        _LOADED[key] = StaticEmbedder(path) if kind == "static" else FastTextEmbedder(path)
    return _LOADED[key]
