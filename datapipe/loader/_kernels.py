"""The numba kernels of the loader, at module level (see fused.py for why they exist).

Imported only through ``fused`` (lazily, and only where numba is installed). Module-level
functions without closure variables are what numba's on-disk cache can key stably: defined
inside builder functions, every process missed the cache, recompiled for seconds, and added
another cache file.
"""

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@numba.njit(cache=True, nogil=True, inline="always")
def _row_starts(n, doc_flat, d0, count, seq_len, starts):  # pragma: no cover - compiled
    """Segment starts of one row into starts[:m], sorted and unique; returns m. A segment
    starts at 0, at each document start inside (0, seq_len), and where padding begins."""
    k = 1
    starts[0] = 0
    ordered = True  # strictly increasing so far: then there is nothing to sort or dedupe
    for j in range(d0, d0 + count):
        d = doc_flat[j]
        if 0 < d < seq_len:
            ordered &= d > starts[k - 1]
            starts[k] = d
            k += 1
    if n < seq_len:
        ordered &= n > starts[k - 1]
        starts[k] = n
        k += 1
    if ordered:  # the usual row: document starts are stored in order, padding comes last
        return k
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
    return m


@numba.njit(cache=True, nogil=True, inline="always")
def _row_bounds(
    i, n, doc_flat, d0, count, seq_len, label_shift, mask_cross, starts, cu_seqlens, num_segments, label_end
):  # pragma: no cover - compiled
    """Row i of batch.bounds; returns its segment count."""
    m = _row_starts(n, doc_flat, d0, count, seq_len, starts)
    num_segments[i] = m
    cu = cu_seqlens[i]
    cu[0] = 0
    w = cu.shape[0]
    inner = min(m, w)
    # Slice assignments, not `for s in range(...): cu[s] = ...`: a loop's signed index is
    # checked for wraparound at every store and does not vectorize (~50 ns a row for the
    # padding of 64 segments against ~8 for the slice: ~5% of a compact batch at 32 x 2048).
    cu[1:inner] = starts[1:inner]
    cu[max(inner, 1) :] = seq_len
    ok = max(min(n, seq_len + label_shift) - 1, 0)  # labels valid while p + 1 < n_tokens
    if mask_cross and label_shift == 1 and ok == seq_len:
        for j in range(d0, d0 + count):
            if doc_flat[j] == seq_len:  # the last label starts a document: see batch.label_end
                ok = seq_len - 1
    label_end[i] = ok
    return m


@numba.njit(cache=True, nogil=True)
def _bounds(
    n_tokens, doc_counts, doc_flat, seq_len, label_shift, mask_cross, cu_seqlens, num_segments, label_end
):  # pragma: no cover - compiled
    """batch.bounds (cu_seqlens, num_segments, label_end: a few int32 a row, nothing per
    token); returns the largest segment count, as _segments."""
    starts = np.empty(doc_flat.shape[0] + 2, np.int64)
    most, d0 = 0, 0
    for i in range(n_tokens.shape[0]):
        m = _row_bounds(
            i,
            n_tokens[i],
            doc_flat,
            d0,
            doc_counts[i],
            seq_len,
            label_shift,
            mask_cross,
            starts,
            cu_seqlens,
            num_segments,
            label_end,
        )
        most = max(most, m)
        d0 += doc_counts[i]
    return most


_AHEAD = 16  # rows: how far ahead _block_bounds prefetches metadata


