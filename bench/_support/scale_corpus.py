"""Corpora for bench/scaling/scale.py: real zh/en text, every copy perturbed, plus planted duplicates.

Source: the documents of ../shared/data/corpus (bench/_support/corpus.py), each cut to at most
``max_chars`` at a paragraph end and kept when it has at least ``min_tokens`` tokens (so two
perturbed copies of it cannot match by chance). Every document is pre-split once into pieces: a
Han character, a run of ASCII letters (a word), or a run of anything else (spaces, punctuation,
digits, markup), and stored as ids into one piece table (a few hundred MB, not a string per piece).

Regular document ``j`` is a perturbed copy of base document ``j % B``: each Han character and
each word is replaced, with probability ``p`` (default 0.2), by a Han character or word drawn
from the corpus by its frequency, so the text keeps its language, its stop words and its
character mix (langid and the quality rules see ordinary text), while two copies share a
5-token shingle only where all ten tokens survived: Jaccard about (0.8^10)/(2 - 0.8^10) = 0.06,
far below MinHash's 0.7 (bench/scaling/scale.py measures it on sampled pairs and prints it).

Planted duplicates, each of a distinct regular document (its "original"), written after it at a
random distance of up to ``window`` documents (so mostly in another file, another map task):
``rate`` x N exact copies (half byte-identical, half with whitespace added around: the same
normalized text) and ``rate`` x N near copies (a two-token phrase inserted at a random point of
an original with at least 60 tokens: Jaccard of shingle sets >= (56 - 5)/(56 + 8) = 0.8).
URLs say what each line is: ``https://doc.example/<j>`` (regular), ``https://exact.example/<j>``
and ``https://near.example/<j>`` (plants of regular document j).
"""

from __future__ import annotations

import heapq
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench._support.corpus import CORPUS, FILES

PIECE = re.compile(r"[\u4e00-\u9fff]|[A-Za-z]+|[^A-Za-z\u4e00-\u9fff]+")
NEAR_MIN_TOKENS = 60
PHRASE = {"zh": "（转载）", "en": " (reposted copy) "}
OTHER, HAN, WORD = 0, 1, 2
BLOCK = 512  # documents perturbed at once


def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    end = text.rfind("\n", 0, max_chars)
    return text[:end] if end > max_chars // 2 else text[:max_chars]


@dataclass
class Base:
    """The base documents as piece ids, and what a perturbation draws replacements from."""

    table: np.ndarray  # object array: piece id -> str
    kind: np.ndarray  # int8 per piece id: OTHER, HAN, WORD
    ids: np.ndarray  # int32, every document's pieces one after another
    offsets: np.ndarray  # int64, document d is ids[offsets[d]:offsets[d + 1]]
    ntok: np.ndarray  # Han characters + words per document
    lang: list[str]  # "zh" or "en": the corpus file it came from
    vocab: dict[int, tuple[np.ndarray, np.ndarray]]  # kind -> (piece ids, cumulative frequency in [0, 1])

    def __len__(self) -> int:
        return len(self.lang)

    def perturb(self, d: int, rng: np.random.Generator, p: float) -> str:
        return self.perturb_block(d, 1, rng, p)[0]

    def perturb_block(self, d: int, count: int, rng: np.random.Generator, p: float) -> list[str]:
        """Perturbed copies of base documents d .. d + count - 1 (vectorized over the block)."""
        lo, hi = self.offsets[d], self.offsets[d + count]
        seg = self.ids[lo:hi].copy()
        kinds = self.kind[seg]
        hit = rng.random(len(seg)) < p
        for k in (HAN, WORD):
            m = hit & (kinds == k)
            n = int(m.sum())
            if n:
                ids, cdf = self.vocab[k]
                seg[m] = ids[np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), len(ids) - 1)]
        pieces = self.table[seg].tolist()
        bounds = (self.offsets[d : d + count + 1] - lo).tolist()
        return ["".join(pieces[a:b]) for a, b in zip(bounds, bounds[1:])]

    def mean_bytes(self) -> float:
        lengths = np.array([len(s.encode()) for s in self.table.tolist()], dtype=np.int64)
        return float(lengths[self.ids].sum() / len(self))


