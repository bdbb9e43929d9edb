"""Numba kernels for the repetition signals (imported by ``repetition.py`` only where numba is installed).

Module-level functions with ``cache=True``: closures or functions built at run time miss numba's
on-disk cache, and every worker process would recompile them for seconds.

Exactness: n-grams are grouped by their *exact* token-id sequence, never by a hash alone. Per
document, level 1 numbers the distinct token ids 0..k-1 (an open-addressing table that compares
full int64 keys); level n numbers the distinct pairs (group of the (n-1)-gram at i, level-1 group
of token i+n-1), packed exactly into one int64 (``g * L + t`` with both < L, the document's token
count). Two n-grams get the same number iff their (n-1)-gram prefixes and last tokens are equal,
so by induction iff their token sequences are equal: the hash only chooses a table slot and a
collision costs a probe, not a wrong result. Sums of weights run in the same left-to-right order
as the numpy reference, so even non-integer weights give the same float64 values.
"""

import numpy as np

from datapipe.runtime.jit import arr, lazy_numba

numba = lazy_numba()  # kernels compile (or load from the cache) on first use

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(cache=True, nogil=True, inline="always")
def _slot(key, mask):  # pragma: no cover - compiled
    return np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(20)) & mask


@numba.njit(
    cache=True,
    nogil=True,
    warm=[
        (
            arr("int64"),
            arr("int64"),
            arr("float64"),
            "int64",
            arr("boolean"),
            arr("boolean"),
            arr("float64", 2),
            arr("float64", 2),
        )
    ],
)
def ngram_signals(ids, offsets, weight, max_n, want_top, want_dup, top_num, dup_num):  # pragma: no cover
    """Per document d (tokens offsets[d]..offsets[d+1]) and n in 2..max_n:

    top_num[n, d]: count x character length of the most frequent n-gram (the longest among
    equally frequent ones), 0 when none repeats. dup_num[n, d]: weight of the tokens inside an
    occurrence of an n-gram after its first one (each token counted once).
    """
    n_docs = offsets.shape[0] - 1
    longest = 0
    for d in range(n_docs):
        longest = max(longest, offsets[d + 1] - offsets[d])
    cap = 16
    while cap < 2 * longest:
        cap *= 2
    keys = np.empty(cap, np.int64)
    vals = np.empty(cap, np.int64)
    g1 = np.empty(max(longest, 1), np.int64)
    g = np.empty(max(longest, 1), np.int64)
    w = np.empty(max(longest, 1), np.float64)
    count = np.empty(max(longest, 1), np.int64)
    prev = np.empty(max(longest, 1), np.int64)  # occurrences of each (n-1)-gram number
    firstw = np.empty(max(longest, 1), np.float64)
    repeat = np.empty(max(longest, 1), np.bool_)
    for d in range(n_docs):
        s = offsets[d]
        L = offsets[d + 1] - s
        if L < 2:
            continue
        c = 16
        while c < 2 * L:
            c *= 2
        mask = c - 1
        # Level 1: distinct token ids of this document (vals < 0 marks a free slot: any id is a valid key).
        vals[:c] = -1
        k = 0
        prev[:L] = 0
        for i in range(L):
            key = ids[s + i]
            j = _slot(key, mask)
            while True:
                if vals[j] < 0:
                    keys[j] = key
                    vals[j] = k
                    k += 1
                    break
                if keys[j] == key:
                    break
                j = (j + 1) & mask
            g1[i] = vals[j]
            g[i] = g1[i]
            prev[g1[i]] += 1
            w[i] = weight[s + i]
        for n in range(2, max_n + 1):
            m = L - n + 1
            if m <= 0:
                break
            vals[:c] = -1
            k = 0
            for i in range(m):
                w[i] = w[i] + weight[s + i + n - 1]
                if prev[g[i]] == 1:
                    # A prefix seen once makes the n-gram unique too (an equal n-gram elsewhere
                    # would repeat the prefix): a new number without a table probe.
                    count[k] = 1
                    firstw[k] = w[i]
                    g[i] = k
                    repeat[i] = False
                    k += 1
                    continue
                key = g[i] * L + g1[i + n - 1]
                j = _slot(key, mask)
                while True:
                    if vals[j] < 0:
                        keys[j] = key
                        vals[j] = k
                        count[k] = 1
                        firstw[k] = w[i]
                        g[i] = k
                        repeat[i] = False
                        k += 1
                        break
                    if keys[j] == key:
                        v = vals[j]
                        count[v] += 1
                        g[i] = v
                        repeat[i] = True
                        break
                    j = (j + 1) & mask
            if want_top[n]:
                top_num[n, d] = _top_repeated(count, firstw, k)
            if want_dup[n]:
                dup_num[n, d] = _repeated_weight(weight, s, L, m, n, repeat)
            if k == m:
                break  # every n-gram is unique, so are all longer ones: their signals stay 0
            prev, count = count, prev


@numba.njit(cache=True, nogil=True, inline="always")
def _top_repeated(count, firstw, k):  # pragma: no cover - compiled
    """Count x character length of the most frequent of the ``k`` n-grams numbered (the longest among
    equally frequent ones), 0 when none repeats."""
    maxc = 0
    for v in range(k):
        maxc = max(maxc, count[v])
    best = 0.0
    if maxc > 1:
        for v in range(k):
            if count[v] == maxc:
                best = max(best, count[v] * firstw[v])
    return best