@numba.njit(cache=True, nogil=True)
def _block_bounds(
    shard, row, slot_of, meta_addr, seq_len, label_shift, mask_cross, cu_seqlens, num_segments, label_end
):  # pragma: no cover - compiled
    """ShardTable.meta + _bounds in one call: each row's n_tokens, doc_offsets[r:r+2] and
    document starts are read at their raw addresses (meta_addr per slot: n_tokens int32,
    doc_offsets int64, doc_values int32), as gather.RowView reads tokens: shards pinned,
    under a lease. numpy's meta gathers cost ~1 us a row, about a 4 KiB token row's copy.

    The reads go in two flat loops before any branchy work: rows sit in different shards'
    pages, so most reads miss the cache, and a loop of independent loads keeps many misses in
    flight where one row's full processing at a time would wait for each."""
    b = shard.shape[0]
    n = np.empty(b, np.int64)
    cnt = np.empty(b, np.int64)
    base = np.empty(b, np.int64)
    for i in range(min(b, _AHEAD)):
        sl = slot_of[shard[i]]
        prefetch(meta_addr[sl, 0] + row[i] * 4)
        prefetch(meta_addr[sl, 1] + row[i] * 8)
    for i in range(b):
        if i + _AHEAD < b:
            sl = slot_of[shard[i + _AHEAD]]
            prefetch(meta_addr[sl, 0] + row[i + _AHEAD] * 4)
            prefetch(meta_addr[sl, 1] + row[i + _AHEAD] * 8)
        sl = slot_of[shard[i]]
        r = row[i]
        a = meta_addr[sl, 1] + r * 8
        lo = load_i64(a)
        n[i] = load_i32(meta_addr[sl, 0] + r * 4)
        cnt[i] = load_i64(a + 8) - lo
        base[i] = meta_addr[sl, 2] + lo * 4
    docs = np.empty(cnt.sum(), np.int64)
    k = 0
    for i in range(min(b, _AHEAD)):
        prefetch(base[i])
    for i in range(b):
        if i + _AHEAD < b:
            prefetch(base[i + _AHEAD])
        for j in range(cnt[i]):
            docs[k] = load_i32(base[i] + j * 4)
            k += 1
    return _bounds(n, cnt, docs, seq_len, label_shift, mask_cross, cu_seqlens, num_segments, label_end)


@numba.njit(cache=True, nogil=True)
def _segments(
    n_tokens, doc_counts, doc_flat, seq_len, label_shift, mask_cross, position_ids, cu_seqlens, num_segments, loss_mask
):  # pragma: no cover - compiled
    """Same definitions as batch.assemble (see there); returns the largest segment
    count so the caller can raise when it exceeds max_segments."""
    b = n_tokens.shape[0]
    width = cu_seqlens.shape[1]
    starts = np.empty(doc_flat.shape[0] + 2, np.int64)
    most, d0 = 0, 0
    for i in range(b):
        n = n_tokens[i]
        m = _row_starts(n, doc_flat, d0, doc_counts[i], seq_len, starts)
        most = max(most, m)
        num_segments[i] = m
        pos, cu = position_ids[i], cu_seqlens[i]
        for s in range(m):
            # Unsigned: with a signed index every store is checked for wraparound and the loop
            # does not vectorize (1,390 -> 260 ns a row at seq_len 2048; see _row_bounds).
            # Starts are sorted, unique and in [0, seq_len) (shards are validated at open); the
            # clamp keeps a negative start from ever turning into a write before the array.
            lo = numba.uint64(max(starts[s], 0))
            hi = numba.uint64(starts[s + 1] if s + 1 < m else seq_len)
            for p in range(hi - lo):
                pos[lo + p] = p
            if s + 1 < width:
                cu[s + 1] = hi
        cu[0] = 0
        cu[m + 1 :] = seq_len
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
def _locate(
    index,
    blend_src,
    blend_ord,
    shares,
    period,
    n_rows,
    base_key,
    half,
    cum,
    cum_off,
    ids,
    ids_off,
    shift,
    first,
    first_off,
    shard_out,
    row_out,
):  # pragma: no cover
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
        shard_out[i] = s  # the source and row for now: the shard is found below
        row_out[i] = row
    # The shard search in a loop of its own: its branches mispredict (rows are random), and
    # each misprediction in the loop above also threw away the permutation work the core
    # had run ahead on for the next samples (~13% of this kernel).
    for i in range(index.shape[0]):
        s, row = shard_out[i], row_out[i]
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
def _addresses(
    shard, row, slot_of, chunk_off, chunk_rows, chunk_addr, row_bytes, itemsize, last_used, tick, elem_out
):  # pragma: no cover - compiled
    """ShardTable.token_addresses + RowView's offsets: returns (missing, lowest address);
    elem_out[i] = (address of row i - lowest) // itemsize. When shards are missing
    (not open), returns their count and leaves elem_out undefined.

    No 64-bit division per row where it can be helped (~40 cycles each, two a row were half
    of this kernel's cost): a row of a shard's first chunk (every row of a one-chunk shard)
    skips the divmod, and a power-of-two itemsize (uint16, uint32 tokens) is a shift."""
    missing = 0
    low = np.int64(0x7FFFFFFFFFFFFFFF)
    for i in range(shard.shape[0]):
        sl = slot_of[shard[i]]
        if sl < 0:
            missing += 1
            continue
        last_used[sl] = tick
        r, per_chunk = row[i], chunk_rows[sl]
        if r < per_chunk:
            a = chunk_addr[chunk_off[sl]] + r * row_bytes
        else:
            c, w = divmod(r, per_chunk)
            a = chunk_addr[chunk_off[sl] + c] + w * row_bytes
        elem_out[i] = a
        low = min(low, a)
    if missing:
        return missing, np.int64(0)
    shift = 0
    while (1 << shift) < itemsize:
        shift += 1
    if (1 << shift) == itemsize:
        for i in range(shard.shape[0]):
            elem_out[i] = (elem_out[i] - low) >> shift
    else:
        for i in range(shard.shape[0]):
            elem_out[i] = (elem_out[i] - low) // itemsize
    return 0, low


