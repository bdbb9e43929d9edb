"""Optional numba kernel: position_ids, cu_seqlens, num_segments and loss_mask in one pass.

numba is a project dependency but training jobs may not have it, so nothing here is
required: without numba (or with DATAPIPE_LOADER_NUMBA=0) ``kernel()`` is None and the
loader uses the vectorized numpy ``batch.assemble``, which returns the same arrays.
numba is imported on first use, not with the loader: importing it takes ~0.7 s and the first
compile ~3 s (later processes load the compiled kernel from numba's on-disk cache), and
neither should delay the first batch or a job that never asks for these fields.
Why a kernel at all: numpy needs ~30 calls and several full passes over (B, L) int32
temporaries per batch, while one compiled loop writes each output element once, in cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

_built: dict[str, Callable[..., object] | None] = {}


def _compiled(name: str, build: Callable[[], Callable[..., object]]) -> Callable[..., object] | None:
    """Build a kernel on first use; None when numba is unavailable or DATAPIPE_LOADER_NUMBA=0."""
    if name not in _built:
        _built[name] = None
        if os.environ.get("DATAPIPE_LOADER_NUMBA", "1") != "0":
            try:
                _built[name] = build()
            except ImportError:  # the numpy path is complete; numba only makes it faster
                pass
    return _built[name]


def kernel() -> Callable[..., object] | None:
    """The compiled segment-fields kernel, or None."""
    return _compiled("segments", _build)


def _build() -> Callable[..., int]:
    import numba

    @numba.njit(cache=True, nogil=True)
    def _segments(n_tokens, doc_counts, doc_flat, seq_len, label_shift, mask_cross,
                  position_ids, cu_seqlens, num_segments, loss_mask):  # pragma: no cover - compiled
        """Same definitions as batch.assemble (see there); returns the largest segment
        count so the caller can raise when it exceeds max_segments."""
        b = n_tokens.shape[0]
        width = cu_seqlens.shape[1]
        starts = np.empty(doc_flat.shape[0] + 2, np.int64)
        most, d0 = 0, 0
        for i in range(b):
            n = n_tokens[i]
            k = 1
            starts[0] = 0
            for j in range(d0, d0 + doc_counts[i]):
                d = doc_flat[j]
                if 0 < d < seq_len:
                    starts[k] = d
                    k += 1
            if n < seq_len:
                starts[k] = n
                k += 1
            # Insertion sort + dedupe: a row has a handful of starts, rarely unsorted.
            for a in range(1, k):
                v = starts[a]
                c = a - 1
                while c >= 0 and starts[c] > v:
                    starts[c + 1] = starts[c]
                    c -= 1
                starts[c + 1] = v
            m = 1
            for a in range(1, k):
                if starts[a] != starts[m - 1]:
                    starts[m] = starts[a]
                    m += 1
            most = max(most, m)
            num_segments[i] = m
            pos, cu = position_ids[i], cu_seqlens[i]
            for s in range(m):
                lo = starts[s]
                hi = starts[s + 1] if s + 1 < m else seq_len
                # 1-D row views and an int32 counter keep this loop vectorizable.
                v = np.int32(0)
                for p in range(lo, hi):
                    pos[p] = v
                    v += np.int32(1)
                if s + 1 < width:
                    cu[s + 1] = hi
            cu[0] = 0
            cu[m + 1:] = seq_len
            ok = max(min(n, seq_len + label_shift) - 1, 0)  # labels valid while p + 1 < n_tokens
            mask = loss_mask[i]
            mask[:ok] = True
            mask[ok:] = False
            if mask_cross:
                for j in range(d0, d0 + doc_counts[i]):
                    d = doc_flat[j]
                    if 1 <= d <= seq_len:
                        mask[d - 1] = False
            d0 += doc_counts[i]
        return most

    return _segments


def permute_kernel() -> Callable[..., object] | None:
    """order.permute's Feistel network compiled (same arithmetic), or None without numba."""
    return _compiled("permute", _build_permute)


def _build_permute() -> Callable[..., None]:
    import numba

    golden = np.uint64(0x9E3779B97F4A7C15)
    m1, m2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
    s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)

    @numba.njit(cache=True, nogil=True, inline="always")
    def mix(x):  # pragma: no cover - compiled; order._mix (splitmix64 finalizer)
        x = x ^ (x >> s30)
        x = x * m1
        x = x ^ (x >> s27)
        x = x * m2
        return x ^ (x >> s31)

    @numba.njit(cache=True, nogil=True)
    def _permute_loop(index, n, keys, half, out):  # pragma: no cover - compiled
        mask = (np.uint64(1) << half) - np.uint64(1)
        rk = np.empty(4, np.uint64)
        last = np.uint64(0)
        for i in range(index.shape[0]):
            k = keys[i]
            if i == 0 or k != last:  # keys repeat across a block: derive round keys once per key
                for r in range(4):
                    rk[r] = mix(k + golden * np.uint64(r + 1))
                last = k
            v = np.uint64(index[i])
            while True:  # cycle walking, as order.permute
                left = v >> half
                right = v & mask
                for r in range(4):
                    left, right = right, left ^ (mix(right ^ rk[r]) & mask)
                v = (left << half) | right
                if v < n:
                    break
            out[i] = np.int64(v)

    return _permute_loop
