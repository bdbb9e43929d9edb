"""The semantic stage's model folders: which kind a folder is, and the embedder that reads it.

Three kinds of folder, told apart by their files (or named by the stage's ``model_kind``):

* ``model2vec``: a static-embedding model, model2vec's layout or a sentence-transformers
  ``StaticEmbedding`` export (``datapipe.dedup.embed.StaticEmbedder``).
* ``wordllama``: a WordLlama export as the ``wordllama`` package stores it (``WordLlama.load`` with
  ``cache_dir``): the token-embedding matrix in ``<name>_<dim>.safetensors`` (tensor
  ``embedding.weight``, float16 as the package ships it) and the tokenizer in
  ``<name>_tokenizer_config.json`` (a ``tokenizers`` JSON), either side by side or in the
  ``weights/`` and ``tokenizers/`` folders of its cache layout. A document's vector is the average
  of its tokens' rows (no special tokens, no truncation, the unknown token counted: what
  ``WordLlamaInference.embed(texts, norm=True)`` computes), normalised.
* ``transformers``: a Hugging Face encoder as ``save_pretrained`` writes it (``config.json``, the
  weights, the tokenizer), read with ``AutoModel`` and ``AutoTokenizer`` (``local_files_only``; torch
  and transformers imported only for this kind: the ``transformers`` extra). A document's vector is
  the mean of the last hidden states over its tokens (the attention mask: padding left out, the
  special tokens in, as sentence-transformers' mean pooling does), truncated to ``max_tokens``
  tokens, normalised. Texts go through the model ``batch_size`` at a time, longest first, so a
  batch pads little; padding is masked, so a vector does not depend on its batch (to float rounding).

Every embedder returns (len(texts), dim) float32 rows of norm 1, or zero rows for a document with
nothing to embed, so a cosine is a dot product.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from datapipe.dedup.embed import Embedder, EmbedError, FastTextEmbedder, StaticEmbedder, normalise, static_model_files
from datapipe.runtime.process_cache import process_cache

ModelKind = Literal["model2vec", "wordllama", "transformers"]
MODEL_KINDS: tuple[ModelKind, ...] = ("model2vec", "wordllama", "transformers")
WORDLLAMA_TENSOR = "embedding.weight"
DEFAULT_BATCH_SIZE = 32

LAYOUTS = (
    "model2vec (model.safetensors with tensor 'embeddings' + tokenizer.json, or a sentence-transformers "
    "StaticEmbedding export: 0_StaticEmbedding/model.safetensors + 0_StaticEmbedding/tokenizer.json); "
    "wordllama (<name>_<dim>.safetensors with tensor 'embedding.weight' + <name>_tokenizer_config.json, "
    "side by side or in weights/ and tokenizers/); transformers (a Hugging Face encoder: config.json, "
    "model.safetensors or pytorch_model.bin, and tokenizer.json or tokenizer_config.json)"
)


@dataclass(frozen=True)
class ModelFolder:
    """A model folder and what it is: its kind and the files its vectors depend on (the run's identity)."""

    path: Path
    kind: ModelKind
    files: tuple[Path, ...]


def model_folder(path: Path, kind: str = "auto") -> ModelFolder:
    """The kind and files of the model folder ``path`` (``kind``: one of MODEL_KINDS, or auto: found from
    its files; cheap: file names and safetensors headers only, nothing loaded), or EmbedError saying
    which layouts are read."""
    path = Path(path)
    if not path.is_dir():
        raise EmbedError(f"model folder not found: {path}")
    if kind != "auto" and kind not in MODEL_KINDS:
        raise EmbedError(f"unknown model kind {kind!r}; allowed: auto, {', '.join(MODEL_KINDS)}")
    kinds = MODEL_KINDS if kind == "auto" else tuple(k for k in MODEL_KINDS if k == kind)
    reasons = []
    for k in kinds:
        found = _FINDERS[k](path)
        if isinstance(found, tuple):
            return ModelFolder(path, k, found)
        reasons.append(f"not {k}: {found}")
    if kind == "auto":
        raise EmbedError(f"{path} is not a model folder of a kind the semantic stage reads; it reads {LAYOUTS}")
    raise EmbedError(f"{path} is not a {kind} model folder ({reasons[0].split(': ', 1)[1]}); the layouts read: {LAYOUTS}")


def _model2vec_files(path: Path) -> tuple[Path, ...] | str:
    try:
        weights, tokenizer, tensor = static_model_files(path)
    except EmbedError:
        return "no model.safetensors + tokenizer.json (or 0_StaticEmbedding/ with them)"
    names = _tensor_names(weights)
    if tensor not in names:  # a Hugging Face encoder has model.safetensors and tokenizer.json too
        return f"{weights.name} has no tensor {tensor!r}"
    return (weights, tokenizer)


def wordllama_files(path: Path) -> tuple[Path, Path] | str:
    """(weights, tokenizer) of a WordLlama folder, or why it is not one."""
    weights = [
        f
        for d in (path, path / "weights")
        for f in sorted(d.glob("*.safetensors"))
        if not f.stem.endswith("_binary") and WORDLLAMA_TENSOR in _tensor_names(f)
    ]
    tokenizers = [f for d in (path, path / "tokenizers") for f in sorted(d.glob("*_tokenizer_config.json"))]
    if not weights:
        return f"no .safetensors file with tensor {WORDLLAMA_TENSOR!r} in it or in weights/ (binary ones are not read)"
    if not tokenizers:
        return "no <name>_tokenizer_config.json in it or in tokenizers/"
    if len(weights) > 1 or len(tokenizers) > 1:
        many = [f.name for f in (weights if len(weights) > 1 else tokenizers)]
        return f"several candidates ({', '.join(many)}): keep the one to use in the folder"
    return (weights[0], tokenizers[0])


def _transformers_files(path: Path) -> tuple[Path, ...] | str:
    from datapipe.classify.transformer import folder_problem

    problem = folder_problem(path)
    if problem is not None:
        return problem
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"config.json cannot be read ({exc})"
    if not isinstance(config, dict) or not config.get("model_type") or config.get("model_type") == "model2vec":
        return "config.json names no Hugging Face model_type"
    # the weights, config and tokenizer decide the vectors: every file is part of the run's identity
    return tuple(f for f in sorted(path.iterdir()) if f.is_file() and not f.name.startswith("."))


_FINDERS = {"model2vec": _model2vec_files, "wordllama": wordllama_files, "transformers": _transformers_files}


def _tensor_names(file: Path) -> set[str]:
    """The tensor names of a safetensors file, from its header (no tensor read); empty if unreadable."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="np") as f:
            return set(f.keys())
    except Exception:  # noqa: BLE001 - not a safetensors file: not this layout
        return set()


class WordLlamaEmbedder:
    """Average of token rows of a WordLlama export, normalised (``WordLlamaInference.embed(norm=True)``)."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open
        from tokenizers import Tokenizer

        found = wordllama_files(Path(folder))
        if isinstance(found, str):
            raise EmbedError(f"{folder} is not a wordllama model folder: {found}")
        weights, tokenizer = found
        with safe_open(str(weights), framework="np") as f:
            # kept as stored (float16 in the package's exports: half the memory); rows are widened per document
            self.embeddings = f.get_tensor(WORDLLAMA_TENSOR)
        self.dim = int(self.embeddings.shape[1])
        self.tokenizer = Tokenizer.from_file(str(tokenizer))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        last = self.embeddings.shape[0] - 1
        for i, enc in enumerate(self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)):
            if not enc.ids:
                continue
            # WordLlama clips ids beyond its matrix (a tokenizer larger than the trimmed vocabulary)
            ids = np.minimum(np.asarray(enc.ids, dtype=np.int64), last)
            out[i] = self.embeddings[ids].astype(np.float32).mean(axis=0)
        return normalise(out)


