"""CJK-aware n-grams for benchmark decontamination: character n-grams in Chinese, word n-grams in English.

Normalization and tokens are those of near-duplicate shingling (``datapipe.dedup.shingles``):
NFKC (full-width forms), lower case, punctuation, symbols and whitespace only separate tokens;
each Han/kana character is a token, each run of other letters or digits is a token. On top of
that Traditional characters fold to Simplified
(``datapipe.dedup.fold``'s OpenCC table), so reflowed, re-punctuated, full-width, upper-cased
or Traditional copies of a benchmark item give the same tokens as the item.

Unlike shingling, the n-gram size depends on the script: a window of tokens ends as soon as it
holds ``n_word`` words *or* ``n_char`` CJK characters, counted proportionally in mixed text (a
word costs ``n_char``, a CJK character ``n_word``, a window is full at ``n_word * n_char``).
Pure English gives word 13-grams, pure Chinese character n-grams, mixed text windows of the
same "size". A text too short to fill one window has no n-gram at all (so a short answer such
as "42" never matches anything).

Two differences from shingling, both against false matches: digits are kept as they are (folded
to "0", every list of numbers in a TiDB page or a OI-wiki table matched HumanEval's example
lists), and a window made only of numbers is not an n-gram (a run of 13 numbers is a table,
not a sentence of a benchmark).

Each n-gram is a 64-bit hash (FNV-1a per token, a polynomial over the window's tokens, then the
SplitMix64 finalizer): with 64 bits a lookup against millions of benchmark n-grams has a false
match chance of about 1e-13 per n-gram, which 32-bit shingle hashes (1e-4 here) could not give.
``ngram_hashes`` is the batch path (one numba kernel); ``ngrams`` the Python reference, which
also returns the window's text for the ``contam_ngram`` signal.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from datapipe.dedup.fold import t2s_table
from datapipe.dedup.shingles import (
    CJK,
    HAVE_NUMBA,
    TOKEN_RE,
    Texts,
    char_classes,
    norm_table,
    normalize,
    texts_as_list,
    to_codepoints,
)

if HAVE_NUMBA:
    from datapipe.runtime.jit import arr, lazy_numba

    numba = lazy_numba()  # compiled (or loaded from the cache) on first use

MASK = (1 << 64) - 1
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
POLY = 0x9E3779B97F4A7C15  # odd multiplier of the window polynomial


def _mix_py(h: int) -> int:
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & MASK
    return h ^ (h >> 31)


@lru_cache(maxsize=1)
def fold_array() -> np.ndarray:
    """uint32 per code point: its Simplified form (identity for everything but ~5,100 Han characters)."""
    arr = np.arange(0x110000, dtype=np.uint32)
    for k, v in t2s_table().items():
        arr[k] = ord(v)
    return arr


def _window_bounds(weights: list[int], numeric: list[bool], need: int) -> list[tuple[int, int]]:
    out, j, cost = [], 0, 0
    for i in range(len(weights)):
        while j < len(weights) and cost < need:
            cost += weights[j]
            j += 1
        if cost < need:
            break
        if not all(numeric[i:j]):
            out.append((i, j))
        cost -= weights[i]
    return out


def _tokens(text: str, fold: bool) -> tuple[list[str], list[bool], list[bool]]:
    """Tokens (NFKC, lower case, folded: as the kernel), whether each is one CJK character, whether a number."""
    toks = TOKEN_RE.findall(normalize(text, t2s_table() if fold else None))
    classes = char_classes()
    cjk = [len(t) == 1 and classes[ord(t)] == CJK for t in toks]
    numeric = [t.isdecimal() for t in toks]  # every character of class DIGIT (decimal digits)
    return toks, cjk, numeric


def _shown(toks: list[str], cjk: list[bool], i: int, j: int) -> str:
    """Window text: CJK characters joined without a space, words with one."""
    return "".join(toks[t] + ("" if cjk[t] and (t + 1 == j or cjk[t + 1]) else " ") for t in range(i, j)).strip()


def ngrams(text: str, n_word: int, n_char: int, fold: bool = True) -> list[tuple[int, str]]:
    """Reference: (hash, normalized window text) of every n-gram of one text, in text order."""
    toks, cjk, numeric = _tokens(text, fold)
    weights = [n_word if c else n_char for c in cjk]
    th = []
    for t in toks:
        h = FNV_OFFSET
        for ch in t:
            h = ((h ^ ord(ch)) * FNV_PRIME) & MASK
        th.append(h)
    out = []
    for i, j in _window_bounds(weights, numeric, n_word * n_char):
        h = 0
        for k in range(i, j):
            h = (h * POLY + th[k]) & MASK
        out.append((_mix_py(h ^ (j - i)), _shown(toks, cjk, i, j)))
    return out


def ngram_at(text: str, window: int, n_word: int, n_char: int, fold: bool = True) -> str:
    """The text of a text's ``window``-th n-gram: ``ngrams(...)[window][1]`` without hashing every window
    or classifying tokens past it (documents with a hit can be long)."""
    toks = TOKEN_RE.findall(normalize(text, t2s_table() if fold else None))
    classes = char_classes()
    need = n_word * n_char
    cjk: list[bool] = []
    numeric: list[bool] = []
    seen, j, cost = -1, 0, 0
    for i in range(len(toks)):
        while j < len(toks) and cost < need:
            t = toks[j]
            cjk.append(len(t) == 1 and classes[ord(t)] == CJK)
            numeric.append(t.isdecimal())
            cost += n_word if cjk[j] else n_char
            j += 1
        if cost < need:
            break
        if not all(numeric[i:j]):
            seen += 1
            if seen == window:
                return _shown(toks, cjk, i, j)
        cost -= n_word if cjk[i] else n_char
    return ""


def _ngram_kernel(cps, offsets, done, table, fold, classes, n_word, n_char, out_hash, out_off, tok_h, tok_w, tok_num):
    need = n_word * n_char
    fnv_off = np.uint64(FNV_OFFSET)
    fnv_prime = np.uint64(FNV_PRIME)
    poly = np.uint64(POLY)
    m1 = np.uint64(0xBF58476D1CE4E5B9)
    m2 = np.uint64(0x94D049BB133111EB)
    pos = 0
    out_off[0] = 0
    for d in range(offsets.shape[0] - 1):
        nt = 0
        in_word = False
        for i in range(offsets[d], offsets[d + 1]):
            c = cps[i]
            if not done[d]:
                c = table[c]
            c = fold[c]
            k = classes[c]
            if k == 1 or k == 3:
                if not in_word:
                    tok_h[nt] = fnv_off
                    tok_w[nt] = n_char
                    tok_num[nt] = True
                    nt += 1
                    in_word = True
                tok_h[nt - 1] = (tok_h[nt - 1] ^ np.uint64(c)) * fnv_prime
                if k == 1:
                    tok_num[nt - 1] = False
            elif k == 2:
                tok_h[nt] = (fnv_off ^ np.uint64(c)) * fnv_prime
                tok_w[nt] = n_word
                tok_num[nt] = False
                nt += 1
                in_word = False
            else:
                in_word = False
        j = 0
        cost = 0
        for i in range(nt):
            while j < nt and cost < need:
                cost += tok_w[j]
                j += 1
            if cost < need:
                break
            numbers_only = True
            for t in range(i, j):
                if not tok_num[t]:
                    numbers_only = False
            if numbers_only:
                cost -= tok_w[i]
                continue
            h = np.uint64(0)
            for t in range(i, j):
                h = h * poly + tok_h[t]
            h = h ^ np.uint64(j - i)
            h = (h ^ (h >> np.uint64(30))) * m1
            h = (h ^ (h >> np.uint64(27))) * m2
            out_hash[pos] = h ^ (h >> np.uint64(31))
            pos += 1
            cost -= tok_w[i]
        out_off[d + 1] = pos
    return pos


if HAVE_NUMBA:
    _ngram_kernel_jit = numba.njit(
        cache=True,
        nogil=True,
        warm=[
            (
                arr("uint32", readonly=True),
                arr("int64"),
                arr("boolean"),
                arr("uint32"),
                arr("uint32"),
                arr("uint8"),
                "int64",
                "int64",
                arr("uint64"),
                arr("int64"),
                arr("uint64"),
                arr("int64"),
                arr("boolean"),
            )
        ],
    )(_ngram_kernel)


def ngram_hashes(texts: Texts, n_word: int, n_char: int, fold: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Batch path: (uint64 n-gram hashes of all texts, int64 offsets[n_texts + 1]); equal to ``ngrams``."""
    if n_word < 1 or n_char < 1:
        raise ValueError("n_word and n_char must be >= 1")
    texts = texts_as_list(texts)
    if not HAVE_NUMBA:  # slow but equal
        ref = [[h for h, _ in ngrams(t, n_word, n_char, fold)] for t in texts]
        off = np.zeros(len(ref) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in ref], out=off[1:])
        return np.array([h for r in ref for h in r], dtype=np.uint64), off
    cps, offsets, done = to_codepoints(texts)  # documents with complex code points come back normalized
    size = max(len(cps), 1)  # at most one n-gram per token, one token per code point
    out_hash = np.empty(size, dtype=np.uint64)
    out_off = np.zeros(len(offsets), dtype=np.int64)
    tok_h = np.empty(size, dtype=np.uint64)
    tok_w = np.empty(size, dtype=np.int64)
    tok_num = np.empty(size, dtype=np.bool_)
    fold_map = fold_array() if fold else np.arange(0x110000, dtype=np.uint32)
    used = _ngram_kernel_jit(
        cps, offsets, done, norm_table(), fold_map, char_classes(), n_word, n_char, out_hash, out_off, tok_h, tok_w, tok_num
    )
    return out_hash[:used].copy(), out_off
