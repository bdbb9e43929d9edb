"""Exact repeated spans: tokens with their original character offsets, window hashes and anchors.

Tokens are the shingles' (``datapipe.dedup.shingles``): every Han, kana, ... character is one token,
every run of other alphanumerics one token (a word), everything else (spaces, line breaks,
punctuation of either width, symbols) only separates tokens. Normalisation is the shingles' too:
NFKC, lower case, every decimal digit -> "0", and with ``fold`` Traditional -> Simplified
(``datapipe.dedup.fold``), so a Traditional copy of a Simplified span, or the same English span
with other line breaks or full-width punctuation, is the same token sequence.

Offsets: a document is normalised *per segment* (a character and the combining characters after
it), so every normalised code point knows the original characters it came from and a token maps
back to ``[start of its first segment, end of its last)`` in the original text. Most documents
have no code point whose normalisation depends on its neighbours (``shingles.norm_table``): they
are normalised by table lookups in numpy, one code point per character; the others in Python.
(Per segment, a capital sigma lower-cases to σ at the end of a word too, where ``str.lower`` of a
whole text gives ς: the same in every document, so it changes no match.)

Hashes: a token's 64-bit hash is FNV-1a over its normalised code points, mixed (splitmix64); the
hash of ``n`` consecutive tokens a polynomial over those (rolling, mod 2^64), mixed again. Equal
token sequences have equal hashes; unequal ones collide with probability about 2^-64, and a
collision never removes text: every match is confirmed on the normalised tokens themselves.

Anchors (what the map phase emits, a small share of the windows): robust winnowing (Schleimer,
Wilkerson, Aiken 2003) of the ``k``-token window hashes with a winnowing window of ``w`` hashes,
``w + k - 1 = min_tokens``. The guarantee every span of at least ``min_tokens`` tokens relies on:

    A span S of exactly min_tokens = w + k - 1 tokens holds exactly w k-token windows, which form
    one winnowing window. The anchor chosen in a winnowing window (its minimal hash, the rightmost
    of equal minima) depends only on the w hashes in it, i.e. only on S's tokens. Winnowing emits
    the choice of every winnowing window of a document, so each document that contains S emits the
    k-token window at the same offset r (0 <= r < w) inside S, with the same hash. Two documents
    sharing any span of >= min_tokens tokens therefore share an emitted anchor, at the same offset
    inside every min_tokens window of the span.

So a document's candidate regions, ``[p - (min_tokens - k), p + min_tokens)`` around each anchor
``p`` whose hash is in another document too, contain every window of ``min_tokens`` tokens it
shares with another document; the stage then hashes every such window there and confirms equal
ones token by token. Anchors are about 2 / (w + 1) of the positions (winnowing's density).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from datapipe.dedup.shingles import COMPLEX, char_classes, norm_table
from datapipe.runtime.jit import arr, lazy_numba

# The kernels compile (or load from numba's cache) on first use (runtime/jit.py): the driver imports
# this module to plan a run with a substrings stage and runs none of them, so it never loads numba.
numba = lazy_numba()

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)
_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd: the polynomial's multiplier mod 2^64


def winnow_params(min_tokens: int) -> tuple[int, int]:
    """(k, w) with w + k - 1 = min_tokens: k-token anchors, w of them per winnowing window.

    k about half of min_tokens: long enough that ordinary text rarely shares a k-token phrase across
    documents (each shared one costs a confirmation), short enough that the anchors stay sparse
    (density 2 / (w + 1): 7% of positions at min_tokens 50)."""
    k = (min_tokens + 1) // 2
    return k, min_tokens - k + 1


@lru_cache(maxsize=1)
def fold_table() -> np.ndarray:
    """uint32 per code point: its Simplified form (Traditional -> Simplified, one character each)."""
    from datapipe.dedup.fold import t2s_table

    table = np.arange(0x110000, dtype=np.uint32)
    mapping = t2s_table()
    table[np.fromiter(mapping.keys(), np.int64, len(mapping))] = np.fromiter((ord(v) for v in mapping.values()), np.uint32)
    return table


@lru_cache(maxsize=1)
def _joins_previous() -> frozenset[int]:
    """Code points that a normalisation may merge with the character before them (they do not start a
    segment): combining marks, Hangul vowel and final jamo, second members of canonical pairs."""
    out = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
    for c in range(0x110000):
        ch = chr(c)
        if unicodedata.combining(ch):
            out.add(c)
        d = unicodedata.decomposition(ch)
        if d and not d.startswith("<"):
            parts = d.split()
            if len(parts) == 2:
                out.add(int(parts[1], 16))
    return frozenset(out)


def normalize_segments(text: str, fold: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One document normalised per segment, in Python: (code points, start, end of the original
    characters each came from). The table path gives the same for documents it can normalise."""
    joins = _joins_previous()
    fold_map = fold_table() if fold else None
    cps: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    i, n = 0, len(text)
    while i < n:
        j = i + 1
        while j < n and ord(text[j]) in joins:
            j += 1
        for ch in unicodedata.normalize("NFKC", text[i:j]).lower():
            c = ord(ch)
            cps.append(int(fold_map[c]) if fold_map is not None else c)
            starts.append(i)
            ends.append(j)
        i = j
    return np.array(cps, np.uint32), np.array(starts, np.int64), np.array(ends, np.int64)


