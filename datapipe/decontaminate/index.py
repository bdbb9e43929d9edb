"""The benchmark n-gram index: every n-gram of every benchmark item, and which items hold it.

Stored as two parallel numpy arrays sorted by hash: ``keys`` (uint64 n-gram hash) and ``items``
(int32 item ordinal), one entry per distinct (n-gram, item) pair, so 12 bytes per pair plus the
per-item tables. A batch of documents is looked up with one ``searchsorted`` over all its
n-gram hashes; only documents with a hit (rare) go through the per-item accounting in Python.
Passages shared by several items (CMRC contexts, AGIEval reading passages) are stored once per
item: the price of knowing each item's matched share exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from datapipe.decontaminate.benchmarks import Item
from datapipe.decontaminate.ngrams import ngram_at, ngram_hashes
from datapipe.dedup.shingles import HAVE_NUMBA
from datapipe.storage.atomic import atomic_path

BITMAP_BITS_PER_KEY = 16  # prefilter: ~6% of the n-grams that are not in the index reach the binary search


def _bitmap(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """A one-hash Bloom filter over the top bits of the keys (a power of two >= 16 bits per key)."""
    shift = 64 - max(10, int(np.ceil(np.log2(max(len(keys), 1) * BITMAP_BITS_PER_KEY))))
    bits = (keys >> np.uint64(shift)).astype(np.int64)
    bitmap = np.zeros((1 << (64 - shift)) // 8, dtype=np.uint8)
    np.bitwise_or.at(bitmap, bits >> 3, (1 << (bits & 7)).astype(np.uint8))
    return bitmap, shift


def _lookup(keys, bitmap, shift, hashes, found):
    """found[i] = hashes[i] in keys: the bitmap rejects most misses with one access, then binary search."""
    n = keys.shape[0]
    for i in range(hashes.shape[0]):
        h = hashes[i]
        b = h >> np.uint64(shift)
        if not (bitmap[b >> np.uint64(3)] >> (b & np.uint64(7))) & np.uint8(1):
            continue
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) >> 1
            if keys[mid] < h:
                lo = mid + 1
            else:
                hi = mid
        found[i] = lo < n and keys[lo] == h


if HAVE_NUMBA:
    from datapipe.runtime.jit import arr, lazy_numba

    numba = lazy_numba()  # compiled (or loaded from the cache) on first use

    _lookup_jit = numba.njit(
        cache=True, nogil=True, warm=[(arr("uint64"), arr("uint8"), "int64", arr("uint64"), arr("boolean"))]
    )(_lookup)


@dataclass(frozen=True)
class Match:
    """The contamination of one document: the item with the most matched n-grams."""

    hits: int  # distinct benchmark n-grams in the document (any item)
    benchmark: str
    item_id: str
    item_hits: int  # distinct n-grams of that item found in the document
    frac: float  # item_hits / the item's distinct n-grams
    window: int  # index of the first matched n-gram of that item among the document's n-grams


@dataclass
class BenchmarkIndex:
    keys: np.ndarray  # uint64, sorted
    items: np.ndarray  # int32, item ordinal of each key
    item_ngrams: np.ndarray  # int32, distinct n-grams per item
    item_ids: list[str]
    item_bench: np.ndarray  # int16, benchmark ordinal per item
    benchmarks: list[str]
    n_word: int
    n_char: int
    fold: bool
    too_short: dict[str, int] = field(default_factory=dict)  # items without a single n-gram, per benchmark

    def __post_init__(self) -> None:
        self.bitmap, self.shift = _bitmap(self.keys)

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.items.nbytes + self.item_ngrams.nbytes + self.item_bench.nbytes + self.bitmap.nbytes)

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        """Boolean mask: which hashes are benchmark n-grams."""
        if not HAVE_NUMBA or not len(self.keys):
            pos = np.minimum(np.searchsorted(self.keys, hashes), max(len(self.keys) - 1, 0))
            return self.keys[pos] == hashes if len(self.keys) else np.zeros(len(hashes), dtype=bool)
        found = np.zeros(len(hashes), dtype=bool)
        _lookup_jit(self.keys, self.bitmap, self.shift, hashes, found)
        return found

    @classmethod
    def build(
        cls, benchmark_items: Iterable[Item], n_word: int, n_char: int, fold: bool = True, batch: int = 4096
    ) -> BenchmarkIndex:
        benchmarks: list[str] = []
        item_ids: list[str] = []
        item_bench: list[int] = []
        texts: list[str] = []
        text_item: list[int] = []
        for it in benchmark_items:
            if it.benchmark not in benchmarks:
                benchmarks.append(it.benchmark)
            item_ids.append(it.item_id)
            item_bench.append(benchmarks.index(it.benchmark))
            texts.extend(it.texts)
            text_item.extend([len(item_ids) - 1] * len(it.texts))
        hashes, owners = [], []
        for s in range(0, len(texts), batch):
            h, off = ngram_hashes(texts[s : s + batch], n_word, n_char, fold)
            hashes.append(h)
            owners.append(np.repeat(np.asarray(text_item[s : s + batch], dtype=np.int32), np.diff(off)))
        keys = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
        items = np.concatenate(owners) if owners else np.zeros(0, np.int32)
        order = np.lexsort((items, keys))
        keys, items = keys[order], items[order]
        if len(keys):  # one entry per distinct (n-gram, item): an item's repeated n-gram counts once
            keep = np.ones(len(keys), dtype=bool)
            keep[1:] = (keys[1:] != keys[:-1]) | (items[1:] != items[:-1])
            keys, items = keys[keep], items[keep]
        item_ngrams = np.bincount(items, minlength=len(item_ids)).astype(np.int32)
        bench_arr = np.asarray(item_bench, dtype=np.int16)
        too_short = {b: int(np.sum((item_ngrams == 0) & (bench_arr == i))) for i, b in enumerate(benchmarks)}
        return cls(keys, items, item_ngrams, item_ids, bench_arr, benchmarks, n_word, n_char, fold, too_short)

    def save(self, path: Path) -> None:
        """One .npz (no pickles), written atomically: workers load it instead of re-reading the benchmarks."""
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(
                f,
                keys=self.keys,
                items=self.items,
                item_ngrams=self.item_ngrams,
                item_bench=self.item_bench,
                item_ids=np.array(self.item_ids, dtype=str),
                benchmarks=np.array(self.benchmarks, dtype=str),
                too_short=np.array([self.too_short.get(b, 0) for b in self.benchmarks], dtype=np.int64),
                params=np.array([self.n_word, self.n_char, int(self.fold)], dtype=np.int64),
            )

    @classmethod
    def load(cls, path: Path) -> BenchmarkIndex:
        with np.load(path, allow_pickle=False) as z:
            benchmarks = [str(b) for b in z["benchmarks"]]
            n_word, n_char, fold = (int(v) for v in z["params"])
            return cls(
                z["keys"],
                z["items"],
                z["item_ngrams"],
                [str(i) for i in z["item_ids"]],
                z["item_bench"],
                benchmarks,
                n_word,
                n_char,
                bool(fold),
                dict(zip(benchmarks, (int(v) for v in z["too_short"]))),
            )

    def match(self, texts: list[str]) -> list[Match | None]:
        """Per document: None without any benchmark n-gram, else its best-matching item."""
        hashes, offsets = ngram_hashes(texts, self.n_word, self.n_char, self.fold)
        out: list[Match | None] = [None] * len(texts)
        if not len(self.keys) or not len(hashes):
            return out
        found = self.contains(hashes)
        if not found.any():
            return out
        doc_of = np.repeat(np.arange(len(texts)), np.diff(offsets))
        for d in np.unique(doc_of[found]):
            local = hashes[offsets[d] : offsets[d + 1]]
            matched = np.unique(local[found[offsets[d] : offsets[d + 1]]])
            lo = np.searchsorted(self.keys, matched, "left")
            cnt = np.searchsorted(self.keys, matched, "right") - lo
            starts = np.cumsum(cnt) - cnt
            idx = np.repeat(lo, cnt) + (np.arange(cnt.sum()) - np.repeat(starts, cnt))
            its = self.items[idx]
            uit, per_item = np.unique(its, return_counts=True)
            frac = per_item / self.item_ngrams[uit]
            best = int(np.lexsort((-uit, frac, per_item))[-1])  # most hits, then largest share, then first item
            item = int(uit[best])
            of_best = np.repeat(matched, cnt)[its == item]
            window = int(np.flatnonzero(np.isin(local, of_best))[0])
            out[int(d)] = Match(
                len(matched),
                self.benchmarks[self.item_bench[item]],
                self.item_ids[item],
                int(per_item[best]),
                float(frac[best]),
                window,
            )
        return out

    def ngram_text(self, text: str, window: int) -> str:
        """The normalized text of a document's n-gram (the ``contam_ngram`` signal)."""
        return ngram_at(text, window, self.n_word, self.n_char, self.fold)
