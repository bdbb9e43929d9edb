"""The benchmark sample: the same documents for every contender, from ../shared/data/corpus."""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench._support.paths import SHARED

CORPUS = SHARED / "corpus"
FILES = ("en_wikipedia.jsonl", "zh_wikipedia.jsonl", "zh_pingcap_docs.jsonl", "zh_oiwiki.jsonl")


def sample(n: int, seed: int = 0, corpus: Path = CORPUS) -> list[dict]:
    """n documents drawn uniformly from the whole corpus (so ~90% English Wikipedia, as the corpus is)."""
    docs = []
    for name in FILES:
        with open(corpus / name, encoding="utf-8") as f:
            docs.extend({"text": json.loads(line)["text"], "file": name} for line in f if line.strip())
    random.Random(seed).shuffle(docs)
    return docs[:n] if n else docs