@intrinsic
def load_i32(typingctx, addr):  # the int32 at a raw address
    sig = types.int32(types.intp)

    def codegen(context, builder, signature, args):  # pragma: no cover - runs at compile time
        return builder.load(builder.inttoptr(args[0], ir.IntType(32).as_pointer()))

    return sig, codegen


@intrinsic
def load_i64(typingctx, addr):  # the int64 at a raw address
    sig = types.int64(types.intp)

    def codegen(context, builder, signature, args):  # pragma: no cover - runs at compile time
        return builder.load(builder.inttoptr(args[0], ir.IntType(64).as_pointer()))

    return sig, codegen


@intrinsic
def memcpy(typingctx, dst, src, nbytes):  # llvm.memcpy between raw addresses
    sig = types.void(types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):  # pragma: no cover - runs at compile time
        d, s, n = args
        bytep = ir.IntType(8).as_pointer()
        cgutils.raw_memcpy(builder, builder.inttoptr(d, bytep), builder.inttoptr(s, bytep), n, 1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch(typingctx, addr):  # llvm.prefetch (read, keep in all cache levels) of a raw address
    sig = types.void(types.intp)

    def codegen(context, builder, signature, args):  # pragma: no cover - runs at compile time
        bytep, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [bytep, i32, i32, i32]), "llvm.prefetch.p0i8"
        )
        builder.call(fn, [builder.inttoptr(args[0], bytep), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def _gather_rows(low, elem, itemsize, out):  # pragma: no cover - compiled
    """out[i] = the out.shape[1] elements at low + elem[i] * itemsize (out C-contiguous).

    Each row's cache lines are prefetched while the previous row is copied: rows start at
    random places in memory, where the hardware prefetcher starts over (and again at each
    page boundary a row crosses), and one row's copy (4 KiB at seq_len 2048) is long enough
    to hide the next row's latency. Prefetches never fault, so the one line past a row's
    end is harmless. Measured in isolation (bench/perf/loader.py's rows, 1,000 shards): ~10-25%
    faster than the same memcpy loop without them, and than numpy's fancy index."""
    row_bytes = out.shape[1] * itemsize
    dst = out.ctypes.data
    b = elem.shape[0]
    if b:
        src = low + elem[0] * itemsize
        for o in range(0, row_bytes, 64):
            prefetch(src + o)
    for i in range(b):
        if i + 1 < b:
            nxt = low + elem[i + 1] * itemsize
            for o in range(0, row_bytes + 63, 64):  # + 63: an unaligned row ends in one more line
                prefetch(nxt + o)
        memcpy(dst + i * row_bytes, low + elem[i] * itemsize, row_bytes)