@numba.njit(cache=True, nogil=True, inline="always")
def _repeated_weight(weight, s, L, m, n, repeat):  # pragma: no cover - compiled
    """Weight of the document's tokens (``weight[s:s + L]``) inside an occurrence of an n-gram after
    its first one (``repeat`` over its ``m`` n-grams), each token counted once, summed left to right."""
    end = 0
    acc = 0.0
    for i in range(L):
        if i < m and repeat[i]:
            end = max(end, i + n)
        if i < end:
            acc += weight[s + i]
    return acc


@numba.njit(cache=True, nogil=True, inline="always")
def _decode(data, p):  # pragma: no cover - compiled
    """The code point at byte p of valid UTF-8 (Arrow validates strings) and the next position."""
    b = np.int64(data[p])
    if b < 0x80:
        return b, p + 1
    if b < 0xE0:
        return ((b & 0x1F) << 6) | (np.int64(data[p + 1]) & 0x3F), p + 2
    if b < 0xF0:
        return (((b & 0x0F) << 12) | ((np.int64(data[p + 1]) & 0x3F) << 6) | (np.int64(data[p + 2]) & 0x3F)), p + 3
    return (
        ((b & 0x07) << 18)
        | ((np.int64(data[p + 1]) & 0x3F) << 12)
        | ((np.int64(data[p + 2]) & 0x3F) << 6)
        | (np.int64(data[p + 3]) & 0x3F)
    ), p + 4


@numba.njit(cache=True, nogil=True, inline="always")
def _is_space(cp):  # pragma: no cover - compiled
    # The whitespace of text._WHITESPACE / zh._WS: " \t\n\r\v\f", U+3000, U+00A0.
    return cp == 32 or 9 <= cp <= 13 or cp == 0x3000 or cp == 0xA0


@numba.njit(cache=True, nogil=True, inline="always")
def _is_word(cp):  # pragma: no cover - compiled
    return 48 <= cp <= 57 or 65 <= cp <= 90 or 97 <= cp <= 122 or cp == 95


@numba.njit(
    cache=True,
    nogil=True,
    warm=[(arr("uint8"), arr("int64"), "boolean", "float64", arr("uint64"), arr("int64"), arr("int64"), arr("float64"))],
)
def char_tokens(data, offsets, latin_words, limit, powers, ids, doc, weight):  # pragma: no cover
    """Tokens of ``zh._char_tokens``' reference, read straight from the UTF-8 bytes of each text.

    A token is a non-whitespace character or (``latin_words``) a run of ASCII letters, digits
    and ``_`` with id ``sum(cp_k * powers[min(k, 63)])`` (wrapping uint64, viewed as int64) and
    weight its length. Only tokens with fewer than ``limit`` characters before them in their
    document are kept, so a long page is read only as far as its head. With ``ids`` of length 0
    nothing is written: the return value is the number of tokens, to size the arrays.
    """
    fill = ids.shape[0] > 0
    t = 0
    for d in range(offsets.shape[0] - 1):
        p = offsets[d]
        end = offsets[d + 1]
        before = 0.0  # characters of this document's earlier tokens
        while p < end and before < limit:
            cp, q = _decode(data, p)
            if _is_space(cp):
                p = q
                continue
            if latin_words and _is_word(cp):
                h = np.uint64(0)
                k = 0
                while True:
                    h += np.uint64(cp) * powers[min(k, 63)]
                    k += 1
                    p = q
                    if p >= end:
                        break
                    cp, q = _decode(data, p)
                    if not _is_word(cp):
                        break
                if fill:
                    ids[t] = np.int64(h)
                    doc[t] = d
                    weight[t] = k
                before += k
            else:
                if fill:
                    ids[t] = cp
                    doc[t] = d
                    weight[t] = 1.0
                before += 1.0
                p = q
            t += 1
    return t


@numba.njit(cache=True, nogil=True, warm=[(arr("uint8"), arr("int64"), arr("boolean"), arr("boolean"))])
def mark_code_points(data, offsets, known, new):  # pragma: no cover - compiled
    """Sets ``new[cp]`` for every code point of the texts that ``known`` lacks; returns how many."""
    found = 0
    for d in range(offsets.shape[0] - 1):
        p = offsets[d]
        end = offsets[d + 1]
        while p < end:
            cp, p = _decode(data, p)
            if not known[cp] and not new[cp]:
                new[cp] = True
                found += 1
    return found


@numba.njit(cache=True, nogil=True, warm=[(arr("uint8"), arr("int64"), arr("uint8"), arr("boolean"), arr("int64", 2))])
def class_counts(data, offsets, table, runs, out):  # pragma: no cover - compiled
    """out[b, d]: characters of text d whose ``table`` entry has bit b; for bits with ``runs[b]``,
    maximal runs of such characters instead (a regex ``[...]+`` counts each run once)."""
    n_bits = out.shape[0]
    for d in range(offsets.shape[0] - 1):
        p = offsets[d]
        end = offsets[d + 1]
        last = 0
        while p < end:
            cp, p = _decode(data, p)
            bits = table[cp]
            if bits:
                for b in range(n_bits):
                    if bits >> b & 1 and not (runs[b] and last >> b & 1):
                        out[b, d] += 1
            last = bits
