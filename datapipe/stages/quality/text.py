"""Vectorized views of a batch of texts that the quality filters share.

A ``Docs`` splits the batch once into lines, paragraphs, words or characters (each a flat
array of pieces plus the document index of each piece), so Gopher, C4 and FineWeb rules on
the same rows do not split the text three times. Per-document aggregates are ``np.bincount``
over the piece-to-document index; repetition is found by hashing n-grams of token ids for the
whole batch at once and sorting, instead of a Python Counter per document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# The code points at which Arrow's utf8_split_whitespace (and utf8_trim_whitespace) cut, as an RE2
# class: Python's str.isspace() set (tests/stages/test_quality_kernels.py checks every code point).
SPLIT_WHITESPACE = r"[\t\n\x0b\x0c\r\x1c-\x1f \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]"

# Sentence-ending punctuation, Latin and CJK (full-width forms, ellipsis, closing quotes).
TERMINAL = ".!?。！？…"
CLOSERS = "\"'”’」』)）\\]】"
ENDS_WITH_TERMINAL = rf"[{TERMINAL}][{CLOSERS}]*$"


@dataclass(frozen=True)
class Pieces:
    """A flat array of text pieces (lines, words, ...) and the document each belongs to."""

    values: pa.Array
    doc: np.ndarray  # int64, document index of each piece
    n_docs: int
    # Results several filters ask of the same pieces (C4 and FineWeb both match line ends and
    # find duplicate lines): computed once per batch.
    _memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def per_doc(self, weights: np.ndarray | None = None) -> np.ndarray:
        """Sum of ``weights`` (default: 1 per piece) over each document's pieces."""
        return np.bincount(self.doc, weights, minlength=self.n_docs).astype(np.float64)

    def matches(self, pattern: str) -> np.ndarray:
        key = ("matches", pattern)
        if key not in self._memo:
            self._memo[key] = to_np(pc.match_substring_regex(self.values, pattern)).astype(bool)
        return self._memo[key]

    @cached_property
    def lengths(self) -> np.ndarray:
        return to_np(pc.utf8_length(self.values)).astype(np.int64)

    def filter(self, mask: np.ndarray) -> Pieces:
        return Pieces(self.values.filter(pa.array(mask)), self.doc[mask], self.n_docs)


def to_np(a: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return a.to_numpy(zero_copy_only=False)


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, with 0 where den is 0 (an empty document has no bad lines)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), 0.0).astype(np.float32)


def _pieces(lists: pa.Array, n: int) -> Pieces:
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    offsets = lists.offsets.to_numpy()
    return Pieces(lists.flatten(), np.repeat(np.arange(n), np.diff(offsets)), n)


class Docs:
    """One batch of texts with lazily computed, shared splits."""

    def __init__(self, text: pa.Array) -> None:
        self.text = pc.fill_null(text, "")
        self.n = len(text)

    @cached_property
    def prose(self) -> Docs:
        """The same documents with Markdown code, math, tables and markup removed (``markdown.py``)."""
        from datapipe.stages.quality.markdown import prose

        return Docs(prose(self.text))

    @cached_property
    def n_chars(self) -> np.ndarray:
        return to_np(pc.utf8_length(self.text)).astype(np.int64)

    @cached_property
    def lower(self) -> pa.Array:
        return pc.utf8_lower(self.text)

    @cached_property
    def lines(self) -> Pieces:
        """Non-empty lines, stripped of surrounding whitespace."""
        p = _pieces(pc.split_pattern(self.text, "\n"), self.n)
        p = Pieces(pc.utf8_trim_whitespace(p.values), p.doc, self.n)
        return p.filter(p.lengths > 0)

    @cached_property
    def paragraphs(self) -> Pieces:
        p = _pieces(pc.split_pattern_regex(self.text, r"\n\s*\n"), self.n)
        p = Pieces(pc.utf8_trim_whitespace(p.values), p.doc, self.n)
        return p.filter(p.lengths > 0)

    @cached_property
    def words(self) -> Pieces:
        return _pieces(pc.utf8_split_whitespace(self.text), self.n)

    @cached_property
    def word_ids(self) -> tuple[np.ndarray, pa.Array]:
        """Each word's number in the batch's dictionary of distinct words (first seen, first
        numbered), and that dictionary: what depends on a word alone is computed once per distinct
        word (a batch of 1,000 English pages has ~10x fewer distinct words than words)."""
        encoded = pc.dictionary_encode(self.words.values)
        return to_np(encoded.indices).astype(np.int64), encoded.dictionary

    @cached_property
    def word_lengths(self) -> np.ndarray:
        """``words.lengths``, measured once per distinct word."""
        ids, distinct = self.word_ids
        return to_np(pc.utf8_length(distinct)).astype(np.int64)[ids]

    def byte_counts(self, char: str) -> np.ndarray:
        """Occurrences of one ASCII character in each text, as ``count(re.escape(char))`` gives: read
        straight from the UTF-8 buffer (an ASCII byte is never part of another character's bytes)."""
        assert len(char) == 1 and char.isascii()
        data, offsets = utf8_buffers(self.text)
        at = np.flatnonzero(data == ord(char))
        return np.bincount(np.searchsorted(offsets, at, side="right") - 1, minlength=self.n).astype(np.int64)

    def count(self, pattern: str) -> np.ndarray:
        return to_np(pc.count_substring_regex(self.text, pattern)).astype(np.int64)

    @cached_property
    def chars(self) -> tuple[np.ndarray, np.ndarray]:
        """Code points of every non-whitespace character, and the document of each."""
        texts = self.text.to_pylist()
        cps = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
        doc = np.repeat(np.arange(self.n), self.n_chars)
        keep = ~np.isin(cps, _WHITESPACE)
        return cps[keep], doc[keep]


