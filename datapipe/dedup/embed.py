"""Document embeddings for semantic dedup: a static-embedding model folder, or fastText sentence vectors.

(WordLlama exports and Hugging Face encoders, which kind a model folder is, and loading an embedder
once per process: ``datapipe.dedup.embed_models``.)

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
  one token per Han/kana character, one per Latin word) joined by spaces, and its vector the
  idf-weighted mean of its word vectors with the directions all documents share removed
  (``FastTextEmbedder``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from datapipe.errors import UsageError


class EmbedError(UsageError):
    """A model folder that cannot be read as a static-embedding model (exit code 2: fix the folder or the option)."""


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
    """Document vectors from a fastText unsupervised model: the idf-weighted mean of its words' unit
    vectors (idf from the training text, ``idf_path``), less the mean over the training text and
    its projection on their top dim/8 principal directions (``post_path``), normalised.

    fastText's own ``get_sentence_vector`` (an unweighted mean) gives any two documents a cosine of
    0.97-0.999: the words and directions every text shares dominate. Weighting by idf and removing
    the common directions, as SIF embeddings do (Arora et al. 2017), leaves what sets a document
    apart (on 1,000 English Wikipedia articles the most similar of 10,000 unrelated pairs: 0.997
    raw, 0.95 centred, 0.88 with 8 directions removed; numbers: docs/stages/semantic.md)."""

    def __init__(self, path: Path) -> None:
        import fasttext

        fasttext.FastText.eprint = lambda *a, **k: None  # the load warning goes to stderr otherwise
        self.model = fasttext.load_model(str(path))
        self.dim = int(self.model.get_dimension())
        idf = json.loads(idf_path(path).read_text(encoding="utf-8")) if idf_path(path).is_file() else {}
        self.idf: dict[str, float] = idf.get("idf", {})
        self.unseen_idf = float(idf.get("unseen", 1.0))  # a word the training text never had: as rare as can be
        post = post_path(path)
        with np.load(post) if post.is_file() else _no_post(self.dim) as p:
            self.center, self.components = p["center"].astype(np.float64), p["components"].astype(np.float64)
        self._unit: dict[str, np.ndarray] = {}

    def _word(self, word: str) -> np.ndarray:
        vec = self._unit.get(word)
        if vec is None:
            v = self.model.get_word_vector(word).astype(np.float64)
            norm = np.linalg.norm(v)
            vec = v / norm if norm > 0 else v
            if len(self._unit) < 2_000_000:  # bounded: a long tail of one-off words is not kept
                self._unit[word] = vec
        return vec

    def raw(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            words = fasttext_line(text).split()
            if not words:
                continue
            counts: dict[str, int] = {}
            for w in words:
                counts[w] = counts.get(w, 0) + 1
            weights = np.array([n * self.idf.get(w, self.unseen_idf) for w, n in counts.items()])
            vectors = np.stack([self._word(w) for w in counts])
            total = weights.sum()
            if total > 0:
                out[i] = (weights @ vectors) / total
        return out

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        raw = self.raw(texts)
        empty = ~raw.any(axis=1)
        out = normalise(remove_common(raw, self.center, self.components))
        out[empty] = 0  # no token: no vector (not minus the mean)
        return out


def remove_common(raw: np.ndarray, center: np.ndarray, components: np.ndarray) -> np.ndarray:
    """Vectors less the mean and their projection on the common directions (rows of ``components``)."""
    x = raw.astype(np.float64) - center
    return x - (x @ components.T) @ components


def common_directions(raw: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean of the (non-zero) vectors and their top ``k`` principal directions."""
    x = raw[raw.any(axis=1)].astype(np.float64)
    if len(x) == 0:
        return np.zeros(raw.shape[1]), np.zeros((0, raw.shape[1]))
    center = x.mean(axis=0)
    _, _, vt = np.linalg.svd(x - center, full_matrices=False)
    return center, vt[: min(k, len(vt))]


def post_path(model: Path) -> Path:
    return Path(str(model) + ".common.npz")