def load_base(max_chars: int = 5000, min_tokens: int = 30, seed: int = 0, corpus: Path = CORPUS) -> Base:
    piece_id: dict[str, int] = {}
    docs: list[np.ndarray] = []
    langs: list[str] = []
    for name in FILES:
        lang = "en" if name.startswith("en") else "zh"
        with open(corpus / name, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                pieces = PIECE.findall(_cut(json.loads(line)["text"], max_chars))
                docs.append(np.fromiter((piece_id.setdefault(s, len(piece_id)) for s in pieces), np.int32, count=len(pieces)))
                langs.append(lang)
    table = np.empty(len(piece_id), dtype=object)
    table[:] = list(piece_id)
    kind = np.zeros(len(table), np.int8)
    for i, s in enumerate(table.tolist()):
        if len(s) == 1 and "\u4e00" <= s <= "\u9fff":
            kind[i] = HAN
        elif s[0].isascii() and s[0].isalpha():
            kind[i] = WORD
    ntok = np.array([int((kind[d] != OTHER).sum()) for d in docs], np.int64)
    keep = np.flatnonzero(ntok >= min_tokens)
    keep = keep[np.random.default_rng(seed).permutation(len(keep))]
    docs = [docs[i] for i in keep]
    ids = np.concatenate(docs)
    offsets = np.zeros(len(docs) + 1, np.int64)
    offsets[1:] = np.cumsum([len(d) for d in docs])
    counts = np.bincount(ids, minlength=len(table))
    vocab = {}
    for k in (HAN, WORD):
        members = np.flatnonzero((kind == k) & (counts > 0))
        cdf = np.cumsum(counts[members], dtype=np.float64)
        vocab[k] = (members.astype(np.int32), cdf / cdf[-1])
    return Base(table, kind, ids, offsets, ntok[keep], [langs[i] for i in keep], vocab)


def exact_copy(text: str, variant: int) -> str:
    return text if variant == 0 else "  " + text + " \n"  # same text once whitespace is normalized


def near_copy(text: str, lang: str, rng: np.random.Generator) -> str:
    cut = int(rng.integers(0, len(text) + 1))
    return text[:cut] + PHRASE[lang] + text[cut:]


@dataclass
class Corpus:
    files: list[Path]
    regular: int
    exact: np.ndarray  # regular documents that have an exact plant
    near: np.ndarray  # regular documents that have a near plant
    bytes: int
    seconds: float
    cluster: int = 0  # near-copies of one page added (bench/scaling/scale.py ``add_cluster``)

    @property
    def docs(self) -> int:
        return self.regular + len(self.exact) + len(self.near) + self.cluster

    def summary(self) -> dict[str, Any]:
        return {
            "files": len(self.files),
            "docs": self.docs,
            "regular": self.regular,
            "exact_plants": len(self.exact),
            "near_plants": len(self.near),
            "cluster_copies": self.cluster,
            "bytes": self.bytes,
            "write_seconds": round(self.seconds, 1),
        }


def write_corpus(
    folder: Path, base: Base, n: int, files: int, rate: float = 0.05, p: float = 0.2, window: int = 200_000, seed: int = 0
) -> Corpus:
    """``n`` regular documents (perturbed copies) plus ``rate`` x n exact and near plants each, in
    ``files`` JSONL files of about the same number of lines."""
    import time

    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    B = len(base)
    k = int(rate * n)
    order = rng.permutation(n)
    exact = np.sort(order[:k])
    rest = order[k:]
    near = np.sort(rest[base.ntok[rest % B] >= NEAR_MIN_TOKENS][:k])
    plant = np.zeros(n, np.int8)
    plant[exact], plant[near] = 1, 2
    total = n + len(exact) + len(near)
    per_file = -(-total // files)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"part-{i:05d}.jsonl" for i in range(files)]
    written = size = 0
    out = None
    pending: list[tuple[int, int, str]] = []

    def emit(line: str) -> None:
        nonlocal written, size, out
        if written % per_file == 0:
            if out is not None:
                out.close()
            out = open(paths[written // per_file], "w", encoding="utf-8")
        out.write(line)
        written += 1
        size += len(line.encode())

    try:
        start = 0
        while start < n:
            d0 = start % B
            count = min(BLOCK, n - start, B - d0)  # a block never wraps around the base
            for j, text in enumerate(base.perturb_block(d0, count, rng, p), start):
                emit(json.dumps({"text": text, "url": f"https://doc.example/{j}"}, ensure_ascii=False) + "\n")
                if plant[j]:
                    if plant[j] == 1:
                        copy, host = exact_copy(text, int(rng.integers(0, 2))), "exact"
                    else:
                        copy, host = near_copy(text, base.lang[j % B], rng), "near"
                    line = json.dumps({"text": copy, "url": f"https://{host}.example/{j}"}, ensure_ascii=False) + "\n"
                    heapq.heappush(pending, (j + int(rng.integers(1, window + 1)), j, line))
                while pending and pending[0][0] <= j:
                    emit(heapq.heappop(pending)[2])
            start += count
        while pending:
            emit(heapq.heappop(pending)[2])
    finally:
        if out is not None:
            out.close()
    return Corpus([p for p in paths if p.exists()], n, exact, near, size, time.perf_counter() - started)


def similarity_check(
    base: Base, p: float, pairs: int = 2000, threshold: float = 0.7, seed: int = 1, exact_pairs: int = 200
) -> dict[str, Any]:
    """MinHash Jaccard (datapipe's signatures, 128 permutations) of sampled pairs: two perturbed
    copies of one base document (the most alike non-planted documents can be), and a perturbed
    document against its near plant; exact shingle-set Jaccard on the first ``exact_pairs`` of each, too."""
    from datapipe.dedup.minhash import signatures
    from datapipe.dedup.shingles import shingles

    rng = np.random.default_rng(seed)
    eligible = np.flatnonzero(base.ntok >= NEAR_MIN_TOKENS)
    copies: list[tuple[str, str]] = []
    nears: list[tuple[str, str]] = []
    for _ in range(pairs):
        d = int(rng.integers(0, len(base)))
        copies.append((base.perturb(d, rng, p), base.perturb(d, rng, p)))
        e = int(eligible[rng.integers(0, len(eligible))])
        a = base.perturb(e, rng, p)
        nears.append((a, near_copy(a, base.lang[e], rng)))

    def est(pairs_: list[tuple[str, str]]) -> np.ndarray:
        sigs = signatures([t for pair in pairs_ for t in pair])
        return (sigs[0::2] == sigs[1::2]).mean(axis=1)

    def true(pairs_: list[tuple[str, str]]) -> np.ndarray:
        out = []
        for a, b in pairs_[:exact_pairs]:
            sa, sb = set(shingles(a)), set(shingles(b))
            out.append(len(sa & sb) / max(1, len(sa | sb)))
        return np.array(out)

    c, n_ = est(copies), est(nears)
    tc, tn = true(copies), true(nears)
    return {
        "pairs": pairs,
        "threshold": threshold,
        "perturbation_p": p,
        "copies_minhash": {
            "mean": float(c.mean()),
            "p99": float(np.quantile(c, 0.99)),
            "max": float(c.max()),
            "at_or_above_threshold": int((c >= threshold).sum()),
        },
        "copies_true_jaccard": {"mean": float(tc.mean()), "max": float(tc.max())},
        "near_minhash": {
            "mean": float(n_.mean()),
            "p01": float(np.quantile(n_, 0.01)),
            "min": float(n_.min()),
            "below_threshold": int((n_ < threshold).sum()),
        },
        "near_true_jaccard": {"mean": float(tn.mean()), "min": float(tn.min())},
    }
