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
from typing import Any, TypeVar

import numpy as np

_built: dict[str, Any] = {}
T = TypeVar("T")


def _compiled(name: str, build: Callable[[], T]) -> T | None:
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
                for p in range(hi - lo):  # a plain induction variable: this loop vectorizes
                    pos[lo + p] = p
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
    kernels = _compiled("order", _build_order)
    return kernels["permute"] if kernels else None


def locate_kernel() -> Callable[..., object] | None:
    """PackedDataset.locate in one compiled pass (blend, keys, permutation, shard search)."""
    kernels = _compiled("order", _build_order)
    return kernels["locate"] if kernels else None


def address_kernel() -> Callable[..., object] | None:
    """ShardTable's address arithmetic for a block in one compiled pass."""
    kernels = _compiled("order", _build_order)
    return kernels["addresses"] if kernels else None


def _build_order() -> dict[str, Callable[..., object]]:
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

    @numba.njit(cache=True, nogil=True, inline="always")
    def round_keys(k, rk):  # pragma: no cover - compiled; order.permute's round keys
        for r in range(4):
            rk[r] = mix(k + golden * np.uint64(r + 1))

    @numba.njit(cache=True, nogil=True, inline="always")
    def feistel(v, n, rk, half, mask):  # pragma: no cover - compiled; order.permute
        while True:  # cycle walking, as order.permute
            left = v >> half
            right = v & mask
            for r in range(4):
                left, right = right, left ^ (mix(right ^ rk[r]) & mask)
            v = (left << half) | right
            if v < n:
                return v

    @numba.njit(cache=True, nogil=True)
    def _permute_loop(index, n, keys, half, out):  # pragma: no cover - compiled
        mask = (np.uint64(1) << half) - np.uint64(1)
        rk = np.empty(4, np.uint64)
        last = np.uint64(0)
        for i in range(index.shape[0]):
            k = keys[i]
            if i == 0 or k != last:  # keys repeat across a block: derive round keys once per key
                round_keys(k, rk)
                last = k
            out[i] = np.int64(feistel(np.uint64(index[i]), n, rk, half, mask))

    @numba.njit(cache=True, nogil=True)
    def _locate(index, blend_src, blend_ord, shares, period, n_rows, base_key, half,
                cum, cum_off, ids, ids_off, shift, first, first_off, shard_out, row_out):  # pragma: no cover
        """PackedDataset.locate, same definitions: sample -> (virtual source s, ordinal j)
        by the blend (or s = 0, j = sample without one); pass, pos = divmod(j, period[s]);
        row = permute(pos, n_rows[s], mix(base_key[s] + pass * golden)); then the shard
        whose row range holds row (searchsorted(cum_s, row, "right") - 1), searched only
        between the shards that row's bucket and the next one start in (see
        PackedDataset._flat_order_tables).

        A block's samples are runs of consecutive numbers, so source, pass and position
        step by one from the previous sample of the same source where possible (a 64-bit
        division costs ~30 cycles), and round keys are derived once per (source, pass). No
        temporaries: arrays of a few hundred KiB per call would be fresh pages every block."""
        k = n_rows.shape[0]
        last_j = np.full(k, -2, np.int64)  # per source: last ordinal seen, its pass and position
        last_p = np.full(k, -1, np.int64)
        last_pos = np.zeros(k, np.int64)
        keys = np.empty((k, 4), np.uint64)  # per source: round keys of its current pass
        blend_period = blend_src.shape[0]
        q, r, prev = np.int64(0), np.int64(0), np.int64(-2)
        for i in range(index.shape[0]):
            g = index[i]
            if blend_period:
                if g == prev + 1:
                    r += 1
                    if r == blend_period:
                        r = 0
                        q += 1
                else:
                    q, r = divmod(g, blend_period)
                prev = g
                s = np.int64(blend_src[r])
                j = q * shares[s] + blend_ord[r]
            else:
                s, j = np.int64(0), g
            if j == last_j[s] + 1:
                p, ps = last_p[s], last_pos[s] + 1
                if ps == period[s]:
                    p, ps = p + 1, np.int64(0)
            else:
                p, ps = divmod(j, period[s])
            if p != last_p[s]:
                round_keys(mix(base_key[s] + np.uint64(p) * golden), keys[s])
            last_j[s], last_p[s], last_pos[s] = j, p, ps
            n = n_rows[s]
            row = np.int64(0)
            if n > 1:
                h = np.uint64(half[s])
                row = np.int64(feistel(np.uint64(ps), np.uint64(n), keys[s], h, (np.uint64(1) << h) - np.uint64(1)))
            b = first_off[s] + (row >> shift[s])
            lo, hi = cum_off[s] + first[b], cum_off[s] + first[b + 1] + 1
            while hi - lo > 1:  # largest k with cum[k] <= row
                mid = (lo + hi) // 2
                if cum[mid] <= row:
                    lo = mid
                else:
                    hi = mid
            shard_out[i] = ids[ids_off[s] + lo - cum_off[s]]
            row_out[i] = row - cum[lo]

    @numba.njit(cache=True, nogil=True)
    def _addresses(shard, row, slot_of, chunk_off, chunk_rows, chunk_addr, row_bytes, itemsize,
                   last_used, tick, elem_out):  # pragma: no cover - compiled
        """ShardTable.token_addresses + RowView's offsets: returns (missing, lowest address);
        elem_out[i] = (address of row i - lowest) // itemsize. When shards are missing
        (not open), returns their count and leaves elem_out undefined."""
        missing = 0
        low = np.int64(0x7FFFFFFFFFFFFFFF)
        for i in range(shard.shape[0]):
            sl = slot_of[shard[i]]
            if sl < 0:
                missing += 1
                continue
            last_used[sl] = tick
            c, w = divmod(row[i], chunk_rows[sl])
            a = chunk_addr[chunk_off[sl] + c] + w * row_bytes
            elem_out[i] = a
            low = min(low, a)
        if missing:
            return missing, np.int64(0)
        for i in range(shard.shape[0]):
            elem_out[i] = (elem_out[i] - low) // itemsize
        return 0, low

    return {"permute": _permute_loop, "locate": _locate, "addresses": _addresses}


def gather_kernel() -> Callable[..., object] | None:
    """A row gather by memcpy, or None without numba.

    numpy's fancy index spends ~100 ns a row on iterator set-up before it copies, about a
    seventh of a 4 KiB row's copy; one memcpy call per row from a compiled loop does not.
    Same safety rules as gather.RowView: only registered row starts, under a lease.
    """
    return _compiled("gather", _build_gather)


def _build_gather() -> Callable[..., None]:
    import numba
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def memcpy(typingctx, dst, src, nbytes):  # llvm.memcpy between raw addresses
        sig = types.void(types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):  # pragma: no cover - runs at compile time
            d, s, n = args
            bytep = ir.IntType(8).as_pointer()
            cgutils.raw_memcpy(builder, builder.inttoptr(d, bytep), builder.inttoptr(s, bytep), n, 1)
            return context.get_dummy_value()

        return sig, codegen

    @numba.njit(cache=True, nogil=True)
    def _gather_rows(low, elem, itemsize, out):  # pragma: no cover - compiled
        """out[i] = the out.shape[1] elements at low + elem[i] * itemsize (out C-contiguous)."""
        row_bytes = out.shape[1] * itemsize
        dst = out.ctypes.data
        for i in range(elem.shape[0]):
            memcpy(dst + i * row_bytes, low + elem[i] * itemsize, row_bytes)

    return _gather_rows