try:  # numba is a dependency; the numpy reference keeps the package importable without it
    from datapipe.stages.quality import _kernels
except ImportError:  # pragma: no cover - only where numba is absent
    _kernels = None  # type: ignore[assignment]

_WHITESPACE = np.array([ord(c) for c in " \t\n\r\v\f\u3000\u00a0"], dtype=np.uint32)


def utf8_buffers(text: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """The UTF-8 bytes of all texts and each text's byte offsets into them (nulls are empty)."""
    text = text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
    if len(text) == 0:
        return np.zeros(0, np.uint8), np.zeros(1, np.int64)
    if text.null_count:  # a null's offsets need not be equal: make it an empty text
        text = pc.fill_null(text, "")
    if not (pa.types.is_string(text.type) or pa.types.is_large_string(text.type)):
        text = text.cast(pa.large_string())
    width = np.int64 if pa.types.is_large_string(text.type) else np.int32
    _, off_buf, data_buf = text.buffers()
    offsets = np.frombuffer(off_buf, dtype=width)[text.offset : text.offset + len(text) + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return data, offsets


def duplicates(pieces: Pieces) -> tuple[np.ndarray, np.ndarray]:
    """Per document: pieces that repeat an earlier piece of the same document, and their characters.

    This is Gopher's duplicate line/paragraph count (the first occurrence is not a duplicate).
    """
    if "duplicates" in pieces._memo:  # Gopher's and FineWeb's line rules both ask
        return pieces._memo["duplicates"]
    if len(pieces.values) == 0:
        z = np.zeros(pieces.n_docs)
        out = z, z.copy()
    else:
        ids = to_np(pc.dictionary_encode(pieces.values).indices).astype(np.int64)
        key = pieces.doc * (int(ids.max()) + 1) + ids
        _, first = np.unique(key, return_index=True)
        dup = np.ones(len(key), dtype=bool)
        dup[first] = False
        out = pieces.per_doc(dup.astype(np.float64)), pieces.per_doc(dup * pieces.lengths)
    pieces._memo["duplicates"] = out
    return out


def ngram_repetition(
    ids: np.ndarray, doc: np.ndarray, weight: np.ndarray, n_docs: int, top_ns: tuple[int, ...], dup_ns: tuple[int, ...]
) -> dict[str, np.ndarray]:
    """Gopher's n-gram repetition (see ``ngram_repetition_reference``), all n in one compiled pass.

    The numba kernel (``_kernels.ngram_signals``) groups n-grams by their exact token sequences,
    so its values equal the reference's bit for bit (tests/stages/test_quality_kernels.py compares them on
    the real corpora); the reference runs where numba is missing or tokens are not grouped by document.
    """
    max_n = max(top_ns + dup_ns, default=1)
    if _kernels is None or min(top_ns + dup_ns, default=2) < 2 or len(doc) and bool(np.any(doc[1:] < doc[:-1])):
        return ngram_repetition_reference(ids, doc, weight, n_docs, top_ns, dup_ns)
    weight = np.ascontiguousarray(weight, dtype=np.float64)
    total = np.bincount(doc, weight, minlength=n_docs).astype(np.float64)
    offsets = np.searchsorted(doc, np.arange(n_docs + 1)).astype(np.int64)
    want_top, want_dup = np.zeros(max_n + 1, bool), np.zeros(max_n + 1, bool)
    want_top[list(top_ns)], want_dup[list(dup_ns)] = True, True
    top_num, dup_num = np.zeros((max_n + 1, n_docs)), np.zeros((max_n + 1, n_docs))
    _kernels.ngram_signals(
        np.ascontiguousarray(ids, dtype=np.int64), offsets, weight, max_n, want_top, want_dup, top_num, dup_num
    )
    out: dict[str, np.ndarray] = {}
    for n in range(1, max_n + 1):  # same keys, in the same order, as the reference
        if n in top_ns:
            out[f"top{n}"] = np.minimum(ratio(top_num[n], total), 1.0)
        if n in dup_ns:
            out[f"dup{n}"] = ratio(dup_num[n], total)
    return out


def ngram_repetition_reference(
    ids: np.ndarray,
    doc: np.ndarray,
    weight: np.ndarray,
    n_docs: int,
    top_ns: tuple[int, ...],
    dup_ns: tuple[int, ...],
    exact: bool = True,
) -> dict[str, np.ndarray]:
    """Gopher's n-gram repetition over token ids (words or characters) of a whole batch (numpy reference).

    ``top<n>``: characters covered by the most frequent n-gram (count x its length) over all
    characters. ``dup<n>``: characters covered by the repeated occurrences of any n-gram (each
    occurrence after the first; a character counts once). ``weight`` is each token's length.

    ``exact=False`` is the implementation before the numba kernel, kept so benchmarks can time
    it: it keyed n-grams by a 64-bit polynomial hash (base 1,000,003), which merges distinct
    n-grams whose ids happen to satisfy ``(a+1)P + b = (a'+1)P + b'``; with ``latin_words`` ids
    (hashes of words) this happens on real pages (one zh_pingcap_docs page: dup5 0.2026 instead of
    0.2010). ``exact=True`` numbers each n-gram by its (n-1)-gram's number and its last token's
    number, packed exactly into an int64, so equal numbers mean equal token sequences.
    """
    total = np.bincount(doc, weight, minlength=n_docs).astype(np.float64)
    out: dict[str, np.ndarray] = {}
    P = np.uint64(1_000_003)
    if exact:  # level 1: (document, token) numbered exactly; tokens numbered once per batch
        tok, _ = _group(ids.astype(np.int64))
        n_tok = int(tok.max()) + 1 if len(tok) else 1
        h, _ = _group(doc.astype(np.int64) * n_tok + tok)
    else:
        h = ids.astype(np.uint64) + np.uint64(1)
    w = weight.astype(np.float64)
    for n in range(1, max(top_ns + dup_ns, default=1) + 1):
        if n > 1:  # extend every (n-1)-gram by the next token
            if exact:
                h, _ = _group(h[:-1] * n_tok + tok[n - 1 :])
            else:
                h = h[:-1] * P + ids[n - 1 :].astype(np.uint64) + np.uint64(1)
            w = w[:-1] + weight[n - 1 :]
        if n not in top_ns and n not in dup_ns:
            continue
        m = len(h)
        start_doc = doc[:m]
        valid = start_doc == doc[n - 1 : n - 1 + m]  # the n-gram does not cross a document boundary
        pos = np.flatnonzero(valid)
        if exact:
            key = h[pos]  # the level-1 number already includes the document
        else:
            key = h[pos] ^ (start_doc[pos].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        codes, first_mask = _group(key)
        counts = np.bincount(codes)
        first = np.flatnonzero(first_mask)  # codes are numbered in order of first occurrence
        if n in top_ns:
            # First occurrences come in position order, so their documents are sorted: per-document
            # maxima are reduceat over contiguous runs (ufunc.at is slow).
            udoc, ulen = start_doc[pos[first]], w[pos[first]]
            maxc = _per_doc_max(counts, udoc, n_docs)
            top = (counts == maxc[udoc]) & (counts > 1)  # a top n-gram seen once is no repetition
            best = _per_doc_max(np.where(top, counts * ulen, 0.0), udoc, n_docs)
            # Overlapping occurrences ("=====") can cover a character twice: cap at the whole text.
            out[f"top{n}"] = np.minimum(ratio(best, total), 1.0)
        if n in dup_ns:
            starts = pos[~first_mask]
            size = len(ids) + 1
            cover = np.bincount(starts, minlength=size) - np.bincount(starts + n, minlength=size)
            covered = np.cumsum(cover[:-1]) > 0  # tokens inside a repeated occurrence
            out[f"dup{n}"] = ratio(np.bincount(doc, weight * covered, minlength=n_docs), total)
    return out


def _group(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group ids for equal keys, numbered by first occurrence, and which rows are first occurrences.

    Arrow's hash-based dictionary encoding is linear time; sorting (np.unique) was 3x slower here.
    """
    if len(key) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    codes = to_np(pc.dictionary_encode(pa.array(key)).indices).astype(np.int64)
    seen = np.maximum.accumulate(codes)
    first = np.empty(len(codes), dtype=bool)
    first[0] = True
    first[1:] = codes[1:] > seen[:-1]
    return codes, first


def _per_doc_max(values: np.ndarray, doc: np.ndarray, n_docs: int) -> np.ndarray:
    """Maximum of ``values`` per document, for ``doc`` sorted ascending."""
    out = np.zeros(n_docs, dtype=np.float64)
    if len(values) == 0:
        return out
    starts = np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]])
    out[doc[starts]] = np.maximum.reduceat(values.astype(np.float64), starts)
    return out
