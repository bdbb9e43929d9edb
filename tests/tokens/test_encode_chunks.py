"""Tokenizing in bounded sub-batches (to keep worker memory flat) gives exactly the ids of one call."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from datapipe.pipeline.load import TokenizeConfig
from datapipe.tokens import encode as tokenize
from tests.support.shared_data import shared_path

ROOT = Path(__file__).resolve().parents[2]


def _texts() -> list[str]:
    path = shared_path("corpus/zh_pingcap_docs.jsonl")
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line, _ in zip(f, range(120))]
    return texts + ["", "a", texts[0]]  # empty and one-character documents, a repeat


@pytest.mark.slow
@pytest.mark.parametrize("bos", [None, 7])
def test_chunked_encoding_equals_one_call(monkeypatch: pytest.MonkeyPatch, bos: int | None) -> None:
    tok = ROOT / "tokenizer" / "demo.json"
    info = tokenize.load_tokenizer_info(tok, TokenizeConfig(tokenizer=str(tok), seq_len=512))
    info = dataclasses.replace(info, bos_id=bos)
    texts = _texts()
    monkeypatch.setattr(tokenize, "ENCODE_CHUNK_CHARS", 10**12)
    whole = tokenize.encode_documents(texts, info)
    encodings = tokenize.get_tokenizer(info.path).encode_batch(texts, add_special_tokens=False)
    for i in (0, 5, len(texts) - 3):  # spot check against the tokenizer itself
        ids = whole[i].values.to_pylist()
        assert ids == ([bos] if bos is not None else []) + encodings[i].ids + [info.eos_id]
    for chunk in (1, 5000, 1 << 18):
        monkeypatch.setattr(tokenize, "ENCODE_CHUNK_CHARS", chunk)
        assert len(tokenize._chunks(texts, chunk)) > 1
        assert tokenize.encode_documents(texts, info).equals(whole)
    assert len(tokenize.encode_documents([], info)) == 0


def test_chunks_cover_every_text_once() -> None:
    texts = ["a" * n for n in (5, 1, 9, 0, 3, 20, 2)]
    ranges = tokenize._chunks(texts, 8)
    assert [i for lo, hi in ranges for i in range(lo, hi)] == list(range(len(texts)))
    assert all(sum(map(len, texts[lo:hi])) <= 8 or hi - lo == 1 for lo, hi in ranges)