class TransformerEmbedder:
    """Masked mean of a Hugging Face encoder's last hidden states, normalised; on ``device`` (a torch
    device: "cuda" where the stage's ``device`` resolved to a GPU, else the CPU)."""

    def __init__(
        self, folder: Path, max_tokens: int | None = None, batch_size: int | None = None, device: str | None = None
    ) -> None:
        from datapipe.classify.transformer import TransformerModelError, default_max_tokens, import_torch_transformers

        self.torch, transformers = import_torch_transformers()
        transformers.utils.logging.disable_progress_bar()
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            self.model = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:  # a folder transformers cannot read: say which
            raise TransformerModelError(f"cannot load {folder} as a Hugging Face encoder: {exc}") from None
        if self.tokenizer.pad_token is None:  # GPT-style tokenizers have none; batches need one (masked)
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        self.device = device or "cpu"
        self.model.eval().to(self.device)
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        self.max_tokens = max_tokens or default_max_tokens(config)
        self.batch_size = batch_size or DEFAULT_BATCH_SIZE
        self.dim = int(self.model.config.hidden_size)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        torch = self.torch
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Longest first, in batches of similar length: padding is masked, so only the speed changes.
        order = sorted(range(len(texts)), key=lambda i: (-len(texts[i]), i))
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                rows = [i for i in order[start : start + self.batch_size] if texts[i].strip()]
                if not rows:
                    continue
                enc = self.tokenizer(
                    [texts[i] for i in rows], padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt"
                )
                enc = enc.to(self.device)
                hidden = self.model(**enc).last_hidden_state.float()
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
                out[rows] = pooled.cpu().numpy()
        return normalise(out)


_LOADED: dict[tuple[Any, ...], Embedder] = process_cache({})


def load_embedder(
    kind: str, path: Path, *, max_tokens: int | None = None, batch_size: int | None = None, device: str | None = None
) -> Embedder:
    """The embedder of a model folder (``kind``: a MODEL_KINDS entry or auto) or of a fastText file
    (``fasttext``), loaded once per process. ``device``: the torch device a Hugging Face encoder runs
    on (None: the CPU); static models and fastText are look-ups and means, CPU work."""
    path = Path(path)
    if kind == "fasttext":
        files: tuple[Path, ...] = (path,)
    else:
        folder = model_folder(path, kind)
        kind, files = folder.kind, folder.files
    if kind != "transformers":
        device = None  # one cache entry whatever the stage's device
    # Keyed by the files' sizes and times too: a long-lived worker must not keep a model changed since.
    key = (
        kind,
        str(path),
        max_tokens,
        batch_size,
        device,
        tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files),
    )
    if key not in _LOADED:
        if kind == "fasttext":
            _LOADED[key] = FastTextEmbedder(path)
        elif kind == "model2vec":
            _LOADED[key] = StaticEmbedder(path)
        elif kind == "wordllama":
            _LOADED[key] = WordLlamaEmbedder(path)
        else:
            _LOADED[key] = TransformerEmbedder(path, max_tokens, batch_size, device)
    return _LOADED[key]