@dataclass
class Tokens:
    """The tokens of a batch of documents. Document d's tokens are ``tok_off[d]:tok_off[d + 1]``;
    token t is normalised code points ``cps[tok_start[t]:tok_end[t]]`` (digits already "0") and
    original characters ``[char_start[t], char_end[t])`` of its document."""

    cps: np.ndarray  # uint32, normalised, every document's one after another
    tok_off: np.ndarray  # int64 [n_docs + 1]
    tok_start: np.ndarray  # int64 into cps
    tok_end: np.ndarray
    tok_hash: np.ndarray  # uint64
    char_start: np.ndarray  # int64, offsets in the original document text
    char_end: np.ndarray

    def count(self, d: int) -> int:
        return int(self.tok_off[d + 1] - self.tok_off[d])

    def strings(self, d: int, lo: int, hi: int) -> list[str]:
        """Normalised tokens lo..hi of document d (the bytes a match is confirmed on)."""
        if hi <= lo:
            return []
        base = int(self.tok_off[d])
        s, e = int(self.tok_start[base + lo]), int(self.tok_end[base + hi - 1])
        chunk = self.cps[s:e].tobytes().decode("utf-32-le", "surrogatepass")
        return [chunk[a - s : b - s] for a, b in zip(self.tok_start[base + lo : base + hi], self.tok_end[base + lo : base + hi])]


