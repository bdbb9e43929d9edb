"""Tokenization with any Hugging Face ``tokenizer.json``, and the split of documents into train/val."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from datapipe.config.sections import TokenizeConfig
from datapipe.errors import EXIT_USAGE, DatapipeError
from datapipe.runtime.process_cache import process_cache
from datapipe.tokens.shard_format import token_dtype

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|eos|>", "<|end_of_text|>")
PAD_CANDIDATES = ("<|pad|>", "<pad>", "[PAD]")
TOKENS_TYPE = pa.large_list(pa.uint32())


class TokenizerError(DatapipeError, ValueError):
    exit_code = EXIT_USAGE

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


@dataclass(frozen=True)
class TokenizerInfo:
    path: str
    fingerprint: str  # sha256 of tokenizer.json: shards from different tokenizers never mix
    vocab_size: int
    eos_id: int
    pad_id: int
    bos_id: int | None

    @property
    def dtype(self) -> str:
        return token_dtype(self.vocab_size).name


def load_tokenizer_info(path: Path, config: TokenizeConfig) -> TokenizerInfo:
    from tokenizers import Tokenizer

    data = path.read_bytes()
    try:
        tok = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # tokenizers raises plain Exceptions for bad files
        raise TokenizerError("tokenizer", f"{path} is not a Hugging Face tokenizer.json: {exc}") from None

    def lookup(key: str, name: str | None, candidates: tuple[str, ...], required: bool) -> int | None:
        names = (name,) if name else candidates
        for n in names:
            tid = tok.token_to_id(n)
            if tid is not None:
                return tid
        if name:
            raise TokenizerError(key, f"token {name!r} is not in the vocabulary of {path.name}")
        if required:
            raise TokenizerError(key, f"{path.name} has none of {', '.join(candidates)}; set {key} to its end-of-document token")
        return None

    eos = lookup("eos_token", config.eos_token, EOS_CANDIDATES, True)
    assert eos is not None  # required: lookup raised otherwise
    pad = lookup("pad_token", config.pad_token, PAD_CANDIDATES, False)
    bos = lookup("bos_token", config.bos_token, (), False) if config.bos_token else None
    return TokenizerInfo(
        str(path),
        hashlib.sha256(data).hexdigest(),
        tok.get_vocab_size(with_added_tokens=True),
        int(eos),
        int(pad if pad is not None else eos),
        bos,
    )


_TOKENIZERS: dict[str, object] = process_cache({})


def get_tokenizer(path: str):
    if path not in _TOKENIZERS:
        from tokenizers import Tokenizer

        _TOKENIZERS[path] = Tokenizer.from_file(path)
    return _TOKENIZERS[path]


# Characters per encode_batch call. The Rust encodings of one call all live at once (ids, tokens as
# strings, offsets, masks: ~100 bytes per token), so a 1000-document batch of long documents held
# 600+ MB in a worker; a bounded sub-batch keeps that to tens of MB, with the same ids.
ENCODE_CHUNK_CHARS = 1 << 18


def _chunks(texts: list[str], max_chars: int) -> list[tuple[int, int]]:
    """[start, end) ranges of consecutive texts of at most ``max_chars`` characters (at least one text)."""
    out, start, size = [], 0, 0
    for i, t in enumerate(texts):
        if i > start and size + len(t) > max_chars:
            out.append((start, i))
            start, size = i, 0
        size += len(t)
    if start < len(texts):
        out.append((start, len(texts)))
    return out


def encode_documents(texts: list[str], info: TokenizerInfo) -> pa.LargeListArray:
    """Token ids per document, each ending with EOS (and starting with BOS if configured)."""
    tok = get_tokenizer(info.path)
    extra = 1 + (info.bos_id is not None)
    parts: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    for lo, hi in _chunks(texts, ENCODE_CHUNK_CHARS):
        encodings = tok.encode_batch_fast(texts[lo:hi], add_special_tokens=False)  # Rust threads; no offsets
        ids = [e.ids for e in encodings]  # each .ids builds a new Python list: read it once
        del encodings  # before the next chunk's are made
        n = np.fromiter((len(i) + extra for i in ids), dtype=np.int64, count=len(ids))
        ends = np.cumsum(n)
        flat = np.empty(int(ends[-1]), dtype=np.uint32)
        for doc, end in zip(ids, ends.tolist()):
            start = end - len(doc) - 1
            if info.bos_id is not None:
                flat[start - 1] = info.bos_id
            flat[start : end - 1] = doc
        flat[ends - 1] = info.eos_id
        parts.append(flat)
        lengths.append(n)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    if texts:
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    flat = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.uint32()))


def assign_split(ids: list[str], val_fraction: float) -> pa.Array:
    """'val' for a stable, id-hashed share of documents: re-tokenizing never moves a document."""
    if val_fraction <= 0:
        return pa.array(["train"] * len(ids), pa.string())
    limit = int(val_fraction * 2**64)
    splits = [
        "val" if int.from_bytes(hashlib.blake2b(i.encode(), digest_size=8).digest(), "little") < limit else "train" for i in ids
    ]
    return pa.array(splits, pa.string())
