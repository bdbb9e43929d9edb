"""Numba kernels for datatrove's Gopher n-gram repetition (``GopherRepetitionFilter``), its way.

datatrove's definitions differ from datapipe's own (``_kernels.ngram_signals``), so they are
computed separately:

* top n-gram (n = 2, 3, 4): the n-grams are the words joined by a space; the most frequent one
  (``Counter.most_common(1)``: among equally frequent ones the one seen first) counts
  ``len(" ".join(words)) * count``, even when it occurs once.
* duplicated n-grams (n = 5..10): a left-to-right walk (``find_all_duplicate``); the n-gram at
  ``i`` is the words joined with no separator; if that string was seen, its length is counted and
  the walk jumps ``n`` words, else it is remembered and the walk moves one word. N-grams jumped
  over are never remembered, and "ab"+"c" equals "a"+"bc".

N-grams are keyed by two polynomial hashes (moduli 1e9+7 and 998244353): of the word ids for the
top n-gram (space-joined strings are equal iff the word sequences are, as words hold no space),
of the characters for the duplicated n-grams (equal strings, whatever the word boundaries). Two
different n-grams of one document share both hashes with odds of about 1e-18.
"""

import numpy as np

from datapipe.runtime.jit import lazy_numba

numba = lazy_numba()  # kernels compile (or load from the cache) on first use

P1 = 1_000_000_007
P2 = 998_244_353
B1 = 911_382_323
B2 = 972_663_749
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(cache=True, nogil=True)
def char_hashes(cps, offsets):  # pragma: no cover - compiled
    """Per string i (code points cps[offsets[i]:offsets[i+1]]): its two hashes and B1^len, B2^len."""
    n = offsets.shape[0] - 1
    out = np.zeros((4, n), np.int64)
    for i in range(n):
        h1, h2, p1, p2 = 0, 0, 1, 1
        for j in range(offsets[i], offsets[i + 1]):
            c = np.int64(cps[j]) + 1
            h1 = (h1 * B1 + c) % P1
            h2 = (h2 * B2 + c) % P2
            p1 = (p1 * B1) % P1
            p2 = (p2 * B2) % P2
        out[0, i], out[1, i], out[2, i], out[3, i] = h1, h2, p1, p2
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _find(keys, key, mask):  # pragma: no cover - compiled
    """The slot of ``key`` in an open-addressing table (``-1`` marks a free slot): its own or the free one."""
    i = np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(20)) & mask
    while keys[i] != -1 and keys[i] != key:
        i = (i + 1) & mask
    return i


@numba.njit(cache=True, nogil=True)
def repetition(ids, tlen, th, offsets, top, dup):  # pragma: no cover - compiled
    """Per document d (words offsets[d]..offsets[d+1]): top[n-2, d] for n = 2..4 and dup[n-5, d]
    for n = 5..10, in characters (see the module docstring); ``th`` is ``char_hashes`` per word id."""
    n_docs = offsets.shape[0] - 1
    longest = 1
    for d in range(n_docs):
        longest = max(longest, offsets[d + 1] - offsets[d])
    cap = 16
    while cap < 2 * longest:
        cap *= 2
    keys = np.empty(cap, np.int64)
    count = np.empty(cap, np.int64)
    first = np.empty(cap, np.int64)
    for d in range(n_docs):
        s = offsets[d]
        W = offsets[d + 1] - s
        c = 16
        while c < 2 * W:
            c *= 2
        mask = c - 1
        for n in range(2, 5):
            if W < n:
                continue
            keys[:c] = -1
            best_c, best_i = 0, 0
            for i in range(W - n + 1):
                k1, k2 = 0, 0
                for j in range(i, i + n):
                    k1 = (k1 * B1 + ids[s + j] + 1) % P1
                    k2 = (k2 * B2 + ids[s + j] + 1) % P2
                slot = _find(keys, k1 * P2 + k2, mask)
                if keys[slot] == -1:
                    keys[slot], count[slot], first[slot] = k1 * P2 + k2, 1, i
                else:
                    count[slot] += 1
                # Counter.most_common(1): the highest count, the earliest first occurrence among equals
                if count[slot] > best_c or (count[slot] == best_c and first[slot] < best_i):
                    best_c, best_i = count[slot], first[slot]
            chars = n - 1
            for j in range(best_i, best_i + n):
                chars += tlen[ids[s + j]]
            top[n - 2, d] = chars * best_c
        for n in range(5, 11):
            keys[:c] = -1
            repeated = 0
            i = 0
            while i < W - n + 1:
                k1, k2, chars = 0, 0, 0
                for j in range(i, i + n):
                    t = ids[s + j]
                    k1 = (k1 * th[2, t] + th[0, t]) % P1
                    k2 = (k2 * th[3, t] + th[1, t]) % P2
                    chars += tlen[t]
                slot = _find(keys, k1 * P2 + k2, mask)
                if keys[slot] != -1:
                    repeated += chars
                    i += n
                else:
                    keys[slot] = k1 * P2 + k2
                    i += 1
            dup[n - 5, d] = repeated