class _no_post:
    def __init__(self, dim: int) -> None:
        self.arrays = {"center": np.zeros(dim), "components": np.zeros((0, dim))}

    def __enter__(self) -> dict[str, np.ndarray]:
        return self.arrays

    def __exit__(self, *exc: object) -> None:
        return None


def idf_path(model: Path) -> Path:
    return Path(str(model) + ".idf.json")


def document_idf(texts: Sequence[str]) -> dict[str, object]:
    """log((1 + documents) / (1 + documents with the word)) of every word of ``texts``, and the value
    of an unseen word; sorted, so the file's bytes depend on the text only."""
    import math

    df: dict[str, int] = {}
    for text in texts:
        for w in set(fasttext_line(text).split()):
            df[w] = df.get(w, 0) + 1
    n = len(texts)
    return {
        "idf": {w: round(math.log((1 + n) / (1 + c)), 6) for w, c in sorted(df.items())},
        "unseen": round(math.log(1 + n), 6),
    }


_TRAIN_IN_CHILD = """
import ctypes, json, os, resource, sys, time
args = json.loads(sys.argv[1])
if args["niceness"] is not None:  # the run's priority, not the Ray worker's (why: train_fasttext)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, args["niceness"])
    except OSError:  # below the parent's niceness needs CAP_SYS_NICE or RLIMIT_NICE: stays as it was
        pass
import fasttext
try:  # large allocations as fresh, zeroed mappings (why: train_fasttext)
    ctypes.CDLL("libc.so.6").mallopt(-3, 4096)
except (OSError, AttributeError):
    pass
fasttext.FastText.eprint = lambda *a, **k: None
started = time.perf_counter()
fasttext.train_unsupervised(**args["params"]).save_model(args["out"])
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"niceness": os.getpriority(os.PRIO_PROCESS, 0), "seconds": round(time.perf_counter() - started, 3),
                  "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3)}))
"""


def training_path(model: Path) -> Path:
    """What the training cost and at what priority: {documents, niceness, niceness_parent, seconds, cpu_seconds}."""
    return Path(str(model) + ".training.json")


def train_fasttext(
    texts: Sequence[str], out: Path, *, dim: int, epoch: int, seed: int, min_count: int = 2, niceness: int | None = None
) -> None:
    """Train fastText skip-gram vectors on ``texts`` (in an order drawn from ``seed``), saved to ``out``.

    One thread and a seed make fastText's updates deterministic; it runs in a new Python process
    because with ``thread=1`` fastText leaves part of its input matrix as the allocator hands it
    over, which is only zero in a fresh process (the same reason as
    ``datapipe.train.classifier.train_in_fresh_process``). Character n-grams (2-4) give vectors to
    words seen once, and ``bucket`` is kept small so the model stays tens of MB.

    ``niceness``: the priority the training runs at (the run's, ``StageContext.niceness``). In a Ray
    worker, which runs 15 steps nicer than the driver, the training would otherwise be the one long
    serial step of the run starved by everything else on the node (measured: 3% of a core, 600 of a
    904 s run). What it cost and at what priority is written beside the model (``training_path``)."""
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
            [sys.executable, "-c", _TRAIN_IN_CHILD, json.dumps({"params": params, "out": str(model), "niceness": niceness})],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            lines = (proc.stderr or "").strip().splitlines()
            raise RuntimeError(f"fastText training failed: {lines[-1] if lines else f'exit code {proc.returncode}'}")
        facts = {"documents": len(texts), "niceness_parent": os.getpriority(os.PRIO_PROCESS, 0)}
        facts |= json.loads(proc.stdout.strip().splitlines()[-1])
        training_path(model).write_text(json.dumps(facts, sort_keys=True) + "\n", encoding="utf-8")
        idf_path(model).write_text(json.dumps(document_idf(texts), ensure_ascii=False), encoding="utf-8")
        center, components = common_directions(FastTextEmbedder(model).raw(texts), max(1, dim // 8))
        with open(post_path(model), "wb") as f:
            np.savez(f, center=center, components=components)
        idf_path(model).replace(idf_path(out))
        post_path(model).replace(post_path(out))
        training_path(model).replace(training_path(out))
        model.replace(out)  # atomic, and last: a model file means its idf and common directions are there too