def tokenize(texts: list[str], fold: bool) -> Tokens:
    """Normalise and tokenise a batch of documents (see the module docstring)."""
    lengths = np.fromiter(map(len, texts), np.int64, len(texts))
    offsets = np.zeros(len(texts) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    raw = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), np.uint32)
    table = norm_table()
    cps = table[raw]
    complex_docs = np.zeros(len(texts), bool)
    if len(raw):
        bad = np.flatnonzero(cps == COMPLEX)
        if len(bad):
            complex_docs[np.unique(np.searchsorted(offsets, bad, side="right") - 1)] = True
    if fold:  # (a COMPLEX code point's document is normalised again below)
        cps = fold_table()[np.minimum(cps, np.uint32(0x10FFFF))]
    src_start = src_end = None  # per code point: only where some document was normalised in Python
    if complex_docs.any():  # rebuild with the Python-normalised documents in place
        src_start = np.arange(len(raw), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
        src_end = src_start + 1
        parts_c, parts_s, parts_e, new_off = [], [], [], [0]
        for d in range(len(texts)):
            if complex_docs[d]:
                c, s, e = normalize_segments(texts[d], fold)
            else:
                lo, hi = offsets[d], offsets[d + 1]
                c, s, e = cps[lo:hi], src_start[lo:hi], src_end[lo:hi]
            parts_c.append(c)
            parts_s.append(s)
            parts_e.append(e)
            new_off.append(new_off[-1] + len(c))
        cps = np.concatenate(parts_c).astype(np.uint32) if parts_c else np.empty(0, np.uint32)
        src_start = np.concatenate(parts_s).astype(np.int64) if parts_s else np.empty(0, np.int64)
        src_end = np.concatenate(parts_e).astype(np.int64) if parts_e else np.empty(0, np.int64)
        offsets = np.array(new_off, np.int64)
    cps = np.ascontiguousarray(cps, dtype=np.uint32)
    size = max(len(cps), 1)
    tok_start = np.empty(size, np.int64)
    tok_end = np.empty(size, np.int64)
    tok_hash = np.empty(size, np.uint64)
    tok_off = np.zeros(len(texts) + 1, np.int64)
    n = _tokenize_jit(cps, offsets, char_classes(), tok_start, tok_end, tok_hash, tok_off)
    tok_start, tok_end = tok_start[:n].copy(), tok_end[:n].copy()
    if src_start is None or src_end is None:  # one code point per character: offsets within the document
        first = np.repeat(offsets[:-1], np.diff(tok_off))
        char_start, char_end = tok_start - first, tok_end - first
    else:
        char_start = src_start[tok_start] if n else np.empty(0, np.int64)
        char_end = src_end[tok_end - 1] if n else np.empty(0, np.int64)
    return Tokens(cps, tok_off, tok_start, tok_end, tok_hash[:n].copy(), char_start, char_end)


def _tokenize_kernel(cps, offsets, classes, tok_start, tok_end, tok_hash, tok_off):
    """Tokens of each document (classes: 1 word, 2 CJK, 3 digit, 0 separator); digits become "0"
    in ``cps``; each token's mixed FNV-1a hash."""
    nt = 0
    for d in range(offsets.shape[0] - 1):
        in_word = False
        for i in range(offsets[d], offsets[d + 1]):
            k = classes[cps[i]]
            if k == 3:
                cps[i] = np.uint32(48)
            if k == 1 or k == 3:
                if not in_word:
                    tok_start[nt] = i
                    nt += 1
                    in_word = True
                tok_end[nt - 1] = i + 1
            elif k == 2:
                tok_start[nt] = i
                tok_end[nt] = i + 1
                nt += 1
                in_word = False
            else:
                in_word = False
        tok_off[d + 1] = nt
    for t in range(nt):
        h = np.uint64(14695981039346656037)
        for i in range(tok_start[t], tok_end[t]):
            h = (h ^ np.uint64(cps[i])) * np.uint64(1099511628211)
        tok_hash[t] = _mix(h)
    return nt


def _mix_py(x):
    """splitmix64's finaliser: spreads a hash's bits (the polynomial and FNV leave low bits weak)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


_mix = numba.njit(cache=True, nogil=True, inline="always")(_mix_py)
_tokenize_jit = numba.njit(
    cache=True,
    nogil=True,
    warm=[(arr("uint32"), arr("int64"), arr("uint8"), arr("int64"), arr("int64"), arr("uint64"), arr("int64"))],
)(_tokenize_kernel)


def _window_kernel(tok_hash, lo, hi, n, out):
    """Mixed polynomial hashes of every n consecutive tokens of tok_hash[lo:hi] (rolling)."""
    count = hi - lo - n + 1
    if count <= 0:
        return 0
    top = np.uint64(1)
    for _ in range(n - 1):
        top = top * np.uint64(0x9E3779B97F4A7C15)
    h = np.uint64(0)
    for t in range(lo, lo + n):
        h = h * np.uint64(0x9E3779B97F4A7C15) + tok_hash[t]
    out[0] = _mix(h)
    for i in range(1, count):
        h = (h - tok_hash[lo + i - 1] * top) * np.uint64(0x9E3779B97F4A7C15) + tok_hash[lo + i + n - 1]
        out[i] = _mix(h)
    return count


_window_jit = numba.njit(cache=True, nogil=True, warm=[(arr("uint64"), "int64", "int64", "int64", arr("uint64"))])(_window_kernel)


def window_hashes(tokens: Tokens, d: int, n: int) -> np.ndarray:
    """Hash of every window of n tokens of document d (position i: tokens i..i+n-1)."""
    lo, hi = int(tokens.tok_off[d]), int(tokens.tok_off[d + 1])
    out = np.empty(max(hi - lo - n + 1, 0), np.uint64)
    _window_jit(tokens.tok_hash, lo, hi, n, out)
    return out


def _anchor_kernel(tok_hash, tok_off, min_tokens, k, w, out_doc, out_pos, out_hash, grams):
    """Robust winnowing per document with at least min_tokens tokens (module docstring)."""
    m = 0
    for d in range(tok_off.shape[0] - 1):
        lo, hi = tok_off[d], tok_off[d + 1]
        if hi - lo < min_tokens:
            continue
        count = _window_jit(tok_hash, lo, hi, k, grams)
        best = 0
        for i in range(1, w):  # the first window's rightmost minimum
            if grams[i] <= grams[best]:
                best = i
        out_doc[m] = d
        out_pos[m] = best
        out_hash[m] = grams[best]
        m += 1
        for s in range(1, count - w + 1):  # window s: grams[s .. s + w - 1]
            new = s + w - 1
            if grams[new] <= grams[best]:
                best = new
            elif best < s:  # the minimum left the window: scan it again
                best = s
                for i in range(s + 1, s + w):
                    if grams[i] <= grams[best]:
                        best = i
            if best != out_pos[m - 1] or out_doc[m - 1] != d:
                out_doc[m] = d
                out_pos[m] = best
                out_hash[m] = grams[best]
                m += 1
    return m


_anchor_jit = numba.njit(
    cache=True,
    nogil=True,
    warm=[(arr("uint64"), arr("int64"), "int64", "int64", "int64", arr("int64"), arr("int64"), arr("uint64"), arr("uint64"))],
)(_anchor_kernel)


def anchors(tokens: Tokens, min_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The winnowed anchors of every document with at least ``min_tokens`` tokens:
    (document index, token position, hash of the k tokens from there)."""
    k, w = winnow_params(min_tokens)
    size = max(len(tokens.tok_hash), 1)
    doc = np.empty(size, np.int64)
    pos = np.empty(size, np.int64)
    hashes = np.empty(size, np.uint64)
    longest = int(np.diff(tokens.tok_off).max()) if len(tokens.tok_off) > 1 else 0
    grams = np.empty(max(longest, 1), np.uint64)
    m = _anchor_jit(tokens.tok_hash, tokens.tok_off, min_tokens, k, w, doc, pos, hashes, grams)
    return doc[:m].copy(), pos[:m].copy(), hashes[:m].copy()


def regions(positions: np.ndarray, n_tokens: int, min_tokens: int) -> np.ndarray:
    """Start positions of every min_tokens window that holds one of the anchors at ``positions``
    (sorted distinct): the windows a shared span through those anchors can consist of."""
    k, _ = winnow_params(min_tokens)
    last = n_tokens - min_tokens  # the last window's start
    lo = np.maximum(positions - (min_tokens - k), 0)
    hi = np.minimum(positions, last) + 1
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if len(lo) == 0:
        return np.empty(0, np.int64)
    mask = np.zeros(last + 2, np.int64)
    np.add.at(mask, lo, 1)
    np.add.at(mask, hi, -1)
    return np.flatnonzero(np.cumsum(mask)[: last + 1] > 0).astype(np.int64)


def removed_token_spans(windows: np.ndarray, min_tokens: int) -> list[tuple[int, int]]:
    """Token ranges [a, b) covered by the windows starting at ``windows`` (sorted): their union."""
    spans: list[tuple[int, int]] = []
    for s in windows.tolist():
        if spans and s <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], s + min_tokens))
        else:
            spans.append((s, s + min_tokens))
    return spans
